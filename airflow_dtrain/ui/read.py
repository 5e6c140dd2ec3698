"""What the Training jobs pages show of a job, read from its index entry and its directories, never from its
processes: the row of the jobs page (``JobRow``), the job page (``job_detail``) and the cache that keeps the
jobs page from reading every job at every request (``RowCache``).

Only JSON is read (progress.json, summary.json, spend files, manifests, evaluation results, the registry's
best.json), each file's fields checked before use: a missing directory, a torn file or a forged one is a
``problem`` on the row, never an error of the page; nothing in a step directory's data (DCP metadata,
tensors, pickles) is opened. Paths come only from the index entry, and only those under the storage roots
are read.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_dtrain import jobs_index
from airflow_dtrain.trust.roots import within_roots
from trainer.checkpoint.directory import EVAL_RESULTS, PROGRESS, REGISTRY_BEST, SUMMARY, CheckpointDir

LIVE_STATES = ("running", "waiting")
"""A job in these states changes while nothing is written to its entry: its live files are read again."""
LIVE_REFRESH_S = 5.0
"""A live job's progress and spend are read at most this often, whoever asks."""


class Reads:
    """How many files the pages have read in this process (the benchmark and the tests count them)."""

    count = 0


def _json(storage: Any, path: str) -> Any:
    Reads.count += 1
    return storage.read_json(path)


@dataclass
class JobRow:
    """One row of the jobs page."""

    dag_id: str
    entry: str
    owner: str
    job: str
    state: str
    step: int = 0
    steps: int | None = None
    nodes: int | None = None
    min_nodes: int | None = None
    num_nodes: int | None = None
    spent_usd: float = 0.0
    budget_usd: float | None = None
    preemptions: int = 0
    steps_lost: int = 0
    resizes: int = 0
    best: dict[str, float] = field(default_factory=dict)
    """Best held-out loss of this job per evaluation set (the registry's record of each)."""
    checkpoint_step: int | None = None
    checkpoint_at: float | None = None
    updated_at: float | None = None
    problems: list[str] = field(default_factory=list)
    """What could not be read, and why: shown on the row in place of the figures it would have given."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any, kind: type = float) -> Any:
    """``value`` as ``kind`` when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return kind(value)


def _readable(uri: Any, roots: list[str]) -> str | None:
    """``uri`` when it is a string under ``roots`` (the admin's storage roots), else None."""
    return uri if isinstance(uri, str) and uri and within_roots(uri, roots) else None


def _progress(row: JobRow, checkpoints: Any) -> dict[str, Any]:
    """progress.json, its fields checked, into ``row``; the whole file for the job page."""
    path = checkpoints.path(PROGRESS)
    try:
        progress = _json(checkpoints.storage, path) if checkpoints.storage.exists(path) else {}
    except (OSError, ValueError) as err:
        row.problems.append(f"{PROGRESS} cannot be read (half-written or not JSON: {type(err).__name__})")
        return {}
    if not isinstance(progress, dict):
        row.problems.append(f"{PROGRESS} is not a progress file (not an object)")
        return {}
    for name in ("step", "steps", "steps_lost", "checkpoint_step"):
        if progress.get(name) is not None and _number(progress[name], int) is None:
            row.problems.append(f"{PROGRESS}: {name} is {progress[name]!r}, not a number")
            progress.pop(name)
    events = progress.get("events") if isinstance(progress.get("events"), list) else []
    progress["events"] = [e for e in events if isinstance(e, dict) and isinstance(e.get("kind"), str)]
    history = progress.get("history") if isinstance(progress.get("history"), list) else []
    progress["history"] = [
        p for p in history if isinstance(p, list) and len(p) >= 2 and _number(p[0]) is not None
    ]
    row.step = progress.get("step") or 0
    row.steps = progress.get("steps") or row.steps
    row.steps_lost = progress.get("steps_lost") or 0
    row.preemptions = sum(1 for e in progress["events"] if e["kind"] == "preempted")
    row.checkpoint_step = progress.get("checkpoint_step")
    saved = [_number(e.get("time")) for e in progress["events"] if e["kind"] == "checkpoint"]
    row.checkpoint_at = max((t for t in saved if t is not None), default=None)
    row.updated_at = _number(progress.get("updated_at"))
    if row.state == "running" and progress.get("status") == "preempted":
        row.state = "waiting"  # preempted, its relaunch not yet training
    return progress


