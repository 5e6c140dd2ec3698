"""Where the ``local`` backend keeps its groups by default. Its own module because both ``factory``
(``local_state_dir``) and ``local`` (``LocalLauncher``) need it, and ``factory`` imports ``local``."""

from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> Path:
    """``$DTRAIN_LOCAL_STATE_DIR``, else ``$AIRFLOW_HOME/dtrain/groups``."""
    if os.environ.get("DTRAIN_LOCAL_STATE_DIR"):
        return Path(os.environ["DTRAIN_LOCAL_STATE_DIR"])
    airflow_home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(airflow_home) / "dtrain" / "groups"
