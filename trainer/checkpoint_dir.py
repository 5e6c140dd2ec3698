"""The checkpoint directory: its layout, named once, and the one reader of it.

Layout under a checkpoint URI (a local path, ``file://`` or ``s3://``)::

    step-00000050/                                   one per save, committed or interrupted
        .metadata, __0_0.distcp, __1_0.distcp, ...   torch.distributed.checkpoint files
        BEST                                         optional: kept by retention (mark_best)
        manifest.json                                written last: the commit point
    lease/0000000007.json                            the writer lease: the highest token is the one writer
    progress.json                                    the live status (trainer/progress.py)
    summary.json                                     the run summary (FSDPTrainOperator)
    evals/latest.json                                held-out results (trainer/evaluate.py)
    report.png                                       train and held-out loss curves

A model registry (EvaluateCheckpointOperator's ``registry_uri``) is read with the same class::

    best.json                                        the best model so far
    <run>/step-00000050/                             its Hugging Face export

"The latest checkpoint" means one thing everywhere (resume, retention, validation,
evaluation, export, the cost ledger, the summary): the highest step directory that holds
a manifest. A step directory without one is an interrupted save, never the latest.

One writer per directory: a training group takes a lease at start, ``lease/<token>.json``
created exclusively with token = 1 + the highest one there (see ``acquire_lease``). A group
whose token is no longer the highest has been fenced off by a newer one (a retry that
started while it still ran) and must not commit (trainer/checkpoint.py checks before
every manifest). A manifest names the job (``"job"``) and the lease token that wrote it;
checkpoints of another job are never resumed or pruned (``foreign_jobs``, ``prune``).

Writing a checkpoint (the DCP save, the commit protocol) stays in trainer/checkpoint.py
and progress.json's writer in trainer/progress.py; they take the names from here.

Standard library only at module level (fsspec is imported on the first remote access,
through trainer.storage): the Airflow provider imports this at DAG-parse time.
Remote listings are never cached (see ``Storage.fs``): other processes, the other ranks
and the provider, change the directory between two looks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trainer.capacity import Capacity
from trainer.cost import CAPACITY_TYPES
from trainer.storage import Storage

MANIFEST = "manifest.json"
"""In a step directory, written last: a step directory with one is committed."""
BEST = "BEST"
"""In a step directory: marked the best so far (by evaluation); retention never deletes it."""
PROGRESS = "progress.json"
SUMMARY = "summary.json"
EVALS = "evals"
EVAL_RESULTS = f"{EVALS}/latest.json"
REPORT = "report.png"
SPEND = "spend"
"""Under a job's ledger root (its checkpoint directory, or a sweep's): ``spend/<attempt>.json``, one file
per attempt (pod group), rewritten by that attempt as it runs and finalised by the provider when it ends.
One writer per file, so attempts of a job, or members of a sweep, never race on a shared total."""
PRICES = "prices"
"""Under a job's ledger root: ``prices/<attempt>.json``, ``{"prices_in_effect": [[since, usd_per_node_hour], ...],
"zone", "instance_type", "updated_at"}``: the spot prices in effect since a spot attempt's launch, written by the
provider while the attempt runs (its one writer), read by the attempt's cap (``trainer.budget``)."""
LEASES = "lease"
"""Writer leases, one file per token: ``lease/<token:010d>.json``."""
LEASES_KEPT = 4
"""Lease files kept (the newest); older ones only tell the history, and the current one is never pruned."""
REGISTRY_BEST = "best.json"
OWNER = "owner.json"
"""At the root of a job's directory (its checkpoints, a sweep's ledger, its registry entry): ``{"owner", "job"}``,
written once, before anything else is (``airflow_dtrain.trust.check_job_dir``)."""
"""In a model registry, not a checkpoint directory: the best checkpoint so far."""

