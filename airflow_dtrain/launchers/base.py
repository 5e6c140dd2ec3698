"""The interface every pod-group backend implements.

A pod group is N nodes × P processes, each node one torchrun agent. A backend
can launch a group under a name, find it again by that name (after a worker
restart), report its state, hand out its logs incrementally, and stop it.
Everything here is plain data, so triggers can carry it across processes.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from airflow_dtrain.job.spec import JobSpec


class PredecessorStillRunning(RuntimeError):
    """An earlier group of the same task is still running: launching another would put two writers
    on one checkpoint directory, so the launch is refused (the task fails; a retry looks again)."""


class GroupState(str, enum.Enum):
    """Where a pod group is in its life."""

    PENDING = "pending"
    """Created, not all nodes running yet."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    """Every node exited 0."""
    PREEMPTED = "preempted"
    """A node was preempted or lost; the group can resume from its latest checkpoint."""
    FAILED = "failed"
    """A node failed for another reason; relaunching would fail again."""
    STOPPED = "stopped"
    """Stopped on request (``stop()``, e.g. from ``on_kill``)."""
    AT_BUDGET = "at_budget"
    """Stopped by the platform at the job's dollar cap (``budget_deadline``: on Kubernetes the Job's
    activeDeadlineSeconds, locally the group's supervisor); like a trainer's own stop at the cap (exit 77),
    not relaunched."""
    NOT_FOUND = "not_found"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


DEADLINE_STEP_S = 2
"""The least a running group's budget deadline moves later by (``PodGroupLauncher.move_deadline``)."""

TERMINAL_STATES = frozenset(
    {GroupState.SUCCEEDED, GroupState.PREEMPTED, GroupState.FAILED, GroupState.STOPPED, GroupState.AT_BUDGET}
)


@dataclass(frozen=True)
class GroupStatus:
    name: str
    state: GroupState
    message: str = ""
    node_exit_codes: dict[int, int | None] = field(default_factory=dict)
    """Exit code per node index; None while running or when unknown (negative: killed by that signal)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state.value,
            "message": self.message,
            "node_exit_codes": {str(k): v for k, v in self.node_exit_codes.items()},
        }


@dataclass(frozen=True)
class LogChunk:
    lines: list[str]
    cursor: Any
    """Opaque position to pass to the next ``logs()`` call (JSON-serialisable)."""


class PodGroupLauncher(abc.ABC):
    """Launch, find, watch and stop pod groups on one backend."""

    backend: str

    @abc.abstractmethod
    def launch(self, name: str, spec: JobSpec, *, spent_usd: float = 0.0) -> GroupStatus:
        """Start group ``name`` running ``spec``; raises ValueError if it already exists.

        :param spent_usd: what the job has spent before this group (its spend ledger), for a backend
            that enforces the budget itself (Kubernetes: the Job's activeDeadlineSeconds).
        """

    @abc.abstractmethod
    def find(self, prefix: str) -> list[str]:
        """Names of the groups whose name starts with ``prefix``, oldest first."""

    @abc.abstractmethod
    def status(self, name: str) -> GroupStatus:
        """The group's current state (``NOT_FOUND`` if there is no such group)."""

    @abc.abstractmethod
    def logs(self, name: str, cursor: Any = None) -> LogChunk:
        """Complete log lines produced since ``cursor`` (None: from the start)."""

    @abc.abstractmethod
    def checkpoint_now(self, name: str) -> int:
        """Ask every training process to save at its next step boundary and carry on (SIGUSR1).

        Returns how many processes were asked (0 if the group is not running).
        """

    @abc.abstractmethod
    def stop(self, name: str, grace_period_s: float = 30.0) -> GroupStatus:
        """Ask every process to checkpoint and exit, kill what is left after the grace period."""

    def move_deadline(self, name: str, deadline: dict[str, Any]) -> int | None:
        """Set the platform's budget deadline of running group ``name`` to ``deadline``
        (``repriced_deadline``: earlier when the spot price rose, later when the group spent less than its
        launch deadline assumed). A later one is taken only when it is at least ``DEADLINE_STEP_S`` later
        (``deadline_moves``). Returns the seconds it had, or None when it was not changed (about the same,
        the group ended or gone, no deadline)."""
        return None

    def node_changes(self, name: str) -> list[tuple[float, int]]:
        """The nodes group ``name`` ran over time: (wall-clock time, nodes billed from then on), the first at
        its launch with ``num_nodes``; an elastic group has one more at every resize. [] when the backend does
        not know: bill ``num_nodes`` throughout."""
        return []

    def placement(self, name: str) -> list[dict[str, Any]] | None:
        """Where the group's nodes ran, one dict per node index (``node``, ``zone``, ``instance_type``,
        ``capacity_type``); None when the backend does not know (the local backend: this machine)."""
        return None


def deadline_moves(current: int | None, new: int) -> bool:
    """Whether a running group's budget deadline of ``current`` seconds moves to ``new``: any earlier one, a
    later one by ``DEADLINE_STEP_S`` or more (None: the group has none)."""
    return current is not None and (new < current or new >= current + DEADLINE_STEP_S)


def poll_group(launcher: PodGroupLauncher, name: str, cursor: Any) -> tuple[GroupStatus, LogChunk]:
    """One look at a group: its state, then the log lines since ``cursor``.

    State first: a backend writes the end state only after the last line, so when the
    state is terminal the lines read after it are complete.
    """
    status = launcher.status(name)
    return status, launcher.logs(name, cursor)
