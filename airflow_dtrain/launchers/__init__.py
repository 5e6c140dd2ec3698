"""Pod-group backends: ``local`` (processes on this machine) and ``kubernetes`` (an Indexed Job).

``base`` is the interface, ``factory`` picks a backend (importing it only then), ``torchrun``
builds the command every node runs. Nothing here imports a backend at import time.
"""

from __future__ import annotations

from airflow_dtrain.launchers.base import (
    GroupState,
    GroupStatus,
    LogChunk,
    PodGroupLauncher,
    PredecessorStillRunning,
    poll_group,
)

from airflow_dtrain.launchers.factory import get_launcher, launcher_kwargs, relaunches
from airflow_dtrain.launchers.state_dir import local_state_dir

__all__ = [
    "GroupState",
    "GroupStatus",
    "LogChunk",
    "PodGroupLauncher",
    "PredecessorStillRunning",
    "get_launcher",
    "launcher_kwargs",
    "local_state_dir",
    "poll_group",
    "relaunches",
]