def _spend(row: JobRow, ledger: Any) -> dict[str, dict[str, Any]]:
    """The spend files, into ``row`` (spent, nodes now, resizes); the attempts for the job page."""
    from trainer.money.bill import resizes

    try:
        spend = ledger.spend()  # one listing, then each spend file
        Reads.count += len(spend.attempts)
    except (OSError, ValueError) as err:
        row.problems.append(f"spend files cannot be read: {err}")
        return {}
    row.spent_usd = round(spend.total_dollars, 6)
    attempts = {k: v for k, v in spend.attempts.items() if _number(v.get("launched_at")) is not None}
    for entry in attempts.values():
        try:
            row.resizes += len(resizes(entry))
        except (TypeError, ValueError, KeyError):
            row.problems.append(f"spend file {entry.get('attempt')!r}: node_changes are not [[time, nodes]]")
    if attempts:
        latest = max(attempts.values(), key=lambda e: float(e["launched_at"]))
        changes = [c for c in latest.get("node_changes") or [] if isinstance(c, list) and len(c) == 2]
        nodes = _number(changes[-1][1], int) if changes else _number(latest.get("nodes"), int)
        row.nodes = nodes if nodes or row.state in LIVE_STATES else (nodes or None)
    return attempts


def _best(row: JobRow, registry_entry: str | None) -> dict[str, dict[str, Any]]:
    """The registry's best.json of each evaluation set of the job's entry, into ``row``."""
    from trainer.base.storage import Storage

    if not registry_entry:
        return {}
    storage, bests = Storage(registry_entry), {}
    for name in sorted(storage.listdir(storage.root)):
        path = storage.path(name, REGISTRY_BEST)
        if not name.startswith("eval-") or not storage.exists(path):
            continue
        try:
            best = _json(storage, path)
        except (OSError, ValueError):
            row.problems.append(f"{name}/{REGISTRY_BEST} cannot be read")
            continue
        loss = _number(best.get("loss")) if isinstance(best, dict) else None
        if loss is None:
            row.problems.append(f"{name}/{REGISTRY_BEST} holds no loss")
            continue
        row.best[name] = loss
        bests[name] = {k: best.get(k) for k in ("loss", "step", "export", "run_id", "promoted_at")}
    return bests


def read_row(entry: dict[str, Any], *, detail: dict[str, Any] | None = None) -> JobRow:
    """A job's row from its index entry and its files; with ``detail`` (a dict), what the job page needs
    besides goes there."""
    state = entry.get("state") if entry.get("state") in jobs_index.STATES else "running"
    row = JobRow(
        dag_id=str(entry.get("dag_id")),
        entry=str(entry.get("entry")),
        owner=str(entry.get("owner")),
        job=str(entry.get("job")),
        state=state,
        steps=_number(entry.get("steps"), int),
        min_nodes=_number(entry.get("min_nodes"), int),
        num_nodes=_number(entry.get("num_nodes"), int),
        budget_usd=_number(entry.get("budget_usd")),
    )
    from airflow_dtrain.trust.roots import reserved_roots

    roots = reserved_roots()  # read once a row: the [dtrain] options behind it are parsed each call
    uri = _readable(entry.get("checkpoint_uri"), roots)
    if uri is None:
        row.problems.append(
            f"checkpoint directory {entry.get('checkpoint_uri')!r} is outside the storage roots"
        )
        return row
    checkpoints = CheckpointDir(uri)
    if not checkpoints.storage.exists(checkpoints.root):
        row.problems.append(f"checkpoint directory {uri} is missing")
        return row
    progress = _progress(row, checkpoints)
    ledger_uri = _readable(entry.get("ledger_uri"), roots) or uri
    attempts = _spend(row, CheckpointDir(ledger_uri))
    bests = _best(row, _readable(entry.get("registry_entry"), roots))
    if detail is not None:
        detail.update(
            progress=progress,
            attempts=attempts,
            bests=bests,
            checkpoint_uri=uri,
            registry_entry=entry.get("registry_entry"),
        )
        try:
            summary_path = checkpoints.path(SUMMARY)
            summary = (
                _json(checkpoints.storage, summary_path) if checkpoints.storage.exists(summary_path) else None
            )
            detail["summary"] = summary if isinstance(summary, dict) else None
        except (OSError, ValueError):
            row.problems.append(f"{SUMMARY} cannot be read")
    return row


