"""The spot-cost simulator's elastic groups (``benchmarks/spotsim/elastic.py``): k of N nodes, a lost node
replaced, the budget cap at every size, and decide() asked about the k it can have."""

from __future__ import annotations

import pytest

from tests.spot.test_spot_cost_benchmark import _benchmark_modules


def _losing_one_node(ticks: int = 200, drop_at: int = 60):
    """A one-zone market whose capacity falls from 4 to 3 at ``drop_at`` and stays there: a group of 4
    certainly loses one node then and can never have 4 again."""
    sc, spot_traces = _benchmark_modules()
    cap = [4] * drop_at + [3] * (ticks - drop_at)
    market = spot_traces.Market("m", 300.0, 4.0, [spot_traces.Zone("z", [1.0] * ticks, cap)])
    return sc, sc.World(market, sc.Mechanics(), seed=0)


def test_an_elastic_group_that_loses_one_of_four_nodes_goes_on_on_three_billed_per_node_interval():
    sc, world = _losing_one_node()
    job = sc.Job(0, 10, 200, 28800.0, 4, 50000.0, 60.0)
    policy = sc.ElasticPolicy(0.5, float("inf"), 1.0, allow_late=True, record=True)
    out = sc.simulate_elastic(world, job, policy)
    assert out.finished and out.preemptions == 1 and out.launches == 1 and out.resizes == 1  # no relaunch
    nodes = {k: n for k, n, _ in out.ledger}
    assert {n for k, n in nodes.items() if k < 60} == {4} and {n for k, n in nodes.items() if k >= 60} == {3}
    for k, n, cost in out.ledger[:-1]:
        assert cost == 300.0 / 3600 * n * 1.0  # every full tick: its nodes x its price
    assert abs(sum(c for _, _, c in out.ledger) - out.cost) < 1e-9
    # an all-or-nothing group on the same draws stops and relaunches: it never gets 4 spot nodes again
    whole = sc.simulate(world, job, sc.Policy(0.5, float("inf"), 1.0, allow_late=True))
    assert whole.preemptions == 1 and (whole.launches >= 2 or not whole.finished)
    assert out.time_s < whole.time_s


def _replaced(**mechanics):
    """A group of 4 in a zone of 6 that loses one of its nodes at tick 20 and has a free one to replace it."""
    sc, spot_traces = _benchmark_modules()
    cap = [6] * 20 + [5] * 180  # at tick 20 one of the zone's 6 nodes goes; 5 are left, 1 of them free
    market = spot_traces.Market("m", 300.0, 4.0, [spot_traces.Zone("z", [1.0] * 200, cap)])
    world = sc.World(market, sc.Mechanics(**mechanics), seed=0)
    world.draws[0][20] = 0.1  # the node that goes is one of the group's (one of 4 in 6: a chance of 2/3)
    job = sc.Job(0, 10, 200, 28800.0, 4, 50000.0, 60.0)
    policy = sc.ElasticPolicy(0.5, float("inf"), 1.0, allow_late=True, record=True)
    return sc, world, sc.simulate_elastic(world, job, policy)


def test_a_lost_node_is_replaced_by_one_that_boots_billed_and_joins_with_a_second_resize():
    """As the launchers do: the survivors go on without the lost node once every one of them is back in their
    rendezvous round; its replacement is started at once from the zone's free nodes, its start-up
    billed, and joins when booted (another re-rendezvous, with all 4: no last call)."""
    sc, world, out = _replaced()
    assert out.finished and out.preemptions == 1 and out.launches == 1 and out.resizes == 2
    nodes = {k: n for k, n, _ in out.ledger}
    assert nodes[19] == 4 and nodes[20] == 3 and nodes[21] == 4  # booted in one 300 s tick (the start-up)
    rendezvous = world.mech.rerendezvous_s
    boot = world.mech.startup_s / 3600 * 1 * 1.0  # the replacement's start-up, billed when it is started
    assert out.ledger[nodes_at(out, 20)][2] == pytest.approx(300.0 / 3600 * 3 + boot)
    assert out.ledger[nodes_at(out, 21)][2] == pytest.approx(300.0 / 3600 * 4)
    # no progress during either re-rendezvous nor the wait: the job takes their time and the step lost
    # longer than one without a loss would
    assert out.time_s >= world.mech.startup_s + 28800.0 + 2 * rendezvous + world.mech.replace_timeout_s


def test_the_survivors_wait_for_a_replacement_is_time_without_progress():
    """A wait of 30 s (torch's last call) is 30 s more without progress in the tick of the loss, where the 3
    survivors make 3/4 of the full rate: 22.5 s of the full rate, made up at the end on all 4 nodes. The
    launchers' wait (their round closes once every survivor is back) is 2 s of it."""
    _, _, last_call = _replaced(replace_timeout_s=30.0)
    _, _, rejoin = _replaced()
    _, _, at_once = _replaced(replace_timeout_s=0.0)
    assert last_call.resizes == rejoin.resizes == at_once.resizes == 2
    assert last_call.time_s - at_once.time_s == pytest.approx(30.0 * 3 / 4)
    assert rejoin.time_s - at_once.time_s == pytest.approx(2.0 * 3 / 4)


