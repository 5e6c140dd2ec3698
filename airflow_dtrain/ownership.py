"""What belongs to a job -- its checkpoint directory, spend ledger, leases and registry entries -- belongs to
its
owner: ``owner_of`` says who a run acts for, ``check_job_dir`` refuses another owner's or another job's
directory
before anything is written there (and claims a new one in its ``owner.json``).

Cheap at parse time: the stdlib; Airflow's ``conf`` and the trainer's storage are imported where used.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from trainer.checkpoint_dir import OWNER

from airflow_dtrain.errors import SpecError

__all__ = ["JOB_NAME", "OWNER_FILE", "OwnershipError", "check_job_dir", "owner_of", "run_key"]

OWNER_FILE = OWNER
"""At the root of a job's directory: ``{"owner", "job"}`` (``trainer.checkpoint_dir.OWNER``)."""
JOB_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")
"""A job's name: what its checkpoints, ledger and models are found, and owned, by."""


class OwnershipError(SpecError):
    """A run named a job, a directory or a registry entry that is not its owner's."""


def owner_of(context: Any) -> str:
    """Who a run acts for: ``[dtrain] owners`` (JSON ``{"users": {user: team}, "dags": {dag_id: team}}``) maps
    the user who triggered it, else its DAG, to a team; unmapped, the owner is the DAG itself. A scheduled
    run has
    no triggering user: it acts for the DAG's team."""
    from airflow.sdk import conf

    raw = (conf.get("dtrain", "owners", fallback="") or "").strip()
    try:
        owners = json.loads(raw) if raw else {}
    except ValueError as err:
        raise SpecError(f"[dtrain] owners: not JSON ({err}), got {raw!r}") from None
    # a real context always has both; a bare one (an operator called outside Airflow) acts for nobody in
    # particular
    dag_id = (
        getattr(context.get("ti"), "dag_id", None) or getattr(context.get("dag"), "dag_id", None) or "unowned"
    )
    dag_run = context.get("dag_run")
    user = getattr(dag_run, "triggering_user_name", None) if dag_run is not None else None
    owner = (owners.get("users") or {}).get(user) if user else None
    owner = owner or (owners.get("dags") or {}).get(dag_id) or dag_id
    if not isinstance(owner, str) or not owner:
        raise SpecError(f"[dtrain] owners: the owner of {user or dag_id!r} is {owner!r}, not a name")
    return owner


def _claimed(uri: str) -> dict[str, Any] | None:
    from trainer.storage import Storage

    storage = Storage(uri)
    path = storage.path(OWNER_FILE)
    return storage.read_json(path) if storage.exists(path) else None


def _claims_above(storage: Any) -> list[tuple[str, dict[str, Any]]]:
    """The claimed directories above ``storage``'s root, nearest first: (directory, its owner.json)."""
    root = storage.root
    if storage.remote:
        bucket, _, key = root.removeprefix("s3://").partition("/")
        parts = [p for p in key.split("/") if p]
        parents = [f"s3://{bucket}/{'/'.join(parts[:i])}".rstrip("/") for i in range(len(parts) - 1, -1, -1)]
    else:
        parents = [str(p) for p in Path(root).parents]
    return [(parent, found) for parent in parents if (found := _claimed(parent)) is not None]


def check_job_dir(
    uri: str, *, owner: str, job: str | None, what: str = "checkpoint_uri", claim: bool = True
) -> None:
    """Refuse ``uri`` unless it is ``owner``'s directory of ``job`` (``job`` None: any job of ``owner``, e.g.
    a
    sweep's shared ledger), or a new one; with ``claim``, a new one is claimed (``owner.json``) before
    anything
    else is written there. A directory holding data of no recorded owner is taken only if every checkpoint in
    it
    names ``job`` (a job's directory from before owners were recorded); without ``claim`` (a read) it is
    refused only
    when a checkpoint there names another job. A new directory inside a claimed one must be the same owner's,
    and
    of the same job unless the one above is a shared ledger (a sweep's). Nothing is written when refused."""
    from trainer.checkpoint_dir import CheckpointDir
    from trainer.storage import Storage

    if job is not None and not JOB_NAME.fullmatch(job):
        raise OwnershipError(
            f"job: {job!r} is not a job name (lowercase letters, digits, . _ -; not empty): a "
            f"job's checkpoints, ledger and models are found by it"
        )
    recorded = _claimed(uri)
    if recorded is not None:
        if recorded.get("owner") != owner or (job is not None and recorded.get("job") not in (job, None)):
            raise OwnershipError(
                f"{what}: {uri!r} belongs to job {recorded.get('job')!r} of {recorded.get('owner')!r}, not "
                "to job "
                f"{job!r} of {owner!r}: choose another job or directory (nothing was written there)"
            )
        return
    storage = Storage(uri)
    for parent, above in _claims_above(storage):  # a new directory inside another job's is that job's
        if above.get("owner") != owner or above.get("job") not in (None, job):
            raise OwnershipError(
                f"{what}: {uri!r} lies inside {parent!r}, the directory of job {above.get('job')!r} of "
                f"{above.get('owner')!r}: refused for job {job!r} of {owner!r} (nothing was written there)"
            )
    present = storage.exists(storage.root) and bool(storage.listdir(storage.root))
    if present and (claim or job is not None):  # a read of any job's unclaimed directory is not refused
        jobs = {c.path: CheckpointDir(uri).job_of(c.path) for c in CheckpointDir(uri).committed()}
        # a shared ledger (job None) holds its members' directories, never a checkpoint of its own
        foreign = sorted({j or "(none)" for j in jobs.values() if job is None or j != job})
        if (claim and job is not None and not jobs) or foreign:
            raise OwnershipError(
                f"{what}: {uri!r} already holds data of no recorded owner"
                + (f" (checkpoints of job {', '.join(foreign)})" if foreign else "")
                + f": refused for job {job!r} of {owner!r} (nothing was written there)"
            )
    if claim:
        storage.makedirs()
        body = json.dumps({"owner": owner, "job": job}, sort_keys=True)
        if not storage.create_exclusive(storage.path(OWNER_FILE), body):
            check_job_dir(
                uri, owner=owner, job=job, what=what, claim=False
            )  # another run claimed it just now


def run_key(run_id: str) -> str:
    """A path segment for a run id, one-to-one: the run id's safe characters and a digest of the whole id, so
    ``manual__2026-01-01T00:00:00+00:00`` and ``manual__2026-01-01T00-00-00-00-00`` never share a
    directory."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', run_id).strip('-.')[:80]}-{digest}"