STEP_DIR = re.compile(r"^step-(\d{8})$")
STEP_DIR_GLOB = "step-*"
"""For messages: what a step directory looks like."""
LEASE_FILE = re.compile(r"^(\d{10})\.json$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(path: str) -> int | None:
    """The step a step directory (a name, a path or a URL) holds; None for anything else."""
    match = STEP_DIR.match(path.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


class WriterFenced(RuntimeError):
    """A newer writer lease exists in the checkpoint directory: another group took it over, and
    this one must commit nothing more (``python -m trainer`` exits ``FENCED_EXIT_CODE``)."""


class CheckpointStorageError(RuntimeError):
    """A checkpoint could not be written: the storage refused it (a full disk, no permission, a
    read-only filesystem, S3 AccessDenied). Raised on every rank together, after the partial step
    directory was removed; ``python -m trainer`` prints the message, one line naming the path and the
    cause, and exits ``STORAGE_EXIT_CODE``."""


# Transient network trouble is not the storage refusing a write: those stay ordinary failures.
_NOT_STORAGE = (ConnectionError, TimeoutError)
# S3 error codes (botocore's ClientError.response["Error"]["Code"]) that mean "this principal may not write here".
_S3_REFUSALS = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                          "NoSuchBucket", "AccountProblem", "QuotaExceeded"})  # fmt: skip


def storage_cause(err: BaseException | None) -> BaseException | None:
    """The storage refusal behind ``err`` (an OSError such as ENOSPC/EACCES/EROFS, or a botocore S3
    AccessDenied), looking through chained exceptions and DCP's per-rank ``CheckpointException``
    failures; None when ``err`` is something else (a crash, a lost peer, a fence)."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and not isinstance(e, _NOT_STORAGE):
            return e
        code = (
            ((getattr(e, "response", None) or {}).get("Error") or {}).get("Code")
            if isinstance(getattr(e, "response", None), dict)
            else None
        )
        if code in _S3_REFUSALS:
            return e
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            todo.extend(f[0] if isinstance(f, tuple) else f for f in failures.values())
        todo.extend([e.__cause__, e.__context__])
    return None


def lease_file_name(token: int) -> str:
    return f"{token:010d}.json"


class Lease(NamedTuple):
    """A writer lease: its fencing token and what its file says (who took it, when)."""

    token: int
    info: dict[str, Any]

    @property
    def group(self) -> str:
        return self.info.get("group") or f"pid {self.info.get('pid', '?')} on {self.info.get('host', '?')}"


class Checkpoint(NamedTuple):
    """One step directory: a tuple, so ``(step, path)`` unpacking works."""

    step: int
    path: str


@dataclass(frozen=True)
class Ledger:
    """The spend recorded in one checkpoint manifest (all zeros before the first checkpoint)."""

    step: int = 0
    step_time_s: float | None = None
    total_dollars: float = 0.0
    by_capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    """``{"spot" | "on_demand" | "local": {"node_hours", "gpu_hours", "dollars"}}``."""
    path: str | None = None
    """The checkpoint directory it was read from (None: no committed checkpoint yet)."""
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """Newer committed checkpoints whose manifest failed its checks (``CheckpointInvalid.to_dict()``)."""

    @property
    def gpu_hours(self) -> float:
        return sum(c.get("gpu_hours", 0.0) for c in self.by_capacity.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "step_time_s": self.step_time_s,
            "total_dollars": self.total_dollars,
            "gpu_hours": self.gpu_hours,
            "by_capacity": self.by_capacity,
            "path": self.path,
            "skipped": self.skipped,
        }

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], path: str, where: str) -> Ledger:
        """The ledger a manifest carries; ``ValueError`` naming ``where`` and the field when malformed."""
        cost = manifest.get("cost") or {}
        if not isinstance(cost, dict):
            raise ValueError(f"{where}: cost: expected an object, got {cost!r}")
        by_capacity = {c: {"node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0} for c in CAPACITY_TYPES}
        for key, entry in cost.items():
            try:  # buckets of older manifests are spelled as they were ("local", "on-demand")
                bucket = Capacity(key).value
            except ValueError:
                continue
            try:
                for k in ("node_hours", "gpu_hours", "dollars"):
                    by_capacity[bucket][k] += float((entry or {}).get(k, 0.0) or 0.0)
            except (TypeError, ValueError, AttributeError):
                raise ValueError(f"{where}: cost.{key}: expected numbers, got {entry!r}") from None
        total = cost.get("total_dollars")
        try:
            total = float(total) if total is not None else sum(c["dollars"] for c in by_capacity.values())
        except (TypeError, ValueError):
            raise ValueError(f"{where}: cost.total_dollars: expected a number, got {total!r}") from None
        step_time = manifest.get("step_time_s")
        try:
            step_time = float(step_time) if step_time is not None else None
        except (TypeError, ValueError):
            raise ValueError(f"{where}: step_time_s: expected a number, got {step_time!r}") from None
        if step_time is not None and step_time <= 0:
            step_time = None  # not measured (e.g. a checkpoint before the first timed step)
        return cls(
            step=int(manifest.get("step", 0)),
            step_time_s=step_time,
            total_dollars=total,
            by_capacity=by_capacity,
            path=path,
        )


MANIFEST_REQUIRED = ("step", "world_size", "flavor", "config_hash", "files", "tokens_seen", "wall_time_s")
"""Fields every committed manifest has."""
FORMAT_DCP = "dcp"
"""A manifest's ``format`` when its step directory is a torch.distributed.checkpoint save: the bundled trainer's
(a manifest without the field was written by it before the field existed). A program of your own names its own
format (trainer/contract.py's ``commit_checkpoint``) and only a ``"dcp"`` one gets the DCP checks."""


def manifest_format(manifest: dict[str, Any]) -> str:
    """What a committed checkpoint's files are (``FORMAT_DCP`` for the bundled trainer's)."""
    return str(manifest.get("format") or FORMAT_DCP)


class CheckpointInvalid(ValueError):
    """A checkpoint failed a check; ``checkpoint``, ``check`` and ``file`` say which, where."""

    def __init__(self, checkpoint: str, check: str, file: str, detail: str):
        self.checkpoint, self.check, self.file, self.detail = checkpoint, check, file, detail
        super().__init__(f"checkpoint {checkpoint}: check {check!r} failed for {file}: {detail}")

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "check": self.check, "file": self.file, "detail": self.detail}


