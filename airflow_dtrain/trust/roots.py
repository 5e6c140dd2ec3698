"""Where a deployment keeps its jobs: the storage roots the platform admin sets, the local backend's own
directory, and whether a path lies under one of them.

Below ``trust`` and ``ownership``, which both need it (the admin's limits are bounded by these roots; the
roots and the areas below them are never claimed as a job's directory). Cheap at parse time: the stdlib;
Airflow's ``conf`` is imported where used.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow_dtrain.errors import SpecError


def conf_json(option: str, what: str) -> dict[str, Any]:
    """The ``[dtrain] <option>`` JSON object ({} when unset); a bad value raises naming the option."""
    from airflow.sdk import conf

    raw = (conf.get("dtrain", option, fallback="") or "").strip()
    try:
        value = json.loads(raw) if raw else {}
    except ValueError as err:
        raise SpecError(f"[dtrain] {option}: not JSON ({err}), got {raw!r}") from None
    if not isinstance(value, dict):
        raise SpecError(f"[dtrain] {option}: expected a JSON object of {what}, got {raw!r}")
    return value


def local_root() -> str:
    """The local backend's own directory: checkpoints, data, registry and groups of the bundled DAGs."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return os.path.join(home, "dtrain")


def storage_roots(listed: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every root jobs may be kept under: the local backend's own directory, the parent of ``[dtrain]
    local_state_dir``, ``listed`` (``[dtrain] limits``' ``storage_roots``) and ``[dtrain] storage_roots``."""
    from airflow.sdk import conf

    configured = (conf.get("dtrain", "storage_roots", fallback="") or "").split(",")
    state = conf.get("dtrain", "local_state_dir", fallback="") or ""
    return [
        local_root(),
        *([os.path.dirname(state.rstrip("/"))] if state else []),
        *listed,
        *(r.strip() for r in configured if r.strip()),
    ]


def reserved_roots() -> list[str]:
    """The roots no job may claim, nor anything above them: every storage root, and last the local backend's
    state directory (its groups)."""
    from airflow_dtrain.launchers.state_dir import local_state_dir

    listed = conf_json("limits", "limits").get("storage_roots") or []
    return [*storage_roots(listed if isinstance(listed, list) else []), str(local_state_dir())]


def within_roots(uri: str, roots: tuple[str, ...] | list[str]) -> bool:
    """``uri`` (a path, file:// or s3://) lies under one of ``roots``; a local path is normalised first
    (``..``, symbolic links), so it cannot climb out. The root ``s3://`` alone allows every bucket."""

    def local(u: str) -> str | None:
        if u.startswith("file://"):
            u = u[len("file://") :]
        return os.path.realpath(u) if "://" not in u else None

    path = local(uri)
    for root in roots:
        base = local(root)
        if path is not None and base is not None:
            if path == base or path.startswith(base.rstrip("/") + "/"):
                return True
        elif path is None and base is None and ".." not in uri.split("/"):
            if root == "s3://" and uri.startswith("s3://"):
                return True
            if (uri.rstrip("/") + "/").startswith(root.rstrip("/") + "/"):
                return True
    return False
