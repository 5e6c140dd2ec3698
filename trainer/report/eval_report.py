"""The training report trainer.evaluate writes (--report): report.png (loss, learning rate, throughput and
spend, with the run's events; an elastic group's node count over time, each resize marked with its cost)
and report.html beside it; and writing a result file, locally or to s3://."""

import dataclasses
import math
import os
import tempfile

from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import TrainConfig
from trainer.money.bill import resizes


@dataclasses.dataclass
class RunRecord:
    """What the report shows of a training run besides the evaluations: its curves (progress.json's
    history), its events (checkpoints, preemptions, relaunches) and its spend (the ledger)."""

    history: list[list]
    events: list[dict]
    spend: list[tuple[float, float, float]]  # (launched_at, billed_s, dollars) of each attempt, by launch
    budget_usd: float | None
    tokens_per_step: int
    progress: dict
    nodes: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    """An elastic group's sizes, ``(at, nodes)`` of every attempt that recorded ``node_changes``, by time."""
    resizes: list[dict] = dataclasses.field(default_factory=list)
    """Each resize, ``trainer.money.bill.resizes``: when, to how many nodes, the dollars of the interval it
    ends."""

    @classmethod
    def read(cls, root: CheckpointDir, cfg: TrainConfig) -> "RunRecord":
        try:
            progress = root.progress() or {}
        except (OSError, ValueError):
            progress = {}
        attempts: dict = {}
        try:
            ledger = CheckpointDir(cfg.cost.ledger_uri) if cfg.cost.ledger_uri else root
            attempts = ledger.spend().attempts
        except (OSError, ValueError):
            pass
        spend = sorted(
            (float(e.get("launched_at") or 0), float(e.get("billed_s") or 0), float(e.get("dollars") or 0))
            for e in attempts.values()
        )
        elastic = [e for e in attempts.values() if e.get("node_changes") and e.get("launched_at")]
        return cls(
            history=[list(p) for p in progress.get("history", [])],
            events=list(progress.get("events") or []),
            spend=spend,
            budget_usd=cfg.cost.budget_usd,
            tokens_per_step=cfg.global_batch_size * cfg.data.seq_len,
            progress=progress,
            nodes=sorted((float(t), int(n)) for e in elastic for t, n in e["node_changes"]),
            resizes=sorted((r for e in elastic for r in resizes(e)), key=lambda r: r["at"]),
        )

    def tokens_per_s(self) -> list[tuple[int, float]]:
        """(step, tokens/s of the whole group over the log interval ending there), at the logged steps."""
        return [(p[0], p[4]) for p in self.history if len(p) >= 5 and p[4]]

    def spend_curve(self) -> list[tuple[float, float]]:
        """(minutes since the first launch, cumulative dollars): each attempt bills linearly while it runs."""
        if not self.spend:
            return []
        start, total, points = self.spend[0][0], 0.0, []
        for launched, billed, dollars in self.spend:
            points.append(((launched - start) / 60, total))
            total += dollars
            points.append(((launched + billed - start) / 60, total))
        return points


_MARKERS = {
    "preempted": ("tab:red", "--", "preemption"),
    "relaunch": ("tab:green", ":", "relaunch"),
    "stopped_at_budget": ("black", "-", "stopped at the budget"),
    "failed": ("tab:purple", "--", "failure"),
}


def _loss_panel(loss_ax, run: "RunRecord", evals: list, latest: dict, axes: tuple) -> None:
    """Train and held-out loss vs step (tokens on top), checkpoints and the run's events marked on `axes`."""
    train = run.history
    if train:
        loss_ax.plot([p[0] for p in train], [p[1] for p in train], label="train loss", color="tab:blue", lw=1)
    if evals:
        loss_ax.plot(
            [p[0] for p in evals], [p[1] for p in evals], "o-", label="held-out loss", color="tab:orange"
        )
    ckpts = sorted({e["step"] for e in run.events if e.get("kind") == "checkpoint"})
    for step in ckpts:
        loss_ax.axvline(step, color="0.6", lw=0.6, alpha=0.6)
    seen: set[str] = set()
    for event in run.events:
        style = _MARKERS.get(event.get("kind"))
        if style is None:
            continue
        color, line, label = style
        for ax in axes:
            ax.axvline(event["step"], color=color, ls=line, lw=1.4,
                       label=label if ax is loss_ax and label not in seen else None)  # fmt: skip
        seen.add(label)
    if ckpts:
        loss_ax.plot([], [], color="0.6", lw=0.6, label="checkpoints")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss (nats/token)")
    tokens_per_step = max(run.tokens_per_step, 1)
    top = loss_ax.secondary_xaxis("top", functions=(lambda s: s * tokens_per_step / 1e6,
                                                    lambda t: t * 1e6 / tokens_per_step))  # fmt: skip
    top.set_xlabel("tokens (millions)")
    loss_ax.set_title(
        f"{latest['flavor']}: held-out loss {latest['loss']:.3f} at step {latest['step']}", fontsize=10
    )
    loss_ax.legend(fontsize=8)


def _panel(ax, points, color: str, ylabel: str, title: str) -> None:
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], color=color)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)