def _non_finite(node: Any, prefix: str = "") -> tuple[str, float] | None:
    """The first (dotted key, value) in a manifest that is NaN or infinite (JSON's NaN/Infinity tokens)."""
    if isinstance(node, float) and not math.isfinite(node):
        return prefix, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        found = _non_finite(value, f"{prefix}.{key}" if prefix else str(key))
        if found:
            return found
    return None


@dataclass
class Spend:
    """Every second billed to a job (or a sweep): the sum of its attempts' spend files."""

    total_dollars: float = 0.0
    by_capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``{attempt: its spend file}``."""

    @classmethod
    def of(cls, entries: dict[str, dict[str, Any]], where: str) -> Spend:
        by_capacity = {c: {"node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0} for c in CAPACITY_TYPES}
        for name, entry in entries.items():
            try:
                bucket = Capacity(entry.get("capacity", Capacity.ANY.value)).value
                for k in ("node_hours", "gpu_hours", "dollars"):
                    value = float(entry.get(k, 0.0) or 0.0)
                    if not value >= 0:
                        raise ValueError
                    by_capacity[bucket][k] += value
            except (TypeError, ValueError, AttributeError):
                raise ValueError(
                    f"{where}/{name}.json: expected a spend entry with numbers >= 0, got {entry!r}"
                ) from None
        total = sum(c["dollars"] for c in by_capacity.values())
        return cls(total_dollars=round(total, 9), by_capacity=by_capacity, attempts=dict(entries))


class CheckpointDir:
    """A checkpoint root: its step directories and the small files beside them.

    Paths it returns are plain absolute paths locally and full ``s3://`` URLs remotely; a
    step directory argument may be a step (int), a name (``step-00000050``) or such a path.

    :param uri: a local path, ``file://`` or ``s3://`` URL, or a ``Storage`` of one.
    """

    def __init__(self, uri: str | Storage):
        self.storage = uri if isinstance(uri, Storage) else Storage(uri)

    def __repr__(self) -> str:
        return f"CheckpointDir({self.root!r})"

    @property
    def root(self) -> str:
        return self.storage.root

    @classmethod
    def split(cls, uri: str) -> tuple[CheckpointDir, str | None]:
        """(the root, the step directory or None) of a root URI or a step directory URI."""
        trimmed = uri.rstrip("/")
        name = trimmed.rsplit("/", 1)[-1]
        if STEP_DIR.match(name):
            root = cls(trimmed[: -len(name) - 1] or "/")
            return root, root.path(name)
        return cls(trimmed), None

    @classmethod
    def resolve(cls, uri: str) -> tuple[CheckpointDir, str, dict[str, Any]]:
        """(root, step directory, manifest) of a step directory URI, or of the latest committed one under a root.

        Raises FileNotFoundError naming the URI when there is no committed checkpoint.
        """
        root, step_dir = cls.split(uri)
        if step_dir is None:
            latest = root.latest()
            if latest is None:
                raise FileNotFoundError(f"no committed checkpoint ({STEP_DIR_GLOB}/{MANIFEST}) under {uri}")
            step_dir = latest.path
        return root, step_dir, root.manifest(step_dir)

    # -- paths ----------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        """A path under the root, e.g. ``path(PROGRESS)``."""
        return self.storage.path(*parts)

    def step_path(self, step: int | str) -> str:
        """The step directory of a step (or of a step directory's name or path)."""
        return self.path(self._name(step))

    def manifest_path(self, step: int | str) -> str:
        return self.path(self._name(step), MANIFEST)

    @staticmethod
    def _name(step: int | str) -> str:
        if isinstance(step, int):
            return step_dir_name(step)
        name = step.rstrip("/").rsplit("/", 1)[-1]
        if not STEP_DIR.match(name):
            raise ValueError(f"expected a step directory ({STEP_DIR_GLOB}), got {step!r}")
        return name

    # -- step directories -----------------------------------------------------------------
    def step_dirs(self) -> list[Checkpoint]:
        """Every step directory, committed or not, oldest first ([] when the root does not exist)."""
        found = (
            Checkpoint(step_of(name), self.path(name))
            for name in self.storage.listdir(self.root)
            if STEP_DIR.match(name)
        )
        return sorted(found)

    def is_committed(self, step: int | str) -> bool:
        return self.storage.exists(self.manifest_path(step))

    def committed(self) -> list[Checkpoint]:
        """The committed checkpoints (step directories with a manifest), oldest first."""
        return [c for c in self.step_dirs() if self.is_committed(c.path)]

    def latest(self) -> Checkpoint | None:
        """The highest committed checkpoint, or None; an interrupted save above it is skipped."""
        # From the top down: one existence check in the usual case, not one per checkpoint.
        for candidate in reversed(self.step_dirs()):
            if self.is_committed(candidate.path):
                return candidate
        return None

    def manifest(self, step: int | str) -> dict[str, Any]:
        """A committed checkpoint's manifest: FileNotFoundError when it has none, ValueError when it does not parse."""
        path = self.manifest_path(step)
        if not self.storage.exists(path):
            raise FileNotFoundError(
                f"{self.step_path(step)} is not a committed checkpoint: it has no {MANIFEST}"
            )
        return self.storage.read_json(path)

    def checked_manifest(self, step: int | str) -> dict[str, Any]:
        """A committed checkpoint's manifest, checked (the first checks of ``trainer.validate``, and all the
        budget task needs): it parses, has every required field, names its own step, holds no NaN/Inf
        number, and its ledger reads. Raises ``CheckpointInvalid`` naming the check; never waits."""
        path = self.step_path(step)
        try:
            manifest = self.manifest(step)
        except FileNotFoundError:
            raise CheckpointInvalid(
                path, "manifest", MANIFEST, "missing: the save was never committed"
            ) from None
        except ValueError as err:
            raise CheckpointInvalid(path, "manifest", MANIFEST, f"not valid JSON: {err}") from None
        if not isinstance(manifest, dict):
            raise CheckpointInvalid(path, "manifest", MANIFEST, f"not an object: {type(manifest).__name__}")
        missing = [k for k in MANIFEST_REQUIRED if k not in manifest]
        if missing:
            raise CheckpointInvalid(path, "manifest", MANIFEST, f"lacks {', '.join(missing)}")
        if manifest["step"] != step_of(path):
            raise CheckpointInvalid(
                path,
                "manifest",
                MANIFEST,
                f"says step {manifest['step']}, the directory is {step_dir_name(step_of(path))}",
            )
        # (a NaN step time or cost would silently disable the budget's projection on resume; the embedded
        # config is informational and may hold an infinite setting)
        bad = _non_finite({k: v for k, v in manifest.items() if k != "config"})
        if bad:
            raise CheckpointInvalid(path, "manifest", MANIFEST, f"{bad[0]} is {bad[1]}, not a finite number")
        try:
            Ledger.from_manifest(manifest, path, self.manifest_path(path))
        except ValueError as err:
            raise CheckpointInvalid(path, "manifest", MANIFEST, str(err)) from None
        return manifest

    def is_best(self, step: int | str) -> bool:
        return self.storage.exists(self.path(self._name(step), BEST))

    def mark_best(self, step: int | str, note: dict[str, Any] | None = None) -> str:
        """Mark a committed checkpoint as the best so far: retention never deletes it.

        Writes ``BEST`` (JSON: when, plus ``note``, e.g. the evaluation loss) into the step
        directory; returns its path. Refuses a directory that is not committed.
        """
        if not self.is_committed(step):
            raise FileNotFoundError(
                f"mark_best: {self.step_path(step)} is not a committed checkpoint (no {MANIFEST})"
            )
        path = self.path(self._name(step), BEST)
        self.storage.write_json(path, {"marked_at": time.time(), **(note or {})})
        return path

    def remove(self, step: int | str) -> None:
        """Delete a step directory, its manifest first: a half-deleted checkpoint never looks committed."""
        self.storage.remove_file(self.manifest_path(step))
        self.storage.remove_tree(self.step_path(step))

    def prune(self, keep: int, job: str | None = None, continues: str = "") -> list[str]:
        """Retention: keep the last ``keep`` committed checkpoints and every one marked best, and drop
        interrupted saves older than the latest committed one; returns the paths removed.

        An interrupted save newer than the latest may be a save still in flight: it stays.
        ``job`` (not None): only checkpoints of that job (or of none: no ``job`` in the manifest,
        or "", or of the job it ``continues``) count and are removed; another job's are never touched.
        """
        steps = self.step_dirs()
        every = [c for c in steps if self.is_committed(c.path)]
        committed = (
            every if job is None else [c for c in every if self.job_of(c.path) in ("", job, continues)]
        )
        if not committed:
            return []
        removed = [c.path for c in committed[:-keep] if not self.is_best(c.path)] if keep > 0 else []
        committed_steps = {c.step for c in every}
        removed += [c.path for c in steps if c.step < committed[-1].step and c.step not in committed_steps]
        for path in removed:
            self.remove(path)
        return removed

    # -- whose checkpoints, and who writes them ---------------------------------------------
    def job_of(self, step: int | str) -> str:
        """The job a committed checkpoint belongs to ("" for none: older manifests have no such field).

        A manifest that vanished (pruned meanwhile) or does not parse counts as no job's.
        """
        try:
            return str(self.manifest(step).get("job") or "")
        except (FileNotFoundError, ValueError):
            return ""

    def foreign_jobs(self, job: str, continues: str = "") -> dict[str, list[str]]:
        """{other job: [its committed checkpoints]} for a run of ``job`` (that ``continues`` another
        one, whose checkpoints are then not foreign); {} when ``job`` is ""."""
        if not job:
            return {}
        found: dict[str, list[str]] = {}
        for c in self.committed():
            other = self.job_of(c.path)
            if other and other not in (job, continues):
                found.setdefault(other, []).append(c.path)
        return found

    def leases(self) -> list[int]:
        """The tokens of the lease files there, lowest first ([] before the first writer)."""
        return sorted(int(m.group(1)) for name in self.storage.listdir(self.path(LEASES))
                      if (m := LEASE_FILE.match(name)))  # fmt: skip

    def lease_path(self, token: int) -> str:
        return self.path(LEASES, lease_file_name(token))

    def lease(self, token: int) -> Lease:
        """A lease's file; its info is {} when it was pruned or is not readable."""
        try:
            return Lease(token, self.storage.read_json(self.lease_path(token)))
        except (FileNotFoundError, ValueError):
            return Lease(token, {})

    def newest_lease(self) -> Lease | None:
        tokens = self.leases()
        return self.lease(tokens[-1]) if tokens else None

    def acquire_lease(self, info: dict[str, Any], attempts: int = 100) -> Lease:
        """Become the writer: create ``lease/<token>.json`` with token = 1 + the highest one there.

        The creation is exclusive (``Storage.create_exclusive``), so two writers racing for one
        token get one each: the loser takes the next. Every earlier holder is fenced off from then on.
        """
        self.storage.makedirs()
        token = (self.leases() or [0])[-1] + 1
        for _ in range(attempts):
            body = {"token": token, **info, "acquired_at": time.time()}
            if self.storage.create_exclusive(self.lease_path(token), json.dumps(body, indent=2)):
                newest = (self.leases() or [token])[-1]
                if newest <= token:
                    self.prune_leases(token)
                    return Lease(token, body)
                # A newer lease already exists: this token was read from a stale listing (its file had
                # been pruned, or others took newer ones meanwhile). Holding it would mean being fenced at
                # once, and a reused token is not unique: give it back and take one past the newest.
                self.storage.remove_file(self.lease_path(token))
                token = newest + 1
                continue
            token = max(token + 1, (self.leases() or [0])[-1] + 1)
        raise RuntimeError(f"could not take a writer lease in {self.path(LEASES)} after {attempts} attempts")

    def prune_leases(self, current: int, keep: int = LEASES_KEPT) -> None:
        """Remove all but the ``keep`` newest lease files; never ``current`` nor any newer one."""
        tokens = self.leases()
        for token in tokens[:-keep] if keep > 0 else tokens:
            if token < current:
                self.storage.remove_file(self.lease_path(token))

    # -- files beside the step directories --------------------------------------------------
    def read_json(self, name: str, default: Any = None) -> Any:
        """A JSON file under the root (``name`` may hold ``/``), or ``default`` when it does not exist."""
        path = self.path(*name.split("/"))
        if not self.storage.exists(path):
            return default
        return self.storage.read_json(path)

    def write_json(self, name: str, obj: Any, durable: bool = True) -> str:
        """Write a JSON file under the root, whole or not at all for readers; returns its path."""
        path = self.path(*name.split("/"))
        if not self.storage.remote:
            os.makedirs(os.path.dirname(path), exist_ok=True)  # e.g. a registry not created yet
        self.storage.write_json(path, obj, durable=durable)
        return path

    def progress(self) -> dict[str, Any]:
        """The trainer's live status (see trainer/progress.py); {} before the trainer first wrote it."""
        return self.read_json(PROGRESS, default={})

    def write_summary(self, summary: dict[str, Any]) -> str:
        """The run summary as ``summary.json`` beside the checkpoints; returns its path."""
        return self.write_json(SUMMARY, summary)

    def ledger(self, spend_root: CheckpointDir | None = None) -> Ledger:
        """The job's ledger: step and measured step time of the latest committed checkpoint, and the
        spend of every attempt (``spend_root``'s spend files, default this directory's) -- or the
        checkpoint's own ledger where that is larger (a directory written before spend files existed).

        Raises ``ValueError`` naming the manifest or spend file and the field when one is malformed.
        """
        ledger, skipped = Ledger(), []
        for checkpoint in reversed(self.committed()):  # the newest whose manifest checks out
            try:
                manifest = self.checked_manifest(checkpoint.path)
            except CheckpointInvalid as err:
                skipped.append(err.to_dict())
                continue
            ledger = Ledger.from_manifest(manifest, checkpoint.path, self.manifest_path(checkpoint.path))
            break
        ledger = dataclasses.replace(ledger, skipped=skipped)
        spend = (spend_root or self).spend()
        if spend.total_dollars > ledger.total_dollars:
            ledger = dataclasses.replace(
                ledger, total_dollars=spend.total_dollars, by_capacity=spend.by_capacity
            )
        return ledger

    # -- the spend ledger -------------------------------------------------------------------
    def record_spend(self, attempt: str, entry: dict[str, Any]) -> str:
        """Write one attempt's spend file (its own: no other writer); returns its path."""
        if not attempt or "/" in attempt or attempt.startswith("."):
            raise ValueError(f"attempt: not a file name: {attempt!r}")
        return self.write_json(f"{SPEND}/{attempt}.json", {"attempt": attempt, **entry}, durable=False)

    def spend_entry(self, attempt: str) -> dict[str, Any] | None:
        return self.read_json(f"{SPEND}/{attempt}.json")

    def record_prices(self, attempt: str, entry: dict[str, Any]) -> str:
        """Write the spot prices in effect since ``attempt``'s launch (``PRICES``); returns the path."""
        if not attempt or "/" in attempt or attempt.startswith("."):
            raise ValueError(f"attempt: not a file name: {attempt!r}")
        return self.write_json(f"{PRICES}/{attempt}.json", {"attempt": attempt, **entry}, durable=False)

    def prices_in_effect(self, attempt: str) -> list[tuple[float, float]]:
        """``attempt``'s prices (``PRICES``) as ``[(since, usd_per_node_hour), ...]``; [] when none were written.
        Raises ``ValueError`` naming the file when it is not such a list."""
        entry = self.read_json(f"{PRICES}/{attempt}.json") or {}
        got = entry.get("prices_in_effect") if isinstance(entry, dict) else entry
        try:
            prices = [(float(t), float(p)) for t, p in got or []]
        except (TypeError, ValueError):
            raise ValueError(
                f"{self.path(PRICES, attempt + '.json')}: prices_in_effect: expected [[since, price], "
                f"...], got {got!r}"
            ) from None
        if any(not (p >= 0) for _, p in prices):
            raise ValueError(
                f"{self.path(PRICES, attempt + '.json')}: a price below 0 or not a number: {prices!r}"
            )
        return prices

    def spend(self) -> Spend:
        """The sum of every attempt's spend file (zero when there is none)."""
        entries = {}
        for name in self.storage.listdir(self.path(SPEND)):
            if name.endswith(".json") and not name.startswith("."):
                try:
                    entries[name[:-5]] = self.read_json(f"{SPEND}/{name}", default={})
                except ValueError as err:  # a torn or hand-edited file: the budget must not guess
                    raise ValueError(f"{self.path(SPEND, name)}: not JSON ({err})") from None
        return Spend.of(entries, self.path(SPEND))
