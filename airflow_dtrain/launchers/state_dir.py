"""Where the ``local`` backend keeps its groups, and each job's compile cache. Its own module because
``factory``, ``local`` (``LocalLauncher``) and ``ownership`` (the state directory is never a job's) need it,
and ``factory`` imports ``local``."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

COMPILE_CACHE_DIR = ".compile-cache"
"""Under the state directory: one directory per job (no group name starts with a dot)."""

COMPILE_CACHE_MAX_AGE_S = 30 * 86400
"""A job's compile cache not launched from for this long is removed at the next launch of any job."""


def default_state_dir() -> Path:
    """``$DTRAIN_LOCAL_STATE_DIR``, else ``$AIRFLOW_HOME/dtrain/groups``."""
    if os.environ.get("DTRAIN_LOCAL_STATE_DIR"):
        return Path(os.environ["DTRAIN_LOCAL_STATE_DIR"])
    airflow_home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(airflow_home) / "dtrain" / "groups"


def local_state_dir(configured: str | None = None) -> Path:
    """The local backend's state directory: ``configured``, else ``[dtrain] local_state_dir``,
    else ``default_state_dir()``."""
    from airflow.sdk import conf

    configured = configured or conf.get("dtrain", "local_state_dir", fallback="")
    return Path(configured) if configured else default_state_dir()


def compile_cache_key(owner: str, job: str) -> str:
    """A job's compile cache directory name: readable, and one owner's job's alone (the local state
    directory's and, on Kubernetes, the subPath of the admin's compile cache volume)."""
    key = hashlib.sha256(f"{owner}\0{job}".encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', job)[:40]}-{key}"


def compile_cache_env(state_dir: Path, owner: str, job: str) -> dict[str, str]:
    """The variables that give a job's processes a torch.compile cache of its own (inductor's, and Triton's
    kernels within it), made here (mode 0700): the same for every attempt of the job, so that a relaunch
    after a preemption or a resize finds its compiled code and skips the compile; and never another job's.

    Without them every process of a user on this machine shares ``/tmp/torchinductor_<user>``: compiled code
    that one job writes (its own training program included) another job would load and run.
    """
    cache = state_dir.resolve() / COMPILE_CACHE_DIR / compile_cache_key(owner, job)
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    cache.chmod(0o700)  # mkdir's mode is masked by the umask, and an existing directory keeps its own
    os.utime(cache)  # launched from now: what prune_compile_caches reads
    prune_compile_caches(cache.parent, keep=cache)
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}


def prune_compile_caches(root: Path, *, keep: Path, max_age_s: float = COMPILE_CACHE_MAX_AGE_S) -> list[Path]:
    """Remove the compile caches under ``root`` that no job has launched from for ``max_age_s`` (their
    directory's mtime, which every launch of the job sets), never ``keep``; returns those removed. A cache
    is only ever a speed-up, so removing one costs its job a compile; what cannot be removed is left."""
    now, removed = time.time(), []
    for entry in root.iterdir():
        try:
            stale = entry.is_dir() and not entry.is_symlink() and now - entry.stat().st_mtime > max_age_s
        except OSError:
            continue
        if stale and entry != keep:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
