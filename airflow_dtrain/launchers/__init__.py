"""Pod-group backends: ``local`` (processes on this machine); Kubernetes comes later."""

from __future__ import annotations

from airflow_dtrain.launchers.base import (
    PREEMPTED_EXIT_CODE,
    GroupState,
    GroupStatus,
    LogChunk,
    PodGroupLauncher,
    get_launcher,
    launcher_kwargs,
    local_state_dir,
    relaunches,
)

__all__ = ["PREEMPTED_EXIT_CODE", "GroupState", "GroupStatus", "LogChunk", "PodGroupLauncher", "get_launcher", "launcher_kwargs",
           "local_state_dir", "relaunches"]
