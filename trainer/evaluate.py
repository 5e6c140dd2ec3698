"""``python -m trainer.evaluate --checkpoint-uri DIR [--step S] [--batches N] [--batch-size B]``

Held-out loss of a committed checkpoint (the latest unless --step), in one plain
process. Prints one JSON line per evaluated checkpoint: {"step", "loss", "perplexity",
"tokens", "tokens_per_s", "path", "flavor", "key", "job"}. ``--all`` evaluates every
committed checkpoint (the eval curve), ``--out`` writes the results as JSON, ``--report`` a
PNG of the train and held-out loss curves. With both ``--all`` and ``--out``, a checkpoint
that the results already at ``--out`` hold, evaluated as it is committed now and with the
same batches (its ``key``), is not evaluated again, and the curve keeps the points of the
job's checkpoints that retention has deleted since. ``--export-to ROOT`` also exports the
evaluated checkpoint (``trainer.export``) to ``ROOT/step-…`` in the same process, if its
loss is below ``--export-if-below`` (when given): a promotion then needs no second job.
"""

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from trainer.checkpoint import storage_reader
from trainer.checkpoint_dir import CheckpointDir, step_dir_name
from trainer.config import TrainConfig
from trainer.data import default_data_dir, ensure_builtin, eval_batches
from trainer.export import export_weights
from trainer.token_store import cache_remote, is_remote
from trainer.model import Llama, ModelArgs
from trainer.safe_pickle import UnsafeCheckpoint
from trainer.storage import Storage


def load_model(step_dir: str, device: torch.device) -> tuple[Llama, dict]:
    """An unsharded model with the weights of a committed checkpoint (any world size), local or s3://."""
    root, step_dir = CheckpointDir.split(step_dir)
    if step_dir is None:
        raise ValueError("load_model: expected a step directory, got a checkpoint root")
    manifest = root.manifest(step_dir)
    cfg = TrainConfig.from_dict(manifest["config"])
    with torch.device("meta"):
        model = Llama(ModelArgs.from_manifest(manifest))
    model.to_empty(device=device)
    model.init_weights(cfg.seed)  # fills the rotary tables; the weights are overwritten below
    state = {"model": model.state_dict()}
    # DCP reads the sharded save into these full tensors; no process group needed.
    reader = storage_reader(root.storage, step_dir)
    # A forged .metadata is refused here, as itself (UnsafeCheckpoint): inside dcp.load, DCP would log the
    # refusal and go on to look for per-rank metadata before failing with an error of its own.
    reader.read_metadata()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, no_dist=True)
    model.load_state_dict(state["model"])
    return model.eval(), manifest


@torch.no_grad()
def evaluate(model: Llama, data_dir: str, seq_len: int, batches: int, batch_size: int, device) -> dict:
    total_loss, tokens = 0.0, 0
    for inputs, targets in eval_batches(data_dir, seq_len, batch_size, batches, device):  # (batch, seq_len)
        logits = model(inputs)
        total_loss += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum").item()
        tokens += targets.numel()
    loss = total_loss / tokens
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": tokens}