def _checkpoints(uri: str) -> list[dict[str, Any]]:
    """Each committed checkpoint: its step, and valid or refused (the manifest's checks) and why."""
    from trainer.checkpoint.errors import CheckpointInvalid

    found, checkpoints = [], CheckpointDir(uri)
    for checkpoint in checkpoints.committed():
        try:
            Reads.count += 1
            manifest = checkpoints.checked_manifest(checkpoint.path)
            found.append(
                {
                    "step": checkpoint.step,
                    "path": checkpoint.path,
                    "valid": True,
                    "best": checkpoints.is_best(checkpoint.path),
                    "tokens_seen": _number(manifest.get("tokens_seen"), int),
                }
            )
        except (CheckpointInvalid, OSError, ValueError) as err:
            found.append({"step": checkpoint.step, "path": checkpoint.path, "valid": False, "why": str(err)})
    return found


def _held_out(uri: str) -> list[list[float]]:
    """``[[step, loss], ...]`` of the job's last evaluation (evals/latest.json: its curve, else its point)."""
    checkpoints = CheckpointDir(uri)
    path = checkpoints.path(EVAL_RESULTS)
    try:
        result = _json(checkpoints.storage, path) if checkpoints.storage.exists(path) else None
    except (OSError, ValueError):
        return []
    if not isinstance(result, dict):
        return []
    curve = result.get("eval_curve") if isinstance(result.get("eval_curve"), list) else []
    points = [[p[0], p[1]] for p in curve if isinstance(p, list) and len(p) >= 2]
    if not points and _number(result.get("step")) is not None and _number(result.get("loss")) is not None:
        points = [[result["step"], result["loss"]]]
    return [p for p in points if _number(p[0]) is not None and _number(p[1]) is not None]


def job_detail(entry: dict[str, Any]) -> dict[str, Any]:
    """The job page: the row, the curves (train loss, held-out loss, tokens/s), the events, nodes and spend
    over time, the attempts, the checkpoints and the models."""
    from airflow_dtrain.ui.charts import curves

    detail: dict[str, Any] = {}
    row = read_row(entry, detail=detail)
    out = {
        "row": row.to_dict(),
        "summary": detail.get("summary"),
        "registry_entry": detail.get("registry_entry"),
    }
    out["attempts"] = [
        {
            k: a.get(k)
            for k in (
                "attempt",
                "capacity",
                "nodes",
                "price_per_node_hour",
                "launched_at",
                "billed_s",
                "dollars",
                "ended",
                "node_changes",
            )
        }
        for a in sorted(detail.get("attempts", {}).values(), key=lambda a: float(a["launched_at"]))
    ]
    out["checkpoints"] = _checkpoints(detail["checkpoint_uri"]) if "checkpoint_uri" in detail else []
    out["models"] = detail.get("bests", {})
    held_out = _held_out(detail["checkpoint_uri"]) if "checkpoint_uri" in detail else []
    out["charts"] = curves(
        detail.get("progress") or {}, out["attempts"], budget_usd=row.budget_usd, held_out=held_out
    )
    out["checkpoint_uri"] = detail.get("checkpoint_uri")
    return out


@dataclass
class _Cached:
    modified: float
    row: JobRow
    checked_at: float


class RowCache:
    """The jobs page's rows, kept between requests: an entry is read again only when its listing says it
    changed, and a live job's files at most every ``LIVE_REFRESH_S``; an ended job costs nothing after its
    first read. One per process (the api-server's workers each keep their own)."""

    def __init__(self, root: str | None = None) -> None:
        self.root = root
        self._rows: dict[tuple[str, str], _Cached] = {}
        self._lock = threading.Lock()

    def rows(self, dag_ids: list[str]) -> list[JobRow]:
        """The rows of every job of ``dag_ids`` (only these DAGs' entries are listed, let alone read)."""
        now, out = time.time(), []
        for dag_id in dag_ids:
            listing = jobs_index.list_entries(dag_id, self.root)
            for entry, modified in listing.items():
                with self._lock:
                    cached = self._rows.get((dag_id, entry))
                if (
                    cached is not None
                    and cached.modified == modified
                    and (cached.row.state not in LIVE_STATES or now - cached.checked_at < LIVE_REFRESH_S)
                ):
                    out.append(cached.row)
                    continue
                Reads.count += 1
                found = jobs_index.read_entry(dag_id, entry, self.root)
                if found is None:
                    row = JobRow(
                        dag_id=dag_id,
                        entry=entry,
                        owner="?",
                        job=entry.rsplit(".", 1)[0],
                        state="failed",
                        problems=["its index entry cannot be read"],
                    )
                else:
                    row = read_row(found)
                with self._lock:
                    self._rows[(dag_id, entry)] = _Cached(modified, row, now)
                out.append(row)
        return out
