"""The budget policy (``decide``) topping an elastic group up with on-demand: spot on the k nodes on offer and
on-demand on the rest, in place of on-demand on all of them (``top_up_on_demand``)."""

from __future__ import annotations

import pytest

from airflow_dtrain.spot.budget import decide
from airflow_dtrain.spot.estimates import Choice
from tests.spot.test_decide_elastic import _inputs

# BASE of test_decide_elastic: 1 h of work on 4 nodes, spot $1, on-demand $3 a node-hour, a 600 s start-up,
# a 90 s resize, $100 left, no interruptions unless a test says so.
RUNNING = dict(min_nodes=2, current=Choice.SPOT, wait_interval_s=900.0, top_up_on_demand=True)


def test_a_group_on_2_spot_nodes_short_of_time_adds_2_on_demand_ones_rather_than_moving_all_4():
    # on 2 of 4 nodes the hour takes 2 h, past a deadline 1.3 h away: on-demand on all 4 would cost $14
    moves = decide(
        _inputs(**{**RUNNING, "top_up_on_demand": False}, spot_nodes_available=2, deadline_s=1.3 * 3600)
    )
    assert moves.choice == Choice.ON_DEMAND and moves.on_demand_cost == pytest.approx(14.0)

    topped = decide(_inputs(**RUNNING, spot_nodes_available=2, deadline_s=1.3 * 3600))

    assert (topped.choice, topped.nodes, topped.on_demand_nodes) == (Choice.SPOT, 4, 2), topped.reason
    # full speed after a 90 s resize; 2 spot + 2 on-demand nodes an hour, and the 2 joining nodes' boot
    assert topped.spot_hours == pytest.approx(1 + 90 / 3600)
    assert topped.spot_cost == pytest.approx((1 + 90 / 3600) * (2 * 1.0 + 2 * 3.0) + 600 / 3600 * 2 * 3.0)
    assert "spot on 2 and on-demand on 2 of 4 node(s)" in topped.reason
    assert topped.to_dict()["on_demand_nodes"] == 2


@pytest.mark.parametrize("current", [Choice.WAIT, None])
def test_a_group_that_does_not_run_yet_starts_on_3_spot_nodes_and_1_on_demand(current):
    # 3 of 4 on offer: on 3 the hour takes 1.33 h, past a deadline 1.2 h away; topped up it takes 1 h
    decision = decide(
        _inputs(**{**RUNNING, "current": current}, spot_nodes_available=3, deadline_s=1.2 * 3600)
    )
    start = 600 / 3600 if current else 0.0
    assert (decision.choice, decision.on_demand_nodes) == (Choice.SPOT, 1), decision.reason
    assert decision.spot_cost == pytest.approx((1 + start) * (3 * 1.0 + 1 * 3.0))


def test_fewer_spot_nodes_than_min_nodes_still_top_up_to_a_group_of_num_nodes():
    decision = decide(_inputs(**RUNNING, spot_nodes_available=1, deadline_s=1.3 * 3600))
    assert (decision.choice, decision.nodes, decision.on_demand_nodes) == (Choice.SPOT, 4, 3), decision.reason


@pytest.mark.parametrize(
    "changes",
    [{"min_nodes": None},  # all or nothing: one capacity
     {"top_up_on_demand": False},
     {"spot_nodes_available": 4},  # every node on spot: no top-up to make (spot is too slow? no: it fits)
     {"spot_nodes_available": 0},
     {"spot_price": 3.0}],  # spot no cheaper than on-demand
)  # fmt: skip
def test_no_top_up_without_an_elastic_group_allowed_to_and_a_cheaper_partial_offer(changes):
    decision = decide(_inputs(**{**RUNNING, "spot_nodes_available": 2, **changes}, deadline_s=1.3 * 3600))
    assert decision.on_demand_nodes == 0, decision.reason


def test_a_top_up_beyond_the_budget_is_not_taken():
    # topped up: $8.20 + $1.00 boot; a cent less is left, and on-demand ($14) is beyond it too
    tight = decide(_inputs(**RUNNING, spot_nodes_available=2, deadline_s=1.3 * 3600, remaining_budget=9.19))
    assert tight.on_demand_nodes == 0 and tight.choice != Choice.ON_DEMAND, tight.reason
    exact = decide(_inputs(**RUNNING, spot_nodes_available=2, deadline_s=1.3 * 3600, remaining_budget=9.2))
    assert exact.on_demand_nodes == 2, exact.reason


def test_the_deadline_guard_tops_up_too():
    # 2 interruptions an hour, 1.5 h to the deadline: on 3 spot nodes one preemption would make it late, so
    # the guard takes on-demand -- on the one node spot cannot give, with a lost spot node costing two resizes
    # after a 30 s wait for a replacement, and its start-up on one of the 4 nodes (estimates.loss_s)
    risky = dict(interruption_rate_per_hour=2.0, spot_nodes_available=3, deadline_s=1.5 * 3600)
    guard = decide(_inputs(**{**RUNNING, "current": Choice.WAIT, "top_up_on_demand": False}, **risky))
    assert guard.choice == Choice.ON_DEMAND and "deadline guard" in guard.reason, guard.reason
    topped = decide(_inputs(**{**RUNNING, "current": Choice.WAIT}, **risky))
    assert (topped.choice, topped.on_demand_nodes) == (Choice.SPOT, 1), topped.reason
    assert topped.spot_hours == pytest.approx(1 * (1 + 2 * (2 * 90 + 30 + 600 / 4) / 3600) + 600 / 3600)


def test_a_topped_up_group_stays_so_without_a_new_resize_until_spot_alone_fits():
    # on 2 spot + 2 on-demand already: no start-up, no boot; not rule 5b's shedding of the on-demand nodes
    stays = decide(_inputs(**RUNNING, topped_up=2, spot_nodes_available=2, deadline_s=1.6 * 3600))
    assert (stays.choice, stays.on_demand_nodes) == (Choice.SPOT, 2), stays.reason
    assert stays.spot_cost == pytest.approx(1.0 * (2 * 1.0 + 2 * 3.0))
    # the other 2 spot nodes are back: spot alone on all 4 fits, and the on-demand nodes may go
    back = decide(_inputs(**RUNNING, topped_up=2, spot_nodes_available=4, deadline_s=1.6 * 3600))
    assert (back.choice, back.nodes, back.on_demand_nodes) == (Choice.SPOT, 4, 0), back.reason


@pytest.mark.parametrize("topped_up", [-1, 4])
def test_a_top_up_of_no_spot_node_at_all_is_refused_naming_the_field(topped_up):
    with pytest.raises(ValueError, match=rf"topped_up: invalid value {topped_up} \(num_nodes 4\)"):
        _inputs(topped_up=topped_up)