def local_dataset(dataset: str) -> str:
    """The local directory of a checkpoint's dataset: the built-in corpus (built here if need be), an
    ``s3://`` store copied once to the node-local cache, or the directory itself."""
    if dataset == "builtin":
        return ensure_builtin(default_data_dir())
    if is_remote(dataset):
        return cache_remote(dataset, default_data_dir(), log=lambda m: print(m, file=sys.stderr, flush=True))
    return dataset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-uri", required=True)
    p.add_argument("--step", type=int, help="a committed step (default: the latest)")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--all", action="store_true", help="also evaluate every other committed checkpoint (the eval curve)"
    )
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--report", help="write a PNG of the train and eval loss curves to this file")
    p.add_argument(
        "--export-to",
        metavar="ROOT",
        help="export the evaluated checkpoint as a Hugging Face model into its step directory under ROOT",
    )
    p.add_argument(
        "--export-if-below",
        type=float,
        metavar="LOSS",
        help="with --export-to: only if its held-out loss is below LOSS",
    )
    args = p.parse_args(argv)
    try:
        root = CheckpointDir(args.checkpoint_uri)
    except ValueError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    found = dict(root.committed())
    step = args.step if args.step is not None else max(found, default=None)
    if step not in found:
        print(
            f"no committed checkpoint {step_dir_name(step) if step else ''} under {root.root}",
            file=sys.stderr,
        )
        return 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # --all with --out: the checkpoints that an earlier evaluation of this directory evaluated as they are now
    # committed, with the same batches, are not evaluated again; those retention has deleted since stay on the curve
    earlier = _earlier_results(args.out, args.batches, args.batch_size) if args.all and args.out else {}
    results, reused = [], []
    # `step` last: an export writes the weights still in memory rather than reading the checkpoint again
    for s in [*sorted(set(found) - {step}), step] if args.all else [step]:
        if s != step and s in earlier:
            key = _evaluation_key(root.manifest(found[s]), args.batches, args.batch_size)
            if earlier[s].get("key") == key:
                results.append({**earlier.pop(s), "path": found[s]})
                reused.append(s)
                continue
        start = time.perf_counter()
        try:
            model, manifest = load_model(found[s], device)
        except UnsafeCheckpoint as err:  # a forged checkpoint: refused, nothing in it ran
            print(f"refused: {err}", file=sys.stderr, flush=True)
            if s == step:
                return 1
            continue  # another point of the curve: left out, the checkpoint asked for is still evaluated
        cfg = TrainConfig.from_dict(manifest["config"])
        data_dir = local_dataset(cfg.data.dataset)
        result = evaluate(model, data_dir, cfg.data.seq_len, args.batches, args.batch_size, device)
        seconds = time.perf_counter() - start
        result = {"step": s, **result, "tokens_per_s": result["tokens"] / seconds, "path": found[s],
                  "flavor": cfg.model.flavor, "key": _evaluation_key(manifest, args.batches, args.batch_size),
                  "job": manifest.get("job", "")}  # fmt: skip
        print(json.dumps(result), flush=True)
        results.append(result)
    if reused:
        print(
            f"[trainer.evaluate] reused the held-out loss of step(s) {reused}, evaluated by an earlier "
            f"run as they are committed now, with the same batches",
            file=sys.stderr,
            flush=True,
        )
    job = results[-1]["job"]
    # deleted by retention since, evaluated by this job: still points of its curve
    results += [r for s, r in earlier.items() if s < min(found) and r.get("job") == job]
    results.sort(key=lambda r: r["step"])
    latest = next(r for r in results if r["step"] == step)
    exported = None
    if args.export_to and (args.export_if_below is None or latest["loss"] < args.export_if_below):
        weights = {name: tensor.cpu() for name, tensor in model.state_dict().items()}  # `step`'s, as saved
        exported = export_weights(
            weights, manifest, found[step], Storage(args.export_to).path(step_dir_name(step))
        )
        print(json.dumps({"event": "export", **exported}), flush=True)
    train_curve = _train_curve(root)
    if args.report:
        run = RunRecord.read(root, cfg)
        evals = [(r["step"], r["loss"]) for r in results]
        _put(args.report, lambda local: _plot(local, run, evals, latest))
        html = os.path.splitext(args.report)[0] + ".html"
        _put(html, lambda local: _html(local, run, evals, latest, os.path.basename(args.report)))
    if args.out:
        payload = {**latest, "eval_curve": [[r["step"], r["loss"]] for r in results], "train_curve": train_curve,
                   "report": args.report, "export": exported, "batches": args.batches, "batch_size": args.batch_size,
                   "evaluated": results}  # fmt: skip

        def dump(local: str) -> None:
            with open(local, "w") as f:
                json.dump(payload, f, indent=1)

        _put(args.out, dump)
    return 0


