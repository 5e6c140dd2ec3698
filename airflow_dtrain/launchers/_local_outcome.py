"""How a local group ended: its state and message from its nodes' exit codes and what its supervisor saw
(the budget deadline it stopped the group at, a node that ran out of its memory limit)."""

from __future__ import annotations

import signal
from typing import Any

from airflow_dtrain.launchers.base import GroupState

from trainer.config.job_config import (
    PREEMPTED_EXIT_CODE,
    BUDGET_EXIT_CODE,
    FENCED_EXIT_CODE,
    STORAGE_EXIT_CODE,
)

from trainer.money.deadline import deadline_words


def classify(codes: dict[int, int], collateral: set[int], stopped: bool) -> tuple[GroupState, str]:
    """Turn node exit codes into a group state.

    ``collateral`` are nodes this supervisor killed because a peer had already
    ended: their exit codes say nothing about the cause.
    """
    if stopped:
        return GroupState.STOPPED, "stopped on request"
    if all(code == 0 for code in codes.values()):
        return GroupState.SUCCEEDED, "all nodes exited 0"
    own = {i: c for i, c in codes.items() if i not in collateral and c != 0}
    for i, code in sorted(own.items()):
        if code == FENCED_EXIT_CODE:
            return GroupState.FAILED, (
                f"node {i} exited {code}: another group took over the checkpoint directory "
                "(a newer writer lease); this group stopped without committing"
            )
    for i, code in sorted(own.items()):
        if code == STORAGE_EXIT_CODE:
            return GroupState.FAILED, (
                f"node {i} exited {code}: a checkpoint could not be written (a full disk, no "
                "permission or a read-only location; the [trainer] line in the log names the "
                "path and the cause); the older checkpoints are intact"
            )
    for i, code in sorted(own.items()):
        if code == PREEMPTED_EXIT_CODE:
            return GroupState.PREEMPTED, f"node {i} exited {code} (preempted, resumable)"
    for i, code in sorted(own.items()):
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            return GroupState.PREEMPTED, f"node {i} was killed by {name} (node lost; resumable)"
    for i, code in sorted(own.items()):
        if code == BUDGET_EXIT_CODE:
            return (
                GroupState.FAILED,
                f"node {i} exited {code} (stopped at the job's dollar cap, checkpoint saved)",
            )
    if own:
        i, code = sorted(own.items())[0]
        return GroupState.FAILED, f"node {i} exited {code}"
    return GroupState.FAILED, "nodes were stopped after a peer ended"


def outcome(watch: Any, codes: dict[int, int], ran_out: str | None) -> tuple[GroupState, str]:
    """The group's end state and message: from its exit codes (``classify``), then what explains them better:
    a node that ran out of its memory limit, the budget deadline the supervisor stopped it at."""
    stopped = watch.stop_requested.is_set()
    judged = codes if watch.elastic is None else watch.elastic.judged(codes)
    state, message = classify(judged, watch.collateral, stopped)
    if (ran_out and not stopped and not watch.at_budget
            and state in (GroupState.FAILED, GroupState.PREEMPTED)
            and not {FENCED_EXIT_CODE, STORAGE_EXIT_CODE} & set(codes.values())):  # fmt: skip
        # its peers then failed in a collective, were stopped by their agent or by us: not the cause
        state, message = GroupState.FAILED, ran_out
    if not watch.at_budget or stopped or state == GroupState.SUCCEEDED:
        return state, message
    budget = watch.budget
    if watch.collateral:  # still running at the end of the grace period (a hung trainer): SIGKILL
        how = (f"SIGTERM, then SIGKILL after the {budget['grace_s']}s grace period to node(s) "
               f"{', '.join(map(str, sorted(watch.collateral)))}, still running: what they trained since "
               f"their last checkpoint is lost")  # fmt: skip
    else:
        how = "SIGTERM: each rank saved its step within the grace period"
    return GroupState.AT_BUDGET, (
        f"stopped at the job's dollar cap by its supervisor: the group reached its "
        f"{deadline_words(budget, 'deadline')} ({how}); {message}"
    )
