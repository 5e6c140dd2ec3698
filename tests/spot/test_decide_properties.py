"""Properties of the budget policy (`decide`) on synthetic inputs: what a group of n nodes needs, waiting
rather than stopping, spot rather than stop, and hysteresis between capacities."""

from __future__ import annotations

import math

import pytest

from airflow_dtrain.spot.budget import decide
from airflow_dtrain.spot.estimates import BudgetInputs, Choice, budget_chance, deadline_chance

# 1,000 steps of 3.6 s: one hour of training.
BASE = dict(steps_remaining=1000, step_time_s=3.6, interruption_rate_per_hour=0.0, restart_overhead_s=600.0)


def test_a_4_node_job_does_not_run_on_spot_while_only_3_nodes_can_be_had():
    inputs = BudgetInputs(**BASE, num_nodes=4, spot_price=1.0, on_demand_price=3.0, remaining_budget=100.0,
                          spot_nodes_available=3)  # fmt: skip
    decision = decide(inputs)
    assert decision.choice == Choice.ON_DEMAND
    assert "only 3 of the 4 spot nodes the group needs at once" in decision.reason
    # the fourth node appears: spot
    assert decide(BudgetInputs(**{**inputs.__dict__, "spot_nodes_available": 4})).choice == Choice.SPOT


def test_it_waits_rather_than_stops_while_the_deadline_allows():
    # No spot now; on-demand is over the budget; a wait of 15 min still leaves time to finish on spot.
    inputs = BudgetInputs(**BASE, num_nodes=2, spot_price=None, on_demand_price=10.0, remaining_budget=5.0,
                          wait_target_price=1.0, max_wait_s=3600, deadline_s=4 * 3600)  # fmt: skip
    assert decide(inputs).choice == Choice.WAIT
    # once the deadline no longer allows a wait: a wait for spot still fits the budget, so with allow_late
    # (the default) it waits past the deadline; without it nothing fits in time and within budget: stop
    late = BudgetInputs(**{**inputs.__dict__, "deadline_s": 3600.0})
    decision = decide(late)
    assert decision.choice == Choice.WAIT and "past the deadline" in decision.reason, decision.reason
    strict = decide(BudgetInputs(**{**late.__dict__, "allow_late": False}))
    assert strict.choice == Choice.STOP and "allow_late is off" in strict.reason


def test_spot_within_budget_wins_over_stop_when_on_demand_is_just_over_it():
    inputs = BudgetInputs(**BASE, num_nodes=1, spot_price=1.0, on_demand_price=3.01, remaining_budget=3.0)
    decision = decide(inputs)
    assert decision.choice == Choice.SPOT, decision.reason
    assert decision.on_demand_cost > 3.0 > decision.spot_cost


def test_a_job_on_on_demand_is_not_charged_a_spot_start_up_and_does_not_switch_for_less():
    # Spot saves $0.05 for the remaining hour; a switch costs 600 s of 1 node at $1.00 = $0.17: stay.
    inputs = BudgetInputs(**BASE, num_nodes=1, spot_price=1.00, on_demand_price=1.05, remaining_budget=10.0,
                          current=Choice.ON_DEMAND)  # fmt: skip
    decision = decide(inputs)
    assert decision.choice == Choice.ON_DEMAND
    assert (
        "stay on on-demand" in decision.reason and decision.on_demand_cost == 1.05 * 1.0
    )  # no start-up in it
    # a saving larger than the start-up is worth the switch
    cheap = BudgetInputs(**{**inputs.__dict__, "spot_price": 0.30})
    assert decide(cheap).choice == Choice.SPOT
    # a job not yet running takes the cheaper spot either way
    assert decide(BudgetInputs(**{**inputs.__dict__, "current": None})).choice == Choice.SPOT


def test_an_idle_job_pays_a_start_up_on_either_capacity_and_a_running_one_not_on_its_own():
    # current=WAIT: nothing runs, both estimates carry 600 s of start-up; on spot, only on-demand does
    idle = decide(BudgetInputs(**BASE, spot_price=1.0, on_demand_price=3.0, current=Choice.WAIT))
    assert idle.choice == Choice.SPOT
    assert idle.spot_cost == 1.0 * (1 + 600 / 3600) and idle.on_demand_cost == 3.0 * (1 + 600 / 3600)
    on_spot = decide(BudgetInputs(**BASE, spot_price=1.0, on_demand_price=3.0, current=Choice.SPOT))
    assert on_spot.spot_cost == 1.0 and on_spot.on_demand_cost == 3.0 * (1 + 600 / 3600)


