"""The job index: one small file per training job, the only place the Training jobs pages find a job.

``<index>/<dag_id>/<entry>.json`` (``[dtrain] jobs_index``, default ``$AIRFLOW_HOME/dtrain/jobs``, a path or
``s3://``), written by the tasks that run the job: ``FSDPTrainOperator`` when it has claimed the job's
directory (``check_job_dir``) and when it ends, ``EvaluateCheckpointOperator`` with its registry entry, and
``BudgetBranchOperator`` when the job waits. Beside it, ``<index>/<dag_id>/runs/<run_key>/<task_id>.json``
points a task instance at its job's entry. A reader takes every path from here, never from a request; the
entry's name is its job and a digest of its owner and job, so no owner's job shares another's entry.

Writing the index never fails a task: a job whose entry could not be written trains on, unseen by the pages
(a warning says why). Cheap at parse time: the stdlib; Airflow's ``conf`` and fsspec where used.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_dtrain.trust.ownership import run_key
from airflow_dtrain.trust.roots import local_root

log = logging.getLogger(__name__)

STATES = ("running", "waiting", "stopped at cap", "finished", "failed")
"""What the jobs page says of a job: training, waiting for a price or a relaunch, stopped by its budget,
done, or ended by an error."""
ENTRY = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}\.[0-9a-f]{12}")
"""An entry's name: its job, a dot, and 12 hex digits of the digest of its owner and job."""
DAG_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")
"""Airflow's own rule for a DAG id."""
RUNS = "runs"


def index_root() -> str:
    """``[dtrain] jobs_index``, else ``$AIRFLOW_HOME/dtrain/jobs``."""
    from airflow.sdk import conf

    return (conf.get("dtrain", "jobs_index", fallback="") or "").strip() or f"{local_root()}/jobs"


def entry_id(owner: str, job: str) -> str:
    """The entry of ``owner``'s ``job``: one-to-one, a path segment, and readable."""
    digest = hashlib.sha256(f"{owner}\0{job}".encode()).hexdigest()[:12]
    return f"{job}.{digest}"


def _storage(root: str | None = None) -> Any:
    from trainer.base.storage import Storage

    return Storage(root or index_root())


def record(dag_id: str, owner: str, job: str, *, run: tuple[str, str] | None = None, **fields: Any) -> None:
    """Merge ``fields`` into the entry of ``owner``'s ``job`` of ``dag_id`` (creating it), and point the
    task instance ``run`` (``(run_id, task_id)``) at it. One writer at a time: the job's tasks run one after
    another, and a job's runs one at a time (its writer lease)."""
    entry = entry_id(owner, job)
    try:
        storage = _storage()
        path = storage.path(dag_id, f"{entry}.json")
        _storage(storage.path(dag_id)).makedirs()
        current = storage.read_json(path) if storage.exists(path) else {}
        if not isinstance(current, dict):
            current = {}
        now = time.time()
        storage.write_json(
            path,
            {
                **current,
                **fields,
                "dag_id": dag_id,
                "owner": owner,
                "job": job,
                "entry": entry,
                "created_at": current.get("created_at", now),
                "updated_at": now,
            },
            durable=False,
        )
        if run is not None:
            run_id, task_id = run
            _storage(storage.path(dag_id, RUNS, run_key(run_id))).makedirs()
            storage.write_json(
                storage.path(dag_id, RUNS, run_key(run_id), f"{task_id}.json"),
                {"entry": entry, "run_id": run_id, "task_id": task_id},
                durable=False,
            )
    except (OSError, ValueError) as err:  # the pages miss this job; training is not stopped for them
        log.warning(
            "The job index could not record job %r of %s (%s): the Training jobs pages miss it",
            job,
            dag_id,
            err,
        )


@contextmanager
def failed_unless_deferred(record_: Callable[..., None]) -> Iterator[None]:
    """Around a task's work: an error records the job as failed (``record_(state="failed", error=...)``);
    a deferral (Airflow's ``TaskDeferred``) is no end."""
    from airflow.sdk.exceptions import TaskDeferred

    try:
        yield
    except TaskDeferred:
        raise
    except BaseException as err:
        record_(state="failed", error=f"{type(err).__name__}: {err}"[:500], ended_at=time.time())
        raise


def list_entries(dag_id: str, root: str | None = None) -> dict[str, float]:
    """``{entry: modified at}`` of a DAG's entries: one listing (one LIST request on s3://), nothing read."""
    storage = _storage(root)
    return {
        name[: -len(".json")]: modified
        for name, modified in storage.listdir_modified(storage.path(dag_id)).items()
        if name.endswith(".json") and ENTRY.fullmatch(name[: -len(".json")])
    }


def list_dags(root: str | None = None) -> list[str]:
    """The DAGs with an entry (their directories' names)."""
    storage = _storage(root)
    return sorted(name for name in storage.listdir(storage.root) if DAG_ID.fullmatch(name))


def read_entry(dag_id: str, entry: str, root: str | None = None) -> dict[str, Any] | None:
    """An entry (None when there is none, or it is not one: a torn write reads as missing)."""
    if not (DAG_ID.fullmatch(dag_id) and ENTRY.fullmatch(entry)):
        return None
    storage = _storage(root)
    path = storage.path(dag_id, f"{entry}.json")
    try:
        found = storage.read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("entry") != entry or found.get("dag_id") != dag_id:
        return None
    return found


def find_task(dag_id: str, run_id: str, task_id: str, root: str | None = None) -> str | None:
    """The entry a task instance ran (None: it ran no training job, or has not yet)."""
    if not (DAG_ID.fullmatch(dag_id) and DAG_ID.fullmatch(task_id)):
        return None
    storage = _storage(root)
    try:
        found = storage.read_json(storage.path(dag_id, RUNS, run_key(run_id), f"{task_id}.json"))
    except (OSError, ValueError):
        return None
    entry = found.get("entry") if isinstance(found, dict) else None
    return entry if isinstance(entry, str) and ENTRY.fullmatch(entry) else None
