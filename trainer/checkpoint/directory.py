"""The checkpoint directory: its layout, named once, and the one reader of it.

Layout under a checkpoint URI (a local path, ``file://`` or ``s3://``)::

    step-00000050/                                   one per save, committed or interrupted
        .metadata, __0_0.distcp, __1_0.distcp, ...   torch.distributed.checkpoint files
        BEST                                         optional: kept by retention (mark_best)
        manifest.json                                written last: the commit point
    lease/0000000007.json                            the writer lease: the highest token is the one writer
    progress.json                                    the live status (trainer/report/progress.py)
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
started while it still ran) and must not commit (trainer/checkpoint/checkpointer.py checks before
every manifest). A manifest names the job (``"job"``) and the lease token that wrote it;
checkpoints of another job are never resumed or pruned (``foreign_jobs``, ``prune``).

Writing a checkpoint (the DCP save, the commit protocol) stays in trainer/checkpoint/checkpointer.py
and progress.json's writer in trainer/report/progress.py; they take the names from here. The lease
files are trainer/checkpoint/lease_files.py's, the ledger and spend files trainer/checkpoint/spend_files.py's,
the errors trainer/checkpoint/errors.py's (all importable from here).

Standard library only at module level (fsspec is imported on the first remote access,
through trainer.base.storage): the Airflow provider imports this at DAG-parse time.
Remote listings are never cached (see ``Storage.fs``): other processes, the other ranks
and the provider, change the directory between two looks.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any, NamedTuple

# The errors, the lease files and the money a checkpoint directory holds live in modules of their own; their
# names are importable from here as before.
from trainer.checkpoint.errors import CheckpointInvalid
from trainer.checkpoint.lease_files import LeaseFiles
from trainer.checkpoint.spend_files import Ledger, SpendFiles
from trainer.base.storage import Storage

MANIFEST = "manifest.json"
"""In a step directory, written last: a step directory with one is committed."""
BEST = "BEST"
"""In a step directory: marked the best so far (by evaluation); retention never deletes it."""
PROGRESS = "progress.json"
SUMMARY = "summary.json"
EVALS = "evals"
EVAL_RESULTS = f"{EVALS}/latest.json"
REPORT = "report.png"
REGISTRY_BEST = "best.json"
"""In a model registry, not a checkpoint directory: the best checkpoint so far."""
OWNER = "owner.json"
"""At the root of a job's directory (its checkpoints, a sweep's ledger, its registry entry):
``{"owner", "job"}``, written once, before anything else is
(``airflow_dtrain.trust.ownership.check_job_dir``)."""

STEP_DIR = re.compile(r"^step-(\d{8})$")
STEP_DIR_GLOB = "step-*"
"""For messages: what a step directory looks like."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(path: str) -> int | None:
    """The step a step directory (a name, a path or a URL) holds; None for anything else."""
    match = STEP_DIR.match(path.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


class Checkpoint(NamedTuple):
    """One step directory: a tuple, so ``(step, path)`` unpacking works."""

    step: int
    path: str


MANIFEST_REQUIRED = ("step", "world_size", "flavor", "config_hash", "files", "tokens_seen", "wall_time_s")
"""Fields every committed manifest has."""
FORMAT_DCP = "dcp"
"""A manifest's ``format`` when its step directory is a torch.distributed.checkpoint save: the bundled
trainer's (a manifest without the field was written by it before the field existed). A program of your own
names its own format (trainer/contract.py's ``commit_checkpoint``) and only a ``"dcp"`` one gets the DCP
checks."""


def manifest_format(manifest: dict[str, Any]) -> str:
    """What a committed checkpoint's files are (``FORMAT_DCP`` for the bundled trainer's)."""
    return str(manifest.get("format") or FORMAT_DCP)


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


class CheckpointDir(LeaseFiles, SpendFiles):
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
        """(root, step directory, manifest) of a step directory URI, or of the latest committed one under
        a root.

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
        """A committed checkpoint's manifest: FileNotFoundError when it has none, ValueError when it does
        not parse."""
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
        """The trainer's live status (trainer/report/progress.py); {} before the trainer first wrote it."""
        return self.read_json(PROGRESS, default={})

    def write_summary(self, summary: dict[str, Any]) -> str:
        """The run summary as ``summary.json`` beside the checkpoints; returns its path."""
        return self.write_json(SUMMARY, summary)