def test_spot_keeps_time_to_finish_on_on_demand_after_a_preemption_unless_the_risk_is_accepted():
    # 1 h left, 70 min to the deadline: spot fits (1 h 0.6 min), but a preemption would leave 1 h of work
    # and a 10 min start-up: 1 h 10 min, past 70 min with a step lost. So on-demand, which fits.
    inputs = BudgetInputs(
        **{**BASE, "interruption_rate_per_hour": 0.1},
        spot_price=1.0,
        on_demand_price=3.0,
        remaining_budget=10.0,
        lost_work_s=30.0,
        deadline_s=70 * 60,
        current=Choice.SPOT,
    )
    decision = decide(inputs)
    assert decision.choice == Choice.ON_DEMAND, decision.reason
    assert "no time to finish on on-demand after a preemption" in decision.reason
    # a 10 % chance of a preemption in the hour is accepted: spot
    assert decide(BudgetInputs(**{**inputs.__dict__, "max_late_risk": 0.2})).choice == Choice.SPOT
    # on-demand over the budget: no fallback to keep time for, spot
    assert decide(BudgetInputs(**{**inputs.__dict__, "remaining_budget": 3.0})).choice == Choice.SPOT


def test_the_late_risk_is_the_chance_of_a_first_preemption_before_spot_is_done():
    # 1 h of work, nothing runs (600 s start-up), 0.5 preemptions/h, 630 s each: a first preemption within the
    # start-up and the hour has a chance of 1 - e^(-0.5 × 7/6) = 44.2 %. (Over the expected spot hours,
    # 1.254 h, which already hold the later preemptions' time, it would be 46.6 %.) Deadline 1.3 h: spot's
    # 1.254 h fit, a fallback to on-demand after an early preemption (1.342 h) does not. Accepting 45 %: spot;
    # 43 %: on-demand.
    inputs = BudgetInputs(**{**BASE, "interruption_rate_per_hour": 0.5}, spot_price=1.0, on_demand_price=3.0,
                          remaining_budget=10.0, lost_work_s=30.0, deadline_s=1.3 * 3600, current=Choice.WAIT,
                          max_late_risk=0.45)  # fmt: skip
    decision = decide(inputs)
    assert decision.spot_hours == pytest.approx(1 + 0.5 * 630 / 3600 + 1 / 6)
    assert decision.choice == Choice.SPOT, decision.reason
    cautious = decide(BudgetInputs(**{**inputs.__dict__, "max_late_risk": 0.43}))
    assert cautious.choice == Choice.ON_DEMAND, cautious.reason
    assert "no time to finish on on-demand" in cautious.reason, cautious.reason


def test_the_deadline_guard_buys_on_demand_when_a_preemption_is_likelier_than_not_and_would_make_it_late():
    # 1 h of work, nothing runs, 1.3 h to the deadline: 0.30 h to spare, under a spot launch and one
    # preemption (2 x 600 s + 30 s = 0.34 h). 1 preemption/h: a first one before spot is done (7/6 h) has a
    # chance of 69 %. The user accepts any late risk (max_late_risk 1) and any chance of finishing in time
    # (min_finish_chance 0), so spot would do; yet on-demand, in time within budget, is taken.
    inputs = BudgetInputs(**{**BASE, "interruption_rate_per_hour": 1.0}, spot_price=1.0, on_demand_price=3.0,
                          remaining_budget=10.0, lost_work_s=30.0, deadline_s=1.3 * 3600, current=Choice.WAIT,
                          max_late_risk=1.0, min_finish_chance=0.0)  # fmt: skip
    decision = decide(inputs)
    assert decision.choice == Choice.ON_DEMAND, decision.reason
    assert "deadline guard" in decision.reason and "69%" in decision.reason, decision.reason
    assert decide(BudgetInputs(**{**inputs.__dict__, "current": Choice.ON_DEMAND})).choice == Choice.ON_DEMAND

    def spot_when(**change) -> bool:
        return decide(BudgetInputs(**{**inputs.__dict__, **change})).choice == Choice.SPOT

    assert spot_when(interruption_rate_per_hour=0.5)  # 44 %: no likelier than not, the user's risk stands
    assert spot_when(deadline_s=1.4 * 3600)  # 0.40 h to spare: room for a launch and a preemption
    assert spot_when(current=Choice.SPOT)  # a running group is not moved: no launch to bet on
    assert spot_when(
        remaining_budget=3.4
    )  # on-demand ($3.50) over the budget: spot is the only way in budget
    assert spot_when(deadline_guard=False)
    assert spot_when(current=None)  # start-ups not tracked: no launch to weigh