def _spend_panel(spend_ax, run: "RunRecord") -> None:
    """Cumulative spend vs minutes since the first launch, relaunches marked, against the budget."""
    curve = run.spend_curve()
    total = curve[-1][1] if curve else 0.0
    if curve:
        spend_ax.plot([p[0] for p in curve], [p[1] for p in curve], color="tab:green", label="spent")
        for launched, _, _ in run.spend[1:]:
            spend_ax.axvline((launched - run.spend[0][0]) / 60, color="tab:green", ls=":", lw=1,
                             label="relaunch" if launched == run.spend[1][0] else None)  # fmt: skip
    title = f"spend \\${total:,.4f}"
    if run.budget_usd:
        title += f" of the \\${run.budget_usd:,.2f} budget ({100 * total / run.budget_usd:.1f} %)"
        if total >= 0.2 * run.budget_usd or not curve:  # else the budget line would flatten the curve
            spend_ax.axhline(run.budget_usd, color="tab:red", label="budget")
    spend_ax.set_xlabel("minutes since the first launch")
    spend_ax.set_ylabel("US$ (cumulative)")
    spend_ax.set_title(title, fontsize=10)
    if curve or run.budget_usd:
        spend_ax.legend(fontsize=8)


def _nodes_axis(spend_ax, run: "RunRecord") -> list:
    """An elastic group's node count over the spend panel's minutes (right axis), each resize a marker
    labelled with the dollars of the interval it ends; the markers' labels (none: no resize recorded)."""
    if not run.nodes or not run.resizes:
        return []
    start = run.spend[0][0] if run.spend else run.nodes[0][0]
    ax = spend_ax.twinx()
    ax.step([(t - start) / 60 for t, _ in run.nodes], [n for _, n in run.nodes], where="post",
            color="tab:purple", lw=1, label="nodes")  # fmt: skip
    labels = []
    for r in run.resizes:
        x = (r["at"] - start) / 60
        ax.plot([x], [r["nodes"]], marker="v" if r["nodes"] < r["nodes_before"] else "^", color="tab:purple")
        labels.append(
            ax.annotate(
                f"{r['nodes_before']}→{r['nodes']} nodes, \\${r['usd']:,.4f}",
                (x, r["nodes"]),
                textcoords="offset points",
                xytext=(3, 4),
                fontsize=7,
                color="tab:purple",
            )
        )
    ax.set_ylabel("nodes (elastic group)")
    ax.set_ylim(0, max(n for _, n in run.nodes) + 1)
    ax.yaxis.get_major_locator().set_params(integer=True)
    return labels


def plot(path: str, run: RunRecord, evals: list, latest: dict) -> None:
    """report.png: loss (train and held-out) vs step and tokens with the run's events, the learning rate,
    tokens/s, and the spend against the budget."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), dpi=100)
    (loss_ax, lr_ax), (speed_ax, spend_ax) = axes
    _loss_panel(loss_ax, run, evals, latest, (loss_ax, lr_ax, speed_ax))
    lrs = [(p[0], p[2]) for p in run.history if len(p) >= 3 and p[2] is not None]
    _panel(lr_ax, lrs, "tab:brown", "learning rate", "learning-rate schedule")
    _panel(speed_ax, run.tokens_per_s(), "tab:cyan", "tokens/s (whole group)", "throughput")
    _spend_panel(spend_ax, run)
    _nodes_axis(spend_ax, run)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def html_report(path: str, run: RunRecord, evals: list, latest: dict, image: str) -> None:
    """report.html beside report.png: the image and the run's summary table."""
    import html

    progress = run.progress
    kinds = [e.get("kind") for e in run.events]
    spent = run.spend_curve()[-1][1] if run.spend else 0.0
    rows = [
        ("model", latest.get("flavor")),
        ("step", f"{progress.get('step', latest['step'])} of {progress.get('steps', '?')}"),
        ("tokens seen", f"{progress.get('tokens_seen', 0):,}"),
        ("train loss (last)", progress.get("loss")),
        (
            "held-out loss",
            f"{latest['loss']:.4f} at step {latest['step']} (perplexity {math.exp(latest['loss']):.2f})",
        ),
        ("status", progress.get("status")),
        ("attempts", progress.get("attempt")),
        ("preemptions", kinds.count("preempted")),
        ("steps lost", progress.get("steps_lost")),
        ("checkpoints committed", kinds.count("checkpoint")),
        ("latest checkpoint", progress.get("latest_checkpoint")),
        ("spent", f"${spent:,.4f}" + (f" of ${run.budget_usd:,.2f}" if run.budget_usd else "")),
        ("training wall time", f"{float(progress.get('wall_time_s') or 0):,.0f} s"),
    ]
    if progress.get("checkpoint_cost_s") is not None:
        took, wall = float(progress["checkpoint_cost_s"]), float(progress.get("wall_time_s") or 0)
        share = f" ({100 * took / wall:.1f} % of it)" if wall > 0 else ""
        rows.append(("time the saves took from training", f"{took:,.1f} s{share}"))
    body = "\n".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    evaluated = "".join(f"<tr><td>{s}</td><td>{loss:.4f}</td></tr>" for s, loss in evals)
    with open(path, "w") as f:
        f.write(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Training report: step {latest["step"]}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:4px 10px;text-align:left}}th{{background:#f4f4f4}}</style></head>
<body><h1>Training report</h1>
<img src="{html.escape(image)}" alt="loss, learning rate, throughput and spend" width="100%">
<h2>Summary</h2><table>{body}</table>
<h2>Held-out loss by checkpoint</h2><table><tr><th>step</th><th>loss</th></tr>{evaluated}</table>
</body></html>
""")


def put(path: str, write) -> None:
    """Write a result file through a local temporary file: to a path, or to s3:// with fsspec."""
    import fsspec

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, os.path.basename(path))
        write(local)
        fs, target = fsspec.core.url_to_fs(path, skip_instance_cache=True)
        fs.makedirs(fs._parent(target), exist_ok=True)
        fs.put_file(local, target + ".tmp")
        fs.mv(target + ".tmp", target)  # readers never see half a file (a rename locally)
