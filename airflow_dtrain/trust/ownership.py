"""What belongs to a job -- its checkpoint directory, spend ledger, leases and registry entries -- belongs to
its owner: ``owner_of`` says who a run acts for, ``check_job_dir`` refuses another owner's or another job's
directory before anything is written there (and claims a new one in its ``owner.json``), ``check_read``
refuses reading another owner's.

Cheap at parse time: the stdlib; Airflow's ``conf`` and the trainer's storage are imported where used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from trainer.checkpoint.directory import OWNER

from airflow_dtrain.errors import SpecError
from airflow_dtrain.trust.roots import conf_json, reserved_roots, within_roots

OWNER_FILE = OWNER
"""At the root of a job's directory: ``{"owner", "job"}`` (``trainer.checkpoint.directory.OWNER``)."""
JOB_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")
"""A job's name: what its checkpoints, ledger and models are found, and owned, by."""


class OwnershipError(SpecError):
    """A run named a job, a directory or a registry entry that is not its owner's."""


def owner_of(context: Any) -> str:
    """Who a run acts for (``owner_for``): its triggering user, mapped to a team by ``[dtrain] owners``
    (``{"users": {user: team}, "dags": {dag_id: team}}``); a scheduled run has no triggering user and acts for
    its DAG's team, else the DAG."""
    # a real context always has both; a bare one (an operator called outside Airflow) acts for nobody in
    # particular
    dag_id = (
        getattr(context.get("ti"), "dag_id", None) or getattr(context.get("dag"), "dag_id", None) or "unowned"
    )
    dag_run = context.get("dag_run")
    user = getattr(dag_run, "triggering_user_name", None) if dag_run is not None else None
    return owner_for(user, dag_id)


OWNERS_DIR = "owners"
"""Below a DAG's default directory (``<root>/checkpoints/<dag>``, ``<root>/models/<dag>``), the jobs of an
owner other than the DAG's own lie under ``owners/<owner_segment(owner)>/``: its default path carries its
owner, so no trigger takes another owner's job first."""
AREAS = {"checkpoints": "checkpoints", "models": "registry", "data": None, "groups": None}
"""The parts of every storage root the provider lays out (``$AIRFLOW_HOME/dtrain`` and the admin's): what a
claim below each may be (None: nothing is ever claimed there: prepared data, the local backend's state)."""
KINDS = ("checkpoints", "registry")
"""What a claim (``owner.json``) records it is: a job's checkpoints (and its ledger), or a registry entry."""
SHARED_READS_OPTION = "[dtrain] shared_reads"


def owner_for(user: str | None, dag_id: str) -> str:
    """Who a run of ``dag_id`` triggered by ``user`` (None: scheduled) acts for: the team ``[dtrain] owners``
    maps the user to, else the DAG's team there, else the user itself (``user:<name>``), else the DAG."""
    owners = conf_json("owners", "users and dags")
    owner = (owners.get("users") or {}).get(user) if user else None
    owner = owner or (owners.get("dags") or {}).get(dag_id) or (f"user:{user}" if user else dag_id)
    if not isinstance(owner, str) or not owner:
        raise SpecError(f"[dtrain] owners: the owner of {user or dag_id!r} is {owner!r}, not a name")
    return owner


