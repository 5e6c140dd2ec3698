"""Names of a task instance's pod groups (deterministic, DNS-1035-safe, one per relaunch), and where a
job's checkpoints go when no ``checkpoint_uri`` is given.

The same dag_id/run_id/task_id/map_index always gives the same base name, which is what lets a
restarted task find its group again instead of launching another; ``group_name`` numbers its relaunches.
"""

from __future__ import annotations

import hashlib
import os
import re

_MAX_NAME = 46  # leaves room for Kubernetes' "-<index>-<5 chars>" pod suffixes within 63


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def group_base_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """A deterministic, DNS-1035-safe name for the groups of one task instance.

    The same dag_id/run_id/task_id/map_index always gives the same name, which is
    what lets a restarted task find its group again instead of launching another.
    """
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}\0{map_index}".encode()).hexdigest()[:10]
    stem = _slug(f"{dag_id}-{task_id}")[: _MAX_NAME - len(digest) - 6].strip("-")
    if not stem or not stem[0].isalpha():
        stem = f"g{stem}"[: _MAX_NAME - len(digest) - 6].strip("-")
    return f"{stem}-{digest}"


def group_name(base: str, relaunch: int) -> str:
    """The name of relaunch number ``relaunch`` (0 for the first launch)."""
    return f"{base}-r{relaunch}"


def relaunch_index(base: str, name: str) -> int | None:
    """The relaunch number of ``name`` if it belongs to ``base``, else None."""
    match = re.fullmatch(re.escape(base) + r"-r([0-9]+)", name)
    return int(match.group(1)) if match else None


def default_checkpoint_uri(dtrain_dir: str | os.PathLike, *parts: str) -> str:
    """``<dtrain_dir>/checkpoints/<parts...>``: the one spelling of the default checkpoint directory, beside
    the local backend's state (``FSDPTrainOperator``) and the bundled DAGs' own directories. Every run of a
    job finds its checkpoints (and its ledger) there again."""
    return os.path.join(os.fspath(dtrain_dir), "checkpoints", *parts)
