"""The simulator's elastic groups topped up with on-demand (``--top-up``): decide()'s ``top_up_on_demand``
keeps the spot nodes on offer and adds on-demand ones where it would have moved the whole group."""

from __future__ import annotations

import pytest

from tests.spot.test_spot_cost_benchmark import _benchmark_modules


def _two_of_four(ticks: int = 100):
    """One zone that never has more than 2 spot nodes ($1 a node-hour; on-demand $4)."""
    sc, spot_traces = _benchmark_modules()
    market = spot_traces.Market("m", 300.0, 4.0, [spot_traces.Zone("z", [1.0] * ticks, [2] * ticks)])
    return sc, sc.World(market, sc.Mechanics(), seed=0)


def test_a_group_short_of_spot_nodes_keeps_them_and_tops_up_with_on_demand_to_finish_in_time():
    sc, world = _two_of_four()
    # 2 h of work on 4 nodes: on the 2 spot nodes it would take 4 h, past a deadline of 1.3 x on-demand's time
    job = sc.Job(0, 0, 100, 7200.0, 4, 1.3 * 7500.0, 60.0)
    whole = sc.simulate_elastic(world, job, sc.ElasticPolicy(0.5, float("inf"), 1.0, record=True))
    topped = sc.simulate_elastic(
        world, job, sc.ElasticPolicy(0.5, float("inf"), 1.0, record=True, top_up=True)
    )

    # without the top-up: spot on 2 nodes while on-demand can still take over in time, then on-demand on all 4
    assert whole.finished and {n for _, n, _ in whole.ledger} == {2, 4} and whole.od_dollars > 0
    # topped up: 2 spot + 2 on-demand nodes at full speed, at 2 x $1 + 2 x $4 an hour, from the launch on; the
    # on-demand ones leave at a checkpoint once the 2 spot nodes alone finish in time
    assert topped.finished and topped.time_s <= job.deadline_s and topped.launches == 1
    first = [(n, cost) for _, n, cost in topped.ledger[:6]]
    assert first == [(4, pytest.approx(300 / 3600 * (2 * 1.0 + 2 * 4.0)))] * 6
    assert 0 < topped.od_dollars < topped.cost
    assert sum(c for _, _, c in topped.ledger) == pytest.approx(topped.cost)
    assert topped.cost < whole.cost


def test_a_topped_up_group_stays_within_its_budget_cap():
    sc, world = _two_of_four()
    # $15 does not pay for the top-up from the start ($20.83): spot on 2 nodes, late, and a top-up only once
    # what is left of the work topped up fits what is left of the budget
    job = sc.Job(0, 0, 100, 7200.0, 4, 1.3 * 7500.0, 15.0)
    out = sc.simulate_elastic(world, job, sc.ElasticPolicy(0.5, float("inf"), 1.0, record=True, top_up=True))
    assert [n for _, n, _ in out.ledger][:2] == [2, 2]
    spent = 0.0
    for _, _, cost in out.ledger:
        spent += cost
        assert spent <= job.budget + 1e-9
