"""Where the ``local`` backend keeps its groups by default, and each job's compile cache. Its own module
because both ``factory`` (``local_state_dir``) and ``local`` (``LocalLauncher``) need it, and ``factory``
imports ``local``."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

COMPILE_CACHE_DIR = ".compile-cache"
"""Under the state directory: one directory per job (no group name starts with a dot)."""


def default_state_dir() -> Path:
    """``$DTRAIN_LOCAL_STATE_DIR``, else ``$AIRFLOW_HOME/dtrain/groups``."""
    if os.environ.get("DTRAIN_LOCAL_STATE_DIR"):
        return Path(os.environ["DTRAIN_LOCAL_STATE_DIR"])
    airflow_home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(airflow_home) / "dtrain" / "groups"


def compile_cache_env(state_dir: Path, owner: str, job: str) -> dict[str, str]:
    """The variables that give a job's processes a torch.compile cache of its own (inductor's, and Triton's
    kernels within it), made here (mode 0700): the same for every attempt of the job, so that a relaunch
    after a preemption or a resize finds its compiled code and skips the compile; and never another job's.

    Without them every process of a user on this machine shares ``/tmp/torchinductor_<user>``: compiled code
    that one job writes (its own training program included) another job would load and run.
    """
    key = hashlib.sha256(f"{owner}\0{job}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:40]
    cache = state_dir.resolve() / COMPILE_CACHE_DIR / f"{readable}-{key}"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    cache.chmod(0o700)  # mkdir's mode is masked by the umask, and an existing directory keeps its own
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}
