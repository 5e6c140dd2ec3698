"""The interface every pod-group backend implements.

A pod group is N nodes × P processes, each node one torchrun agent. A backend
can launch a group under a name, find it again by that name (after a worker
restart), report its state, hand out its logs incrementally, and stop it.
Everything here is plain data, so triggers can carry it across processes.
"""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainer.config import PREEMPTED_EXIT_CODE

if TYPE_CHECKING:
    from airflow_dtrain.spec import JobSpec

__all__ = [
    "PREEMPTED_EXIT_CODE", "GroupState", "GroupStatus", "LogChunk", "PodGroupLauncher", "PredecessorStillRunning",
    "budget_deadline", "deadline_words", "poll_group", "repriced_deadline",
]  # fmt: skip


def budget_deadline(spec: JobSpec, spent_usd: float = 0.0) -> dict[str, Any] | None:
    """When the platform stops a group at the job's dollar cap, in seconds after its launch, and how (None: no
    budget, or no price: nothing billed). Kubernetes makes it the Job's ``activeDeadlineSeconds``; the local
    backend's supervisor keeps it. Either stops the group with SIGTERM (each rank saves its step) and, after the
    grace period, SIGKILL, even with nobody on the Airflow side watching.

    The money left, (budget - ``spent_usd``) / (price per node-hour x nodes), buys ``left_s`` seconds. The
    deadline comes the grace period and ``cost.stop_margin_s`` before them, so that even a group that ignores
    SIGTERM (a hung trainer, a program of your own) is killed, and its end seen, within the budget: the money is
    a hard limit, not a target. The bundled trainer keeps the same reserve (``trainer.cost.stop_reserve_s``) and
    stops itself, exit 77, just before this deadline; the deadline is the backstop for when it cannot. On
    Kubernetes the kubelet allows the pods 15 s more than the grace period (``termination_grace_period_s``):
    within the budget while ``cost.stop_margin_s`` is at least that (default 30).

    The job's ``max_runtime_s`` (the limits' ceiling, set even without a budget) bounds it too: the earlier of the
    two wins, and the result then says so (``"by": "max_runtime_s"``), with ``budget_usd`` None when there is none.

    :param spent_usd: what the job has spent before this group (its spend ledger).
    """
    grace, margin = math.ceil(spec.train.checkpoint.grace_period_s), math.ceil(spec.train.cost.stop_margin_s)
    by_budget = None
    if spec.budget_usd and spec.price_per_node_hour > 0:
        by_budget = _deadline(budget_usd=spec.budget_usd, spent_usd=spent_usd, nodes=spec.num_nodes,
                              price=spec.price_per_node_hour, grace=grace, margin=margin)  # fmt: skip
    runtime = getattr(spec, "max_runtime_s", None)
    if runtime is None or (by_budget is not None and by_budget["seconds"] <= runtime):
        return by_budget
    return {
        **(by_budget or {"budget_usd": None, "spent_usd": round(spent_usd, 6), "nodes": spec.num_nodes,
                         "usd_per_hour": spec.price_per_node_hour * spec.num_nodes, "grace_s": grace,
                         "margin_s": margin, "save": "within"}),
        "seconds": int(runtime), "by": "max_runtime_s",
    }  # fmt: skip


def _deadline(
    *,
    budget_usd: float,
    spent_usd: float,
    nodes: int,
    price: float,
    grace: int,
    margin: int,
    elapsed_s: float = 0.0,
) -> dict[str, Any]:
    """``budget_deadline``'s arithmetic, ``elapsed_s`` into the group's life: the seconds after its launch."""
    usd_per_hour = price * nodes
    left_s = max(0.0, budget_usd - spent_usd) / usd_per_hour * 3600
    return {
        "seconds": max(1, math.floor(elapsed_s + left_s) - grace - margin), "budget_usd": budget_usd,
        "spent_usd": round(spent_usd, 6), "nodes": nodes, "usd_per_hour": usd_per_hour, "grace_s": grace,
        "margin_s": margin, "save": "within",
    }  # fmt: skip


def repriced_deadline(
    deadline: dict[str, Any], *, spent_usd: float, price: float, elapsed_s: float
) -> dict[str, Any]:
    """A running group's ``budget_deadline`` again, ``elapsed_s`` after its launch, with the spot price in effect
    now: ``spent_usd`` (every attempt, this group's seconds so far at the prices in effect) leaves money that
    buys fewer seconds at ``price`` than at the launch price when the price has risen. The result says what
    it was derived from (``repriced``), for the deadline's words and the Job's annotation."""
    if not deadline.get("budget_usd"):
        return deadline  # bound by max_runtime_s alone: no price moves it
    new = _deadline(budget_usd=deadline["budget_usd"], spent_usd=spent_usd, nodes=int(deadline["nodes"]), price=price,
                    grace=deadline["grace_s"], margin=deadline["margin_s"], elapsed_s=elapsed_s)  # fmt: skip
    if deadline.get("by") == "max_runtime_s" and new["seconds"] >= deadline["seconds"]:
        return deadline  # the runtime ceiling is still the earlier
    return {**new, "repriced": {"elapsed_s": round(elapsed_s, 3)}}


def deadline_words(deadline: dict[str, Any], name: str) -> str:
    """``budget_deadline``'s result for a person: ``name=seconds`` and how the money left gave it."""
    if deadline.get("by") == "max_runtime_s":
        return (
            f"{name}={deadline['seconds']} (the job's max_runtime_s ceiling"
            + (", before its budget's" if deadline.get("budget_usd") else ", no budget")
            + ")"
        )
    left = max(0.0, deadline["budget_usd"] - deadline["spent_usd"])
    save = f"less {deadline['grace_s']}s for a final save and {deadline.get('margin_s', 0)}s to exit"
    repriced = deadline.get("repriced")
    if repriced:
        return (
            f"{name}={deadline['seconds']} (set {repriced['elapsed_s']:.0f}s after the launch, when ${left:.4f} was "
            f"left of the ${deadline['budget_usd']:.2f} budget at the spot price then in effect, "
            f"${deadline['usd_per_hour']:.4f}/h, {save})"
        )
    return (
        f"{name}={deadline['seconds']} (${left:.4f} left of the ${deadline['budget_usd']:.2f} budget at "
        f"${deadline['usd_per_hour']:.4f}/h, {save})"
    )


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

    def shorten_deadline(self, name: str, deadline: dict[str, Any]) -> int | None:
        """Bring the platform's budget deadline of running group ``name`` forward to ``deadline``
        (``repriced_deadline``: the spot price rose since its launch); never later than it is. Returns the
        seconds it had, or None when it was not changed (already as early, the group gone, no deadline)."""
        return None

    def placement(self, name: str) -> list[dict[str, Any]] | None:
        """Where the group's nodes ran, one dict per node index (``node``, ``zone``, ``instance_type``,
        ``capacity_type``); None when the backend does not know (the local backend: this machine)."""
        return None


def poll_group(launcher: PodGroupLauncher, name: str, cursor: Any) -> tuple[GroupStatus, LogChunk]:
    """One look at a group: its state, then the log lines since ``cursor``.

    State first: a backend writes the end state only after the last line, so when the
    state is terminal the lines read after it are complete.
    """
    status = launcher.status(name)
    return status, launcher.logs(name, cursor)