def test_late_within_budget_takes_the_capacity_that_finishes_first():
    # 30 min to the deadline, 1 h of work: nothing is in time. On spot now, on-demand needs a start-up:
    # spot finishes first and is within budget.
    inputs = BudgetInputs(**BASE, spot_price=1.0, on_demand_price=3.0, remaining_budget=10.0, deadline_s=1800,
                          current=Choice.SPOT)  # fmt: skip
    decision = decide(inputs)
    assert (
        decision.choice == Choice.SPOT
        and "past the deadline" in decision.reason
        and "allow_late" in decision.reason
    )
    assert decide(BudgetInputs(**{**inputs.__dict__, "current": Choice.ON_DEMAND})).choice == Choice.ON_DEMAND
    assert decide(BudgetInputs(**{**inputs.__dict__, "allow_late": False})).choice == Choice.STOP


def test_late_either_way_on_demand_is_bought_only_when_it_is_sure_to_finish_first():
    # 30 min to the deadline, 1 h of work, nothing runs (both capacities pay the 600 s start-up): late either
    # way.
    # On-demand finishes at 1 h 10 min for sure, spot at the same time unless preempted (0.5/h: 1 h 10.5 min
    # expected) at a third of the price. Spot: on-demand is not sure to be first.
    inputs = BudgetInputs(**{**BASE, "interruption_rate_per_hour": 0.5}, spot_price=1.0, on_demand_price=3.0,
                          remaining_budget=10.0, deadline_s=1800, lost_work_s=30.0,
                          current=Choice.WAIT)  # fmt: skip
    decision = decide(inputs)
    assert decision.spot_hours > decision.hours + 600 / 3600  # expected spot hours: later than on-demand's
    assert decision.choice == Choice.SPOT and "past the deadline" in decision.reason, decision.reason
    # already on on-demand: no start-up to pay there, so it is sure to finish first; it stays
    stay = decide(BudgetInputs(**{**inputs.__dict__, "current": Choice.ON_DEMAND}))
    assert stay.choice == Choice.ON_DEMAND and "even if spot is never preempted" in stay.reason, stay.reason


def test_min_finish_chance_tries_spot_that_fits_the_budget_unless_the_preemptions_are_unkind():
    # 1 h on 4 nodes at $1/node-h = $4, each preemption costs 330 s of the group = $0.37 more. 2 preemptions
    # per hour expected: the expected spot cost is $4 × (1 + 2 × 330/3600) = $4.73. With $4.50 left it does
    # not fit on expectation, but it fits with up to 1 preemption: a chance of e^-λ (1 + λ), λ = 2 × 1.18 h.
    inputs = BudgetInputs(
        steps_remaining=1000,
        step_time_s=3.6,
        num_nodes=4,
        spot_price=1.0,
        on_demand_price=3.0,
        remaining_budget=4.5,
        interruption_rate_per_hour=2.0,
        restart_overhead_s=300.0,
        lost_work_s=30.0,
    )
    expected = decide(inputs)
    assert (
        expected.choice == Choice.STOP
        and "spot estimate $4.73 exceeds the remaining budget $4.50" in expected.reason
    )
    lam = 2.0 * (1 + 2.0 * 330 / 3600)
    chance = math.exp(-lam) * (1 + lam)
    assert budget_chance(inputs, 1.0, 1.0, 0.0) == pytest.approx(chance)
    tried = decide(BudgetInputs(**{**inputs.__dict__, "min_finish_chance": 0.25}))
    assert chance > 0.25 and tried.choice == Choice.SPOT, tried.reason
    assert f"{chance:.0%} chance of finishing within $4.50" in tried.reason and "budget cap" in tried.reason
    # asking for more certainty than the draws give: not spot, and the reason names the chance
    strict = decide(BudgetInputs(**{**inputs.__dict__, "min_finish_chance": 0.5}))
    assert strict.choice == Choice.STOP
    assert f"with a chance of {chance:.0%}, below min_finish_chance 50%" in strict.reason
    # a budget below even the luckiest run (no preemption at all): no chance, whatever the threshold
    broke = BudgetInputs(**{**inputs.__dict__, "remaining_budget": 3.99, "min_finish_chance": 0.0001})
    assert budget_chance(broke, 1.0, 1.0, 0.0) == 0.0 and decide(broke).choice == Choice.STOP


def test_min_finish_chance_also_judges_a_wait_for_spot():
    # no spot now; a wait for spot at $1 would fit on luck (not on expectation); on-demand is over the budget
    inputs = BudgetInputs(
        steps_remaining=1000,
        step_time_s=3.6,
        num_nodes=4,
        spot_price=None,
        on_demand_price=3.0,
        remaining_budget=4.5,
        interruption_rate_per_hour=2.0,
        restart_overhead_s=300.0,
        lost_work_s=30.0,
        max_wait_s=3600,
        wait_target_price=1.0,
    )
    assert decide(inputs).choice == Choice.STOP
    assert decide(BudgetInputs(**{**inputs.__dict__, "min_finish_chance": 0.25})).choice == Choice.WAIT


