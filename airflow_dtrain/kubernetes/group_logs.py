"""A group's logs: every pod's new lines, ``[nodeN]``-prefixed, and a crashed pod's last lines."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any

from kubernetes.client.exceptions import ApiException

from airflow_dtrain.kubernetes import status as group_status
from airflow_dtrain.kubernetes.api import KubernetesApi
from airflow_dtrain.kubernetes.names import CONTAINER, LABEL_GROUP
from airflow_dtrain.kubernetes.status import pod_index
from airflow_dtrain.launchers.base import LogChunk

# Log lines are fetched from slightly before the last one seen: the kubelet's clock is not ours.
_LOG_OVERLAP_S = 30


def _log_time_ns(stamp: str) -> int:
    """RFC3339Nano (``2026-01-02T03:04:05.123456789Z``) to integer nanoseconds: exact, comparable."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp()
    return int(seconds) * 1_000_000_000 + int((fraction + "000000000")[:9] or 0)


class GroupLogs(KubernetesApi):
    """The launcher's log reads, through ``pods/log``."""

    def _log_tail(self, pod_name: str) -> str | None:
        return self._api(
            self._core.read_namespaced_pod_log, pod_name, self.namespace,
            container=CONTAINER, tail_lines=group_status.TAIL_LINES, missing_ok=True, text=True,
        )  # fmt: skip

    def logs(self, name: str, cursor: Any = None) -> LogChunk:
        """New lines of every pod, ``[nodeN]``-prefixed; the cursor holds, per pod, the last line's time."""
        positions: dict[str, list[int]] = dict(cursor or {})
        lines: list[str] = []
        for pod in self._pods(f"{LABEL_GROUP}={name}"):
            if not group_status.started(pod):
                continue
            pod_name = pod["metadata"]["name"]
            last, seen_at_last = positions.get(pod_name, (-1, 0))
            kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
            if last >= 0:
                kwargs["since_seconds"] = max(1, math.ceil(time.time() - last / 1e9) + _LOG_OVERLAP_S)
            try:
                text = self._api(
                    self._core.read_namespaced_pod_log,
                    pod_name,
                    self.namespace,
                    missing_ok=True,
                    text=True,
                    **kwargs,
                )
            except ApiException as err:
                if err.status == 400:  # the container is not running yet, or no longer exists
                    continue
                raise
            skip = seen_at_last
            new_last, new_seen = last, seen_at_last
            for raw in (text or "").splitlines():
                stamp, _, line = raw.partition(" ")
                try:
                    at = _log_time_ns(stamp)
                except ValueError:
                    continue
                if at < last:
                    continue
                if at == last and skip:
                    skip -= 1
                    continue
                lines.append(f"[node{pod_index(pod)}]{line}")
                new_last, new_seen = (at, new_seen + 1) if at == new_last else (at, 1)
            positions[pod_name] = [new_last, new_seen]
        return LogChunk(lines, positions)