def owner_segment(owner: str) -> str:
    """A path segment for an owner, one-to-one: its safe characters and a digest of the whole name."""
    digest = hashlib.sha256(owner.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', owner).strip('-.')[:60]}-{digest}"


def job_key(owner: str, job: str, dag_id: str) -> str:
    """Where ``owner``'s ``job`` lies below a directory of ``dag_id`` (its checkpoints, its registry entry):
    ``<job>`` for the DAG's own owner, ``owners/<owner_segment>/<job>`` for everyone else."""
    if owner == owner_for(None, dag_id):
        return job
    return f"{OWNERS_DIR}/{owner_segment(owner)}/{job}"


def job_dir(root: str, job: str, dag_run: Any, dag: Any) -> str:
    """The default directory of a run's ``job`` below ``root`` (a template macro of the bundled DAGs:
    ``dtrain_job_dir(ROOT, params.job, dag_run, dag)``)."""
    user = getattr(dag_run, "triggering_user_name", None) if dag_run is not None else None
    return f"{str(root).rstrip('/')}/{job_key(owner_for(user, dag.dag_id), str(job), dag.dag_id)}"


def _segments(uri: str) -> tuple[str, list[str]]:
    """(scheme-less form, its path segments) of a path, file:// or s3:// URI, local paths resolved."""
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if "://" not in uri:
        uri = os.path.realpath(uri)
    return uri, [p for p in uri.split("/") if p]


def location_refusal(uri: str, *, owner: str, kind: str) -> str | None:
    """Why ``owner`` may not claim ``uri`` as a ``kind`` directory by where it lies (None: it may): a storage
    root, the state directory or anything above one; an area of a root that holds other things; a DAG's
    default directory itself; another owner's part of it (``owners/<segment>``); a DAG's own jobs."""
    _, parts = _segments(uri)
    reserved = reserved_roots()
    state = reserved[-1]
    for root in reserved:
        _, base = _segments(root)
        if parts[: len(base)] != base and base[: len(parts)] != parts:
            continue
        if len(parts) <= len(base):
            return f"{uri!r} is {'the storage root' if parts == base else 'above the storage root'} {root!r}"
        if root == state:
            return f"{uri!r} lies in the local backend's state directory {root!r}"
        rel = parts[len(base) :]
        area = AREAS.get(rel[0], "")
        if area == "":
            continue  # the admin's or the DAG author's own layout below the root
        if area is None or len(rel) < 3:
            return (
                f"{uri!r} is {root}/{'/'.join(rel)}, a directory the provider keeps for every DAG and owner"
            )
        if area != kind:
            return f"{uri!r} lies in {root}/{rel[0]}, which holds {area} directories, not a job's {kind}"
        dag = rel[1]
        if rel[2] == OWNERS_DIR:
            if len(rel) < 5:
                return f"{uri!r} is {root}/{'/'.join(rel)}, a directory the provider keeps for every owner"
            if rel[3] != owner_segment(owner):
                return (
                    f"{uri!r} lies in {root}/{'/'.join(rel[:4])}, another owner's part of DAG {dag!r}'s "
                    "directory"
                )
        elif owner != owner_for(None, dag):
            return (
                f"{uri!r} lies in DAG {dag!r}'s own jobs (those of {owner_for(None, dag)!r}); {owner!r}'s "
                f"jobs lie in {root}/{'/'.join(rel[:2])}/{OWNERS_DIR}/{owner_segment(owner)}/"
            )
    return None


def shared_reads() -> tuple[str, ...]:
    """``[dtrain] shared_reads``: prefixes (paths, s3://) that any owner may read, e.g. a published model."""
    from airflow.sdk import conf

    raw = conf.get("dtrain", "shared_reads", fallback="") or ""
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def check_read(uri: str | None, *, owner: str, what: str) -> None:
    """Refuse reading ``uri`` when it lies in another owner's claimed directory (a job's checkpoints, a
    registry entry), unless the admin shares it (``[dtrain] shared_reads``). Nothing is read when refused."""
    from trainer.base.storage import Storage

    if not uri or uri == "builtin" or within_roots(uri, shared_reads()):
        return
    claims = [(uri, found)] if (found := _claimed(uri)) is not None else []
    for where, claim in [*claims, *_claims_above(Storage(uri))]:
        if claim.get("owner") != owner:
            raise OwnershipError(
                f"{what}: {uri!r} lies in {where!r}, the {claim.get('kind') or 'checkpoints'} of job "
                f"{claim.get('job')!r} of {claim.get('owner')!r}: a run reads only its owner's directories "
                f"(the platform admin may share one in {SHARED_READS_OPTION}); nothing was read"
            )


def _claimed(uri: str) -> dict[str, Any] | None:
    from trainer.base.storage import Storage

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


def _check_claim(
    recorded: dict[str, Any], uri: str, *, owner: str, job: str | None, what: str, kind: str | None
) -> None:
    """Refuse a claimed directory (its ``owner.json``: ``recorded``) unless it is ``owner``'s, of ``job``
    (or of no job), and of ``kind`` (None: any)."""
    if recorded.get("owner") != owner or (job is not None and recorded.get("job") not in (job, None)):
        raise OwnershipError(
            f"{what}: {uri!r} belongs to job {recorded.get('job')!r} of {recorded.get('owner')!r}, "
            f"not to job {job!r} of {owner!r}: choose another job or directory (nothing was written there)"
        )
    if kind is not None and recorded.get("kind", "checkpoints") != kind:
        raise OwnershipError(
            f"{what}: {uri!r} holds a job's {recorded.get('kind', 'checkpoints')}, not {kind}: refused "
            "(nothing was written there)"
        )


def check_job_dir(
    uri: str,
    *,
    owner: str,
    job: str | None,
    what: str = "checkpoint_uri",
    claim: bool = True,
    kind: str = "checkpoints",
) -> None:
    """Refuse ``uri`` unless it is ``owner``'s directory of ``job`` (``job`` None: any job of ``owner``, e.g.
    a sweep's shared ledger), or a new one; with ``claim``, a new one is claimed (``owner.json``, recording
    its ``kind``) before anything else is written there, and never where ``location_refusal`` says no. A
    directory holding data of no recorded owner is taken only if every checkpoint in it names ``job`` (a
    job's directory from before owners were recorded); without ``claim`` (a read) it is refused only when a
    checkpoint there names another job. A new directory inside a claimed one must be the same owner's, and
    of the same job unless the one above is a shared ledger (a sweep's). Nothing is written when refused."""
    from trainer.checkpoint.directory import CheckpointDir
    from trainer.base.storage import Storage

    if job is not None and not JOB_NAME.fullmatch(job):
        raise OwnershipError(
            f"job: {job!r} is not a job name (lowercase letters, digits, . _ -; not empty): a "
            f"job's checkpoints, ledger and models are found by it"
        )
    if claim and (refusal := location_refusal(uri, owner=owner, kind=kind)) is not None:
        raise OwnershipError(
            f"{what}: {refusal}: refused for job {job!r} of {owner!r} (nothing was written there)"
        )
    recorded = _claimed(uri)
    if recorded is not None:
        _check_claim(recorded, uri, owner=owner, job=job, what=what, kind=kind if claim else None)
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
        body = json.dumps({"owner": owner, "job": job, "kind": kind}, sort_keys=True)
        if not storage.create_exclusive(storage.path(OWNER_FILE), body):
            check_job_dir(
                uri, owner=owner, job=job, what=what, claim=False, kind=kind
            )  # another run claimed it just now


def run_key(run_id: str) -> str:
    """A path segment for a run id, one-to-one: the run id's safe characters and a digest of the whole id, so
    ``manual__2026-01-01T00:00:00+00:00`` and ``manual__2026-01-01T00-00-00-00-00`` never share a
    directory."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', run_id).strip('-.')[:80]}-{digest}"