def test_a_join_costs_the_grow_resize_and_a_loss_the_re_rendezvous():
    """``--grow-resize-s``: a resize that only adds nodes (the replacement joining) pauses the group for its
    own figure (an in-process join), the survivors' resize after the loss still for the re-rendezvous."""
    _, world, restart = _replaced()
    _, fast_world, in_process = _replaced(grow_resize_s=1.0)
    assert restart.resizes == in_process.resizes == 2
    saved = world.mech.rerendezvous_s - 1.0  # the join's pause, on all 4 nodes at the full rate
    assert restart.time_s - in_process.time_s == pytest.approx(saved)
    assert fast_world.mech.grow_s == 1.0 and world.mech.grow_s == world.mech.rerendezvous_s
    _, _, slow_loss = _replaced(grow_resize_s=1.0, rerendezvous_s=2 * world.mech.rerendezvous_s)
    # the loss's resize, on the 3 survivors at 3/4 of the full rate
    assert slow_loss.time_s - in_process.time_s == pytest.approx(world.mech.rerendezvous_s * 3 / 4)


def nodes_at(out, tick: int) -> int:
    """The index in ``out.ledger`` of tick ``tick``."""
    return next(i for i, (k, _, _) in enumerate(out.ledger) if k == tick)


def test_an_elastic_group_never_passes_its_budget_cap_at_any_size():
    sc, world = _losing_one_node()
    # the budget pays for the run on 4 with no loss, not for the re-rendezvous and the step the loss costs
    budget = (28800.0 + world.mech.startup_s) / 3600 * 4 * 1.0 + 0.03
    job = sc.Job(0, 30, 200, 28800.0, 4, 50000.0, budget)
    out = sc.simulate_elastic(world, job, sc.ElasticPolicy(0.5, float("inf"), 1.0, record=True))
    assert out.started and out.stopped and not out.finished and out.resizes == 1
    assert out.preemptions == 1 and {n for _, n, _ in out.ledger} <= {4, 3}  # stopped at the resize or after
    spent = 0.0
    for _, _, cost in out.ledger:
        spent += cost
        assert spent <= job.budget + 1e-9


def test_a_one_node_elastic_group_is_an_all_or_nothing_group():
    sc, spot_traces = _benchmark_modules()
    cap = [1, 1, 0, 1, 2, 1, 0, 0, 1] * 30
    market = spot_traces.Market("m", 300.0, 4.0, [spot_traces.Zone("z", [1.0] * len(cap), cap)])
    world = sc.World(market, sc.Mechanics(), seed=1)
    job = sc.Job(0, 3, len(cap), 3600.0, 1, 20000.0, 10.0)
    elastic = sc.simulate_elastic(world, job, sc.ElasticPolicy(0.5, float("inf"), 1.0))
    whole = sc.simulate(world, job, sc.Policy(0.5, float("inf"), 1.0))
    assert (elastic.cost, elastic.time_s, elastic.preemptions) == (
        whole.cost,
        whole.time_s,
        whole.preemptions,
    )


def test_the_elastic_simulator_asks_decide_itself_about_k_of_n_nodes():
    """No translation of its own: decide() is told the group's N, min_nodes, the capacity and the resize's
    cost, and the node count it chooses is the one the group runs on."""
    from airflow_dtrain.spot.budget import decide
    from airflow_dtrain.spot.estimates import Choice

    sc, world = _losing_one_node(drop_at=5)
    policy = sc.ElasticPolicy(0.5, float("inf"), 1.0, allow_late=True, record=True)
    job = sc.Job(0, 10, 200, 7200.0, 4, 50000.0, 60.0)
    inputs = policy.budget_inputs(world, job, 10, 0.0, sc.State(), 0.0, 0)
    assert (inputs.num_nodes, inputs.min_nodes, inputs.spot_nodes_available) == (4, 2, 3)
    assert inputs.step_time_s == world.mech.step_s and inputs.resize_overhead_s == world.mech.rerendezvous_s
    assert inputs.replace_timeout_s == world.mech.replace_timeout_s
    decision = decide(inputs)
    assert decision.choice == Choice.SPOT and decision.nodes == 3, decision.reason
    out = sc.simulate_elastic(world, job, policy)
    assert out.finished and {n for _, n, _ in out.ledger} == {3}  # it started on the 3 it could get


def test_what_an_elastic_groups_dollars_bought_adds_up_to_its_cost_item_by_item():
    """``ElasticOutcome.spend``, what RESULTS' breakdown of the 16-node cost is read from: the launch's 300 s
    start-up on 4 nodes, the loss's resize and last call on the 3 survivors, the replacement's boot, its join
    (a resize on all 4), and the rest training on spot; nothing on on-demand."""
    sc, world, out = _replaced()
    mech, dollars = world.mech, lambda node_s: node_s / 3600 * 1.0  # $1 per node-hour
    assert out.spend["launches' start-up"] == pytest.approx(dollars(mech.startup_s * 4))
    resizes = (mech.rerendezvous_s + mech.replace_timeout_s) * 3 + mech.rerendezvous_s * 4
    assert out.spend["resizes and their wait"] == pytest.approx(dollars(resizes))
    assert out.spend["replacements' boot"] == pytest.approx(dollars(mech.startup_s * 1))
    assert out.spend["training on on-demand"] == 0.0
    assert sum(out.spend.values()) == pytest.approx(out.cost)
    assert set(out.spend) == set(sc.SPEND)


@pytest.mark.parametrize("u", [0.0, 0.5, 0.999999])
def test_a_group_never_loses_more_nodes_than_its_zone_gave_up(u):
    """A draw of exactly 0.0 used to lose one node more than the zone lost (the float tail of P(at least
    min + 1) is not exactly 0), so a group of 16 could lose 2 nodes where the zone lost 1."""
    sc, _ = _benchmark_modules()
    for c_prev in range(1, 30):
        for c_now in range(c_prev):
            for k in range(1, c_prev + 1):
                lost = sc.nodes_lost(c_prev, c_now, k, u)
                assert max(1, k - c_now) <= lost <= min(k, c_prev - c_now) or (lost == 0 and k <= c_now)
