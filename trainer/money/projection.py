"""Projection: what the job will have spent by the time it could be stopped, and what going on needs.

Two readers, one arithmetic. The trainer's cap (``trainer.money.cap.BudgetGuard``) projects, after every
step, the spend to the moment the job could be stopped if it went on: one more step, a blocking save and
the stop reserve (``trainer.money.cap.stop_reserve_s``). The provider, before it relaunches a group, asks
what a relaunch needs to reach its next checkpoint (``relaunch_need``), with the start-up, step and save
times its attempts measured. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_SAVE_GUESS_S = 5.0
"""Seconds a blocking save is assumed to take before one has been timed (then: twice a step, if longer)."""


def stop_reserve_s(save_s: float, grace_period_s: float, stop_margin_s: float) -> float:
    """Seconds of money the bundled trainer keeps back when it decides whether to go on: its own stop (the
    final save and ``cost.stop_margin_s`` for the exit and the node's release), done before the platform's
    budget deadline, which itself comes ``checkpoint.grace_period_s`` and ``cost.stop_margin_s`` before the
    money runs out (``trainer.money.deadline.budget_deadline``: what ends a hung trainer within the budget).
    So a trainer that stops itself is never cut short by the deadline, and a hung one is killed within the
    budget."""
    return (save_s + stop_margin_s) + (grace_period_s + stop_margin_s)


def save_estimate_s(save_s: float | None, step_s: float) -> float:
    """The blocking save to reckon with: the slowest timed, else a guess (``FIRST_SAVE_GUESS_S``, or two
    steps)."""
    return save_s if save_s is not None else max(FIRST_SAVE_GUESS_S, 2 * step_s)


def usd_per_second(nodes: int, *prices: float) -> float:
    """What ``nodes`` nodes cost per second at the dearest of ``prices`` (US$ per node-hour)."""
    return nodes * max(prices) / 3600


@dataclass(frozen=True)
class RelaunchNeed:
    """What a relaunch costs to reach its next checkpoint (``needed``) and to finish the job
    (``to_finish``)."""

    needed: float
    to_finish: float
    usd_per_s: float
    steps_left: int
    interval: int
    step_s: float
    startup_s: float
    save_s: float


def relaunch_need(
    *,
    usd_per_s: float,
    steps_left: int,
    every: int,
    step_s: float,
    startup_s: float,
    save_s: float,
    reserve_s: float,
) -> RelaunchNeed:
    """Dollars a relaunch needs: its start-up, one checkpoint interval (``every`` steps, at most what is left;
    0: the rest of the job) at ``step_s``, and the stop reserve; and the same to the end of the job."""
    interval = min(every or steps_left, steps_left)
    needed = usd_per_s * (startup_s + interval * step_s + reserve_s)
    to_finish = usd_per_s * (startup_s + steps_left * step_s + reserve_s)
    return RelaunchNeed(needed, to_finish, usd_per_s, steps_left, interval, step_s, startup_s, save_s)