def test_min_finish_chance_judges_the_deadline_by_the_chance_of_the_preemptions_fitting_before_it():
    # 1 h of work, 2 preemptions/h expected at 330 s each: the expected spot time, 1 h 11 min, is past the
    # deadline (1 h 7 min), so on-demand; yet one preemption fits before it: a chance of e^-λ (1 + λ)
    inputs = BudgetInputs(
        steps_remaining=1000,
        step_time_s=3.6,
        num_nodes=1,
        spot_price=1.0,
        on_demand_price=3.0,
        remaining_budget=100.0,
        interruption_rate_per_hour=2.0,
        restart_overhead_s=300.0,
        lost_work_s=30.0,
        deadline_s=3600 + 330 + 100,
    )
    assert decide(inputs).choice == Choice.ON_DEMAND
    lam = 2.0 * (1 + 2.0 * 330 / 3600)
    chance = math.exp(-lam) * (1 + lam)
    assert deadline_chance(inputs, 1.0, 0.0) == pytest.approx(chance)
    assert decide(BudgetInputs(**{**inputs.__dict__, "min_finish_chance": 0.25})).choice == Choice.SPOT
    strict = decide(BudgetInputs(**{**inputs.__dict__, "min_finish_chance": 0.5}))
    assert strict.choice == Choice.ON_DEMAND
    assert (
        f"spot finishes by the deadline with a chance of {chance:.0%}, below min_finish_chance 50%"
        in strict.reason
    )
    # no time even for the work itself: no chance, so spot is not in time even at a threshold of 0; late
    # either way, and on-demand would finish no earlier than an unpreempted spot run: spot, past the deadline
    late = BudgetInputs(**{**inputs.__dict__, "deadline_s": 3500.0, "min_finish_chance": 0.0})
    assert deadline_chance(late, 1.0, 0.0) == 0.0
    decision = decide(late)
    assert decision.choice == Choice.SPOT and "past the deadline" in decision.reason, decision.reason
    assert decide(BudgetInputs(**{**late.__dict__, "allow_late": False})).choice == Choice.STOP


def test_with_min_finish_chance_a_late_choice_states_its_chance_not_an_estimate_over_the_budget():
    # No deadline can be met; spot's expected cost ($4.73) is over the $4.50 left, but a 32 % chance is
    # enough: late on spot, and the reason gives the chance rather than claiming $4.73 is within $4.50
    inputs = BudgetInputs(
        steps_remaining=1000,
        step_time_s=3.6,
        num_nodes=4,
        spot_price=1.0,
        on_demand_price=3.0,
        remaining_budget=4.5,
        interruption_rate_per_hour=2.0,
        restart_overhead_s=300.0,
        lost_work_s=30.0,
        deadline_s=1800.0,
        min_finish_chance=0.25,
    )
    decision = decide(inputs)
    assert decision.choice == Choice.SPOT and "past the deadline" in decision.reason, decision.reason
    assert "allow_late: a 32% chance within $4.50" in decision.reason
    assert "$4.73 within" not in decision.reason
    # the same with no spot now and a wait for it: the wait's reason gives its chance too
    wait = decide(
        BudgetInputs(**{**inputs.__dict__, "spot_price": None, "max_wait_s": 3600, "wait_target_price": 1.0})
    )
    assert wait.choice == Choice.WAIT and "allow_late: a 32% chance within $4.50" in wait.reason, wait.reason


def test_a_job_on_on_demand_does_not_stop_it_to_wait_for_spot_that_would_be_late():
    # 1 h left, 1.5 h to the deadline, no spot offer now; spot at the hoped-for price after a 15 min wait
    # would take 1.75 h with its start-up and 2 preemptions an hour: late. On-demand after the wait would
    # still be in time, but a job on on-demand has that now: it stays, rather than pay a second start-up. An
    # idle job loses nothing by the wait, and waits.
    inputs = BudgetInputs(**{**BASE, "interruption_rate_per_hour": 2.0}, num_nodes=2, spot_price=None,
                          on_demand_price=3.0, remaining_budget=100.0, wait_target_price=1.0, max_wait_s=3600,
                          deadline_s=1.5 * 3600, current=Choice.ON_DEMAND)  # fmt: skip
    stays = decide(inputs)
    assert stays.choice == Choice.ON_DEMAND and "no acceptable spot offer" in stays.reason, stays.reason
    idle = decide(BudgetInputs(**{**inputs.__dict__, "current": Choice.WAIT}))
    assert idle.choice == Choice.WAIT, idle.reason
