"""What a load test checks once every run ended: each run finished (or stopped at its cap), each job's ledger
is its attempts' billed seconds x price to the cent, and no metric, checkpoint or log line of one job names
another. Each check returns a list of problems (empty: it held), each naming the run and what was seen."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from airflow_dtrain.job.naming import default_checkpoint_uri
from airflow_dtrain.trust.ownership import job_dir, run_key
from trainer.checkpoint.directory import CheckpointDir
from trainer.money.bill import dollars_at
from trainer.base.statsd import UNKNOWN, parse_line

from .runs import Run


def checkpoint_dir(home: Path, run: Run) -> str:
    """Where the run's checkpoints and ledger are: the job's directory, or the sweep's (all members')."""
    # the bundled DAGs' default directories carry the run's owner (airflow_dtrain.trust.ownership.job_dir)
    root = default_checkpoint_uri(home / "dtrain", run.dag_id)
    job = run_key(run.run_id) if run.dag_id == "sweep_llama" else run.job
    return job_dir(root, job, run, SimpleNamespace(dag_id=run.dag_id))


def ended_well(runs: list[Run]) -> list[str]:
    """Every run succeeded, each train task at its last step or stopped at its cap."""
    problems = []
    for run in runs:
        if run.state != "success":
            problems.append(f"{run.run_id}: ended {run.state or 'never'}")
            continue
        want = int(run.conf["steps"])
        members = len(run.conf.get("learning_rates") or [None])
        if len(run.summaries) != members:
            problems.append(f"{run.run_id}: {len(run.summaries)} train summaries, expected {members}")
        for s in run.summaries:
            if s.get("final_step") != want and not s.get("budget_stop"):
                problems.append(f"{run.run_id}: a train task ended at step {s.get('final_step')} of {want}")
    return problems


def ledger_problems(home: Path, runs: list[Run]) -> tuple[list[str], dict[str, tuple[float, float]]]:
    """Each job's ledger (``CheckpointDir.ledger``) against the sum of its attempts' spend files, each
    billed again here as billed seconds x nodes x price: equal to the cent. Also {run_id: (dollars, group
    seconds billed)}."""
    problems, dollars = [], {}
    for run in runs:
        root = CheckpointDir(checkpoint_dir(home, run))
        try:
            spend, ledger = root.spend(), root.ledger()
        except (OSError, ValueError) as err:
            problems.append(f"{run.run_id}: cannot read the ledger of {root.root}: {err}")
            continue
        expected = 0.0
        for attempt, e in spend.attempts.items():
            start = float(e["launched_at"])
            expected += dollars_at(start, start + float(e["billed_s"]), int(e["nodes"]),
                                   float(e["price_per_node_hour"]), e.get("node_changes"))  # fmt: skip
        seconds = sum(float(e["billed_s"]) for e in spend.attempts.values())
        dollars[run.run_id] = (ledger.total_dollars, seconds)
        if not spend.attempts:
            problems.append(f"{run.run_id}: no spend file in {root.root}")
        elif abs(round(ledger.total_dollars, 2) - round(expected, 2)) > 0.0:
            problems.append(
                f"{run.run_id}: ledger ${ledger.total_dollars:.4f} != billed seconds x price "
                f"${expected:.4f} over {len(spend.attempts)} attempts"
            )
    return problems, dollars


def metric_problems(lines: list[str], runs: list[Run]) -> list[str]:
    """Every datagram tagged with one of our runs names that run's job (train_llama: the job of its conf;
    a sweep's member: one job per member, none shared with another run). A datagram whose sender knows no
    job (``trainer.base.statsd.UNKNOWN``: a sweep's budget task, its members without a ``job``) names
    none."""
    ours = {r.run_id: r for r in runs}
    jobs: dict[tuple[str, str], set[str]] = {}
    for line in lines:
        try:
            _, _, _, tags = parse_line(line)
        except (ValueError, IndexError):
            continue
        run = ours.get(tags.get("run_id", ""))
        if run is None or tags.get("job", UNKNOWN) == UNKNOWN:
            continue
        jobs.setdefault((run.run_id, tags.get("map_index", "-1")), set()).add(tags["job"])
    problems = [f"{key}: datagrams of jobs {sorted(j)}" for key, j in jobs.items() if len(j) != 1]
    for (run_id, _), j in jobs.items():
        run = ours[run_id]
        if run.dag_id == "train_llama" and j != {run.job}:
            problems.append(f"{run_id}: datagrams tagged job {sorted(j)}, its job is {run.job}")
    owners: dict[str, set[str]] = {}
    for (run_id, _), j in jobs.items():
        for job in j:
            owners.setdefault(job, set()).add(run_id)
    problems += [f"job {job}: datagrams under runs {sorted(r)}" for job, r in owners.items() if len(r) > 1]
    if not jobs:
        problems.append("no datagram carried one of the runs' tags")
    return problems


def checkpoint_problems(home: Path, runs: list[Run]) -> list[str]:
    """Every committed checkpoint of a train_llama job's directory is that job's; every member directory
    of a sweep holds one job's checkpoints (or none's), a named job no other directory holds."""
    problems, holders = [], {}
    for run in runs:
        root = Path(checkpoint_dir(home, run))
        dirs = sorted(p for p in root.glob("lr-*") if p.is_dir()) if run.dag_id == "sweep_llama" else [root]
        for d in dirs:
            ckpt = CheckpointDir(str(d))
            found = {ckpt.job_of(c.path) for c in ckpt.committed()}
            if not found:
                problems.append(f"{run.run_id}: no committed checkpoint in {d}")
            if run.dag_id == "train_llama" and found - {run.job}:
                problems.append(f"{run.run_id}: {d} holds checkpoints of jobs {sorted(found - {run.job})}")
            if len(found) > 1:
                problems.append(f"{run.run_id}: {d} holds checkpoints of {sorted(found)}")
            for job in found:
                holders.setdefault(job, set()).add(str(d))
    # a job of "" (a sweep's member: no job of its own) is no one's: its directory is its identity
    problems += [f"job {job}: checkpoints in {sorted(d)}" for job, d in holders.items() if job and len(d) > 1]
    return problems


def _texts(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".log", ".jsonl", ".json", ".txt")]


def log_problems(home: Path, groups: Path, runs: list[Run]) -> list[str]:
    """No log or events line of one run's groups or task logs names another run's checkpoint directory
    (every line of a train task and of its group names its job's directory, or none)."""
    own = {r.run_id: checkpoint_dir(home, r) for r in runs}
    pattern = re.compile(
        "|".join(re.escape(d) + r"(?![\w.-])" for d in sorted(own.values(), key=len, reverse=True))
    )
    problems = []
    sources: dict[str, list[Path]] = {r.run_id: [] for r in runs}
    for run in runs:
        sources[run.run_id] += _texts(home / "logs" / f"dag_id={run.dag_id}" / f"run_id={run.run_id}")
    # a group's name never starts with a dot: those are the launcher's own (its jobs' .compile-cache)
    for group in (p for p in groups.iterdir() if p.is_dir() and p.name[0] != ".") if groups.is_dir() else []:
        spec = (group / "group.json").read_text(errors="replace") if (group / "group.json").exists() else ""
        named = {run_id for run_id, d in own.items() if re.search(re.escape(d) + r"(?![\w.-])", spec)}
        if len(named) != 1:
            problems.append(f"group {group.name}: its group.json names the directories of {sorted(named)}")
            continue
        sources[named.pop()] += _texts(group)
    for run_id, paths in sources.items():
        for path in paths:
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                others = {m for m in pattern.findall(line) if m != own[run_id]}
                if others:
                    problems.append(f"{run_id}: {path}:{n} names {sorted(others)}")
    return problems
