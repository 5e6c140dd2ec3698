"""What an interruption watch decides, without I/O: which notices are new, when the watch is over.

``airflow_dtrain.interruption_watch.InterruptionWatch`` does the looking (the group's launcher,
its instance source, the SQS queue through ``airflow_dtrain.aws.sqs``) and the acting (checkpoint
now, delete the messages); it hands what it saw to a ``WatchState``, which remembers what was
acted on and writes the watch's record.

Single-shot (``follow_relaunches_s`` 0): the first notice ends the watch (its record), and so
does the group's end. Following (``follow_relaunches_s`` > 0, for a watch that runs beside the
training task): every new notice is acted on once and the watch goes on, across the task's
relaunches; it ends when the newest group succeeded, failed or was stopped, or was preempted and
no relaunch appeared within ``follow_relaunches_s`` (nor any group at all within that time of
the start), with the record of every notice handled.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from airflow_dtrain.spot.events import (
    DISRUPTION,
    REBALANCE_RECOMMENDATION,
    SPOT_INTERRUPTION,
    InterruptionNotice,
)

DEFAULT_KINDS = (SPOT_INTERRUPTION, REBALANCE_RECOMMENDATION, DISRUPTION)
"""Every notice that a node is, or may soon be, going away. ``disruption`` matters most on
Karpenter clusters: when Karpenter handles a spot warning itself, the only sign on the node is
its ``karpenter.sh/disrupted`` taint. Scheduled maintenance is days ahead: left out."""


class WatchState:
    """The notices a watch has acted on, and whether it is over.

    :param follow_relaunches_s: 0 for a single-shot watch, else how long to wait for a relaunch.
    """

    def __init__(self, *, follow_relaunches_s: float = 0.0) -> None:
        self.follow_relaunches_s = follow_relaunches_s
        self.handled: list[dict[str, Any]] = []  # notices acted on, as records' "notices"
        self.checkpoint_requested = 0
        self._seen: set[tuple[str, str, str | None]] = set()  # (group, kind, instance or node): a taint stays
        self._started = time.monotonic()
        self._ended_since: dict[str, float] = {}

    def group_gone(self, name: str, status: Any) -> dict[str, Any] | None:
        """Group ``name`` has ended or is not there: the record if the watch ends with it, else None."""
        if not self.follow_relaunches_s:
            if status.state.terminal:
                return self.record(name, status, [])
        elif not self._relaunch_expected(name, status.state):
            return self.record(name, status, self.handled)
        return None

    def fresh(self, name: str, notices: list[InterruptionNotice]) -> list[InterruptionNotice]:
        """The notices not acted on before, now marked as seen."""
        fresh = [n for n in notices if (name, n.kind, n.instance_id or n.node_name) not in self._seen]
        self._seen.update((name, n.kind, n.instance_id or n.node_name) for n in fresh)
        return fresh

    def acted(
        self, name: str, status: Any, fresh: list[InterruptionNotice], asked: int
    ) -> dict[str, Any] | None:
        """``fresh`` were acted on, ``asked`` processes told to checkpoint: the record if the watch ends."""
        self.checkpoint_requested += asked
        handled_at = datetime.now(timezone.utc).isoformat()
        self.handled += [{**n.to_dict(), "group": name, "handled_at": handled_at} for n in fresh]
        if self.follow_relaunches_s:
            return None
        return {**self.record(name, status, [n.to_dict() for n in fresh]), "handled_at": handled_at}

    def _relaunch_expected(self, name: str, state: Any) -> bool:
        """Following: may a (first or next) group still come? Only a preempted group is relaunched."""
        from airflow_dtrain.launchers.base import GroupState

        if state == GroupState.NOT_FOUND:
            since = self._started
        elif state == GroupState.PREEMPTED:
            since = self._ended_since.setdefault(name, time.monotonic())
        else:
            return False
        return time.monotonic() - since < self.follow_relaunches_s

    def record(self, name: str, status: Any, notices: list[dict[str, Any]]) -> dict[str, Any]:
        record = {
            "interrupted": bool(notices),
            "group": name,
            "group_state": status.state.value,
            "notices": notices,
        }
        if notices:
            record["checkpoint_requested"] = self.checkpoint_requested
        return record
