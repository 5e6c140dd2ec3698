"""The budget policy (``decide``) on elastic groups: spot on k of N nodes, its time at k, the price of a
resize, and the budget cap held at every size the group may change to."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_dtrain.spot.budget import decide
from airflow_dtrain.spot.estimates import BudgetInputs, Choice

# 1,000 steps of 3.6 s: one hour on all 4 nodes. No interruptions unless a test says so, so every figure
# below is exact: spot $1/node-h, on-demand $3/node-h, a 600 s start-up, a 90 s resize, and (the JobSpec's
# default replace_timeout_s) 30 s waited for a lost node's replacement.
BASE = dict(steps_remaining=1000, step_time_s=3.6, num_nodes=4, spot_price=1.0, on_demand_price=3.0,
            interruption_rate_per_hour=0.0, restart_overhead_s=600.0, resize_overhead_s=90.0,
            remaining_budget=100.0)  # fmt: skip


def _inputs(**changes) -> BudgetInputs:
    return BudgetInputs(**{**BASE, **changes})


def test_an_elastic_group_trains_on_the_3_spot_nodes_it_can_get_for_4_thirds_of_the_time():
    all_or_nothing = decide(_inputs(spot_nodes_available=3))
    assert all_or_nothing.choice == Choice.ON_DEMAND and all_or_nothing.nodes == 4
    assert "only 3 of the 4 spot nodes the group needs at once" in all_or_nothing.reason

    elastic = decide(_inputs(spot_nodes_available=3, min_nodes=2))

    assert elastic.choice == Choice.SPOT and elastic.nodes == 3
    assert "on 3 of them now" in elastic.reason, elastic.reason
    # the global batch is fixed: 1 h of work on 4 nodes is 4/3 h on 3, then one resize to grow back
    assert elastic.spot_hours == pytest.approx(4 / 3 + 90 / 3600)
    # the work is 4 node-hours at any size; the resize is billed on all 4 nodes (the worst case)
    assert elastic.spot_cost == pytest.approx((4 * 1.0 + 4 * 90 / 3600) * 1.0)


def test_with_all_its_nodes_on_offer_an_elastic_group_is_told_as_an_all_or_nothing_one():
    elastic = decide(_inputs(spot_nodes_available=4, min_nodes=2))
    plain = decide(_inputs(spot_nodes_available=4))
    assert (elastic.choice, elastic.nodes, elastic.spot_cost, elastic.spot_hours) == (
        plain.choice, plain.nodes, plain.spot_cost, plain.spot_hours
    )  # fmt: skip


@pytest.mark.parametrize(("have", "least"), [(1, 2), (2, 3), (0, 1)])
def test_fewer_spot_nodes_than_min_nodes_is_no_spot_and_the_reason_names_the_fields(have, least):
    decision = decide(_inputs(spot_nodes_available=have, min_nodes=least))
    assert decision.choice == Choice.ON_DEMAND and decision.nodes == 4
    assert f"spot_nodes_available {have} is below min_nodes {least}" in decision.reason


def test_a_lost_node_of_an_elastic_group_costs_two_resizes_and_a_nodes_start_up_not_a_relaunch():
    # 2 interruptions an hour: all or nothing each costs a 600 s relaunch of the group and the 30 s step lost;
    # elastic the survivors' 90 s resize after their 30 s wait for a replacement, the step, the replacement's
    # 600 s start-up on 1 of the 4 nodes (the others train on) and a second 90 s resize when it joins:
    # 90 + 30 + 30 + 150 + 90 = 390 s of the group's time
    risky = dict(interruption_rate_per_hour=2.0, lost_work_s=30.0)
    plain = decide(_inputs(**risky))
    elastic = decide(_inputs(**risky, min_nodes=2))
    assert plain.spot_hours == pytest.approx(1 + 2 * 630 / 3600)
    assert elastic.spot_hours == pytest.approx(1 + 2 * 390 / 3600)
    no_wait = decide(_inputs(**risky, min_nodes=2, replace_timeout_s=0.0))  # the wait is counted
    assert no_wait.spot_hours == pytest.approx(1 + 2 * 360 / 3600)
    assert elastic.spot_cost < plain.spot_cost


def test_the_interruption_limit_counts_an_elastic_groups_lost_node_at_what_it_costs():
    # the DAG's limit: at most 0.5 relaunches an hour; 0.8 lost nodes an hour, each 390 s of the group's time
    # (above), are 0.8 x 390 / 630 = 0.495 relaunches' worth of time an hour
    risky = dict(interruption_rate_per_hour=0.8, lost_work_s=30.0, max_interruption_rate_per_hour=0.5)
    plain = decide(_inputs(**risky))
    assert plain.choice == Choice.ON_DEMAND
    assert "interruption risk 0.800/h above 0.500/h" in plain.reason, plain.reason
    assert decide(_inputs(**risky, min_nodes=2)).choice == Choice.SPOT

    frequent = decide(_inputs(**{**risky, "interruption_rate_per_hour": 1.0}, min_nodes=2))  # 0.62 an hour
    assert frequent.choice == Choice.ON_DEMAND
    assert "interruption risk 1.000/h (a lost node costs 0.62 of a relaunch: 0.619 relaunches/h) above " in (
        frequent.reason
    ), frequent.reason


@pytest.mark.parametrize("have", [2, 3, 4, 5])
@pytest.mark.parametrize("risk", [0.0, 1.5])
def test_the_cap_holds_at_every_size_the_group_may_run_at(have, risk):
    """Whatever size it starts at and whenever it grows back (or not), the most a group can bill without
    interruptions is within the estimate it was admitted on; a budget a cent below that estimate is not
    spot."""
    inputs = _inputs(spot_nodes_available=have, min_nodes=2, interruption_rate_per_hour=risk)
    decision = decide(inputs)
    assert decision.choice == Choice.SPOT and decision.nodes == min(4, have)
    k, work_node_h = decision.nodes, 4 * 1.0  # the work is the same node-hours at any size
    for grown_after in (0.0, 0.25, 0.5, 1.0):  # the share of the work done at k before it grows to 4
        bill = work_node_h + (k < 4 and grown_after < 1.0) * 4 * 90 / 3600  # a resize on all 4 nodes
        assert bill * inputs.spot_price <= decision.spot_cost + 1e-9
    tight = decide(dataclasses.replace(inputs, remaining_budget=decision.spot_cost - 0.01))
    assert tight.choice != Choice.SPOT, tight.reason
    exact = decide(dataclasses.replace(inputs, remaining_budget=decision.spot_cost))
    assert exact.choice == Choice.SPOT


def test_the_time_at_k_nodes_decides_the_deadline():
    # 1 h of work on 4 nodes, 1.5 h to the deadline: on 3 nodes (1.36 h) in time, on 2 (2.02 h) not
    in_time = decide(_inputs(spot_nodes_available=3, min_nodes=2, deadline_s=1.5 * 3600))
    assert in_time.choice == Choice.SPOT and in_time.nodes == 3
    too_slow = decide(_inputs(spot_nodes_available=2, min_nodes=2, deadline_s=1.5 * 3600))
    assert too_slow.choice == Choice.ON_DEMAND and too_slow.nodes == 4
    assert "spot would take 2.02 h" in too_slow.reason


def test_a_min_nodes_above_num_nodes_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"min_nodes: invalid value 5 \(num_nodes 4\)"):
        _inputs(min_nodes=5)
    with pytest.raises(ValueError, match="resize_overhead_s: invalid value -1"):
        _inputs(resize_overhead_s=-1)
    with pytest.raises(ValueError, match="replace_timeout_s: invalid value -1"):
        _inputs(replace_timeout_s=-1)


def test_the_decision_records_its_node_count():
    assert decide(_inputs(min_nodes=2, spot_nodes_available=3)).to_dict()["nodes"] == 3
    assert decide(_inputs(steps_remaining=0)).nodes is None  # stop: nothing runs


def test_the_branch_takes_min_nodes_and_trains_an_elastic_group_on_the_spot_nodes_it_can_get(tmp_path):
    from tests.spot.test_budget import _TI, _branch

    kwargs = dict(checkpoint_uri=str(tmp_path / "new"), budget_usd=50.0, step_time_estimate_s=3.6,
                  total_steps=1000, num_nodes=4, spot_price=1.0, on_demand_price=3.0,
                  spot_nodes_available="3")  # fmt: skip
    ti = _TI()
    assert _branch(**kwargs).choose_branch({"ti": ti}) == "train_on_demand"  # all or nothing: no spot
    assert ti.pushed["decision"]["nodes"] == 4
    assert _branch(**kwargs, min_nodes="{{ params.min_nodes }}").template_fields.count("min_nodes") == 1
    assert _branch(**kwargs, min_nodes="2").choose_branch({"ti": ti}) == "train_spot"
    assert ti.pushed["decision"]["nodes"] == 3 and "on 3 of them now" in ti.pushed["decision"]["reason"]
    assert _branch(**kwargs, min_nodes="").choose_branch({"ti": ti}) == "train_on_demand"  # empty: None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"min_nodes": 0}, "min_nodes: must be >= 1, got 0"),
     ({"min_nodes": "two"}, "min_nodes: expected an integer, got 'two'"),
     ({"resize_overhead_s": -1}, "resize_overhead_s: must be >= 0, got -1"),
     ({"replace_timeout_s": 0}, "replace_timeout_s: must be > 0, got 0")],
)  # fmt: skip
def test_bad_elastic_arguments_fail_when_the_dag_is_parsed(kwargs, message):
    from tests.spot.test_budget import _branch

    with pytest.raises(ValueError, match="BudgetBranchOperator\\(task_id='budget'\\)") as err:
        _branch(**kwargs)
    assert message in str(err.value)


def test_a_rendered_min_nodes_above_num_nodes_is_refused_naming_both(tmp_path):
    from tests.spot.test_budget import _TI, _branch

    op = _branch(checkpoint_uri=str(tmp_path / "new"), num_nodes="{{ n }}", min_nodes="{{ m }}")
    op.num_nodes, op.min_nodes = "2", "3"  # as the templates render
    with pytest.raises(ValueError, match="min_nodes: must be <= num_nodes 2, got 3"):
        op.choose_branch({"ti": _TI()})


def test_an_elastic_group_on_spot_stays_on_its_k_nodes_while_on_demand_can_still_take_over_in_time():
    # on 2 of 4 nodes the hour of work takes 2 h, past a deadline 1.6 h away; on-demand begun after one more
    # 15 min interval (with its 600 s start-up) takes 1.42 h from now: in time, so the group stays on spot,
    # which grows back when the nodes return
    running = dict(spot_nodes_available=2, min_nodes=2, current=Choice.SPOT, wait_interval_s=900.0)
    stays = decide(_inputs(**running, deadline_s=1.6 * 3600))
    assert stays.choice == Choice.SPOT and stays.nodes == 2, stays.reason
    assert "stay on spot on 2 of 4 node(s) for 900 s" in stays.reason
    # 1.3 h away, on-demand after the interval would be late: on-demand now (1.17 h with its start-up)
    moves = decide(_inputs(**running, deadline_s=1.3 * 3600))
    assert moves.choice == Choice.ON_DEMAND and moves.nodes == 4, moves.reason
    # the budget must pay for the interval on spot and on-demand after it: $1 + $14 is not within $14.50
    poor = decide(_inputs(**running, deadline_s=1.6 * 3600, remaining_budget=14.5))
    assert poor.choice == Choice.ON_DEMAND, poor.reason
    # an all-or-nothing group cannot train on 2 of its 4 nodes at all
    assert decide(_inputs(**{**running, "min_nodes": None}, deadline_s=1.6 * 3600)).choice == Choice.ON_DEMAND


def test_the_operator_counts_the_survivors_rejoin_not_the_last_call_at_each_loss(tmp_path):
    """The launchers close a resize round once every survivor is back (trainer/elastic/rdzv_round.py): a loss
    waits
    ``REJOIN_WAIT_S``, whatever last call (``replace_timeout_s``) bounds it; a shorter last call, itself."""
    from airflow_dtrain.spot.estimates import REJOIN_WAIT_S
    from tests.spot.conftest import write_manifest
    from tests.spot.test_budget import _TI, _branch

    write_manifest(tmp_path, 4000, spot_dollars=20.0, step_time_s=1.8)  # 6,000 steps of 1.8 s left: 3 h
    hours = {}
    for timeout in (600.0, 1.0):
        ti = _TI()
        _branch(
            checkpoint_uri=str(tmp_path), budget_usd=100.0, spot_price=1.168, on_demand_price=3.06,
            min_nodes=1, interruption_rate_per_hour=2.0, max_interruption_rate_per_hour=10.0,
            replace_timeout_s=timeout,
        ).choose_branch({"ti": ti})  # fmt: skip
        hours[timeout] = ti.pushed["decision"]["spot_hours"]
    # 2 losses an hour over 3 h, each waiting REJOIN_WAIT_S (2 s) against 1 s: not 600 s
    assert hours[600.0] - hours[1.0] == pytest.approx(3 * 2.0 * (REJOIN_WAIT_S - 1.0) / 3600)