def _evaluation_key(manifest: dict, batches: int, batch_size: int) -> str:
    """What a held-out loss depends on: the checkpoint as it was committed (its job, its writer's lease, its commit
    time and its config, the dataset's among it) and the batches evaluated."""
    what = [manifest.get("job"), manifest.get("lease"), manifest.get("created_at"), manifest.get("config_hash"),
            manifest.get("tokenizer"), batches, batch_size]  # fmt: skip
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _earlier_results(out: str, batches: int, batch_size: int) -> dict[int, dict]:
    """{step: result} of the evaluation whose results are at ``out`` (local or s3://), if it evaluated the same
    number of batches of the same size; {} when there is none or it cannot be read."""
    try:
        storage = Storage(out)
        earlier = storage.read_json(storage.root)
    except (OSError, ValueError):
        return {}
    if not isinstance(earlier, dict) or (earlier.get("batches"), earlier.get("batch_size")) != (
        batches,
        batch_size,
    ):
        return {}
    return {int(r["step"]): r for r in earlier.get("evaluated") or [] if isinstance(r, dict) and "step" in r}


def _train_curve(root: CheckpointDir) -> list[list[float]]:
    """[[step, loss], ...] of the training run, from progress.json's history (empty if none)."""
    try:
        return [list(point[:2]) for point in root.progress().get("history", [])]
    except (OSError, ValueError, KeyError):
        return []


@dataclasses.dataclass
class RunRecord:
    """What the report shows of a training run besides the evaluations: its curves (progress.json's
    history), its events (checkpoints, preemptions, relaunches) and its spend (the ledger)."""

    history: list[list]
    events: list[dict]
    spend: list[tuple[float, float, float]]  # (launched_at, billed_s, dollars) of each attempt, by launch
    budget_usd: float
    tokens_per_step: int
    progress: dict

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
        spend = sorted((float(e.get("launched_at") or 0), float(e.get("billed_s") or 0), float(e.get("dollars") or 0))
                       for e in attempts.values())  # fmt: skip
        return cls(history=[list(p) for p in progress.get("history", [])], events=list(progress.get("events") or []),
                   spend=spend, budget_usd=float(cfg.cost.budget_usd or 0),
                   tokens_per_step=cfg.global_batch_size * cfg.data.seq_len, progress=progress)  # fmt: skip

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


def _plot(path: str, run: RunRecord, evals: list, latest: dict) -> None:
    """report.png: loss (train and held-out) vs step and tokens with the run's events, the learning rate,
    tokens/s, and the spend against the budget."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), dpi=100)
    (loss_ax, lr_ax), (speed_ax, spend_ax) = axes
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
        for ax in (loss_ax, lr_ax, speed_ax):
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

    def panel(ax, points, color: str, ylabel: str, title: str) -> None:
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], color=color)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)

    lrs = [(p[0], p[2]) for p in train if len(p) >= 3 and p[2] is not None]
    panel(lr_ax, lrs, "tab:brown", "learning rate", "learning-rate schedule")
    panel(speed_ax, run.tokens_per_s(), "tab:cyan", "tokens/s (whole group)", "throughput")

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
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _html(path: str, run: RunRecord, evals: list, latest: dict, image: str) -> None:
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
<body><h1>Training report</h1><img src="{html.escape(image)}" alt="loss, learning rate, throughput and spend" width="100%">
<h2>Summary</h2><table>{body}</table>
<h2>Held-out loss by checkpoint</h2><table><tr><th>step</th><th>loss</th></tr>{evaluated}</table>
</body></html>
""")


def _put(path: str, write) -> None:
    """Write a result file through a local temporary file: to a path, or to s3:// with fsspec."""
    import fsspec

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, os.path.basename(path))
        write(local)
        fs, target = fsspec.core.url_to_fs(path, skip_instance_cache=True)
        fs.makedirs(fs._parent(target), exist_ok=True)
        fs.put_file(local, target + ".tmp")
        fs.mv(target + ".tmp", target)  # readers never see half a file (a rename locally)


if __name__ == "__main__":
    sys.exit(main())
