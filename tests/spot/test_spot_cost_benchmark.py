"""The spot-cost simulator: a small run on a trace directory in the documented format, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

SIM = str(REPO / "benchmarks" / "spot_cost.py")


def _market(tmp_path) -> None:
    # 4 days of 300 s ticks; zone a: cheap, 6 nodes that drop to 3 for 45 min every 8 h;
    # zone b: dearer, 20 nodes, steady
    ticks = 4 * 288
    cap_a = [3 if (k % 96) < 9 else 6 for k in range(ticks)]
    doc = {
        "name": "synthetic",
        "tick_s": 300,
        "on_demand_price": 4.0,
        "zones": {
            "zone-a": {"price": [1.0] * ticks, "capacity": cap_a},
            "zone-b": {"price": [1.6] * ticks, "capacity": [20] * ticks},
        },
    }
    (tmp_path / "synthetic.market.json").write_text(json.dumps(doc))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SIM, *args], capture_output=True, text=True, timeout=120)


def test_every_job_is_counted_per_size_and_the_policy_keeps_every_budget(tmp_path):
    _market(tmp_path)
    done = _run(str(tmp_path), "--jobs", "12", "--tune-jobs", "6", "--seed", "3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 zone(s)" in out and "on-demand $4.000/node-h" in out and "capacity up to 20" in out
    tables = [t.split("\n\n")[0] for t in out.split("\nsynthetic, ")[1:]]
    assert [t.split(" ")[0] for t in tables] == ["1", "4", "16"]  # one table per job size
    for table in tables:
        rows = {
            line.split("|")[1].strip(): line.split("|")
            for line in table.splitlines()
            if line.startswith("| ")
        }
        assert set(rows) >= {"always on-demand", "our policy", "our policy, on time or stop",
                             "naive spot, with warning", "naive spot, no warning",
                             "Uniform Progress"}  # fmt: skip
        for name, cells in rows.items():
            if name == "strategy":
                continue
            on_time, late, stopped, never = (
                int(cells[5]),
                int(cells[6]),
                int(cells[7].split()[0]),
                int(cells[8]),
            )
            assert on_time + late + stopped + never == 12, (name, cells)
        assert rows["our policy"][10].strip() == "0"  # budget violations
        strict = rows["our policy, on time or stop"]
        assert strict[10].strip() == "0" and strict[6].strip() == "0"  # no violation; nothing finished late
        assert float(rows["our policy"][2].strip().rstrip("%")) < 100.0  # spot at 25-40 % of on-demand
    assert "our policy, 16 node(s), chosen on the first half" in out
    assert "our policy, on time or stop, 16 node(s), chosen on the first half" in out
    # a frontier verdict per size, for the scenario's sizes together, per size over scenarios, and for all
    assert out.count("either setting of ours: ") == 3 + 1 + 3 + 1
    summary = out.split("## Where each setting of ours is at or below every baseline")[1]
    together = out.split("## all scenarios and sizes together")[1].split("\n## ")[0]
    for name in ("our policy", "our policy, on time or stop"):
        met = [not _verdict(t, name).startswith("NOT") for t in tables]
        assert f"- {name}, per scenario and size: {sum(met)} of 3" in summary, summary
        assert (
            f"- {name}, all jobs together: {0 if _verdict(together, name).startswith('NOT') else 1} of 1"
            in summary
        )


def _verdict(text: str, name: str) -> str:
    """The verdict on ``name`` in a block of the simulator's output, after its figures."""
    line = next(line for line in text.splitlines() if line.startswith(f"{name}: "))
    return line.split(" kept: ", 1)[1]


def test_a_missing_trace_directory_is_named(tmp_path):
    done = _run(str(tmp_path / "nowhere"))
    assert done.returncode != 0
    assert f"trace directory {tmp_path / 'nowhere'} does not exist" in done.stderr


def test_a_scenario_not_in_the_trace_directory_is_named_with_those_that_are(tmp_path):
    _market(tmp_path)
    done = _run(str(tmp_path), "--scenario", "groups")
    assert done.returncode == 2, done.stderr
    assert "--scenario groups: not in" in done.stderr and "(there: synthetic)" in done.stderr


def test_a_malformed_market_names_the_file_and_the_field(tmp_path):
    (tmp_path / "bad.market.json").write_text(json.dumps({"tick_s": 300, "on_demand_price": 4.0, "zones": {
        "z": {"price": [1.0, 1.0], "capacity": [1]}}}))  # fmt: skip
    done = _run(str(tmp_path))
    assert done.returncode != 0
    assert "bad.market.json: zones.z: price and capacity are lists of the same length" in done.stderr


def _benchmark_modules():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import spot_traces
        import spotsim as spot_cost
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return spot_cost, spot_traces


def test_the_simulated_policy_sees_the_offer_spot_price_sensor_would_choose():
    # the benchmark runs decide() on the zone SpotPriceSensor's choose_offer picks (the cheapest offer at or
    # below the limit), among the zones that have the group's nodes; not a choice the product cannot make
    import random

    from airflow_dtrain.spot.offers import choose_offer
    from trainer.money.prices import SpotPrice

    spot_cost, spot_traces = _benchmark_modules()
    Market, Zone = spot_traces.Market, spot_traces.Zone
    rng = random.Random(7)
    ticks, od = 400, 3.0
    zones = [
        Zone(f"us-east-1{c}", [rng.choice([0.9, 1.2, 1.2, 1.5, 2.4]) for _ in range(ticks)],
             [rng.randrange(0, 7) for _ in range(ticks)])
        for c in "dacb"
    ]  # fmt: skip
    world = spot_cost.World(Market("m", 300.0, od, zones), spot_cost.Mechanics(), seed=0)
    policy = spot_cost.Policy(0.5, float("inf"), 0.0)
    seen = set()
    for k in range(ticks):
        for n in (1, 4):
            have = [z for z in zones if z.capacity[k] >= n]
            prices = [SpotPrice("p3.2xlarge", z.name, z.price[k], "2026-11-25T00:00:00Z") for z in have]
            best, _ = choose_offer(
                prices, {"p3.2xlarge": (od, "table")}, max_price=None, max_price_fraction=0.5
            )
            got = policy.offer(world, k, n, spot_cost.State())
            if (
                best is None
            ):  # nothing acceptable has the nodes: decide() hears of the acceptable zone with the most
                assert got is None or (zones[got].price[k] <= 0.5 * od and zones[got].capacity[k] < n), (k, n)
            else:
                assert zones[got].name == best.availability_zone, (k, n, best, zones[got])
                seen.add(best.availability_zone)
    assert len(seen) == 4  # ties on price included (1.2 is drawn twice as often)


def test_a_miss_carries_a_paired_bootstrap_interval_over_the_jobs():
    sc, _ = _benchmark_modules()
    mech = sc.Mechanics()
    jobs = [sc.Job(0, 0, 100, 3600.0, 1, 7200.0, 10.0) for _ in range(50)]

    def row(name, costs, kept):
        outs = [sc.Outcome(cost=c, time_s=3600.0 if k else 9000.0, finished=True, started=True)
                for c, k in zip(costs, kept)]  # fmt: skip
        return sc.Row(name, jobs, outs, 100.0, mech)

    everyone = [True] * 50
    # cheaper by $0.50 on every job: no resample can say otherwise
    cheaper = sc.paired_interval(row("our policy", [1.0] * 50, everyone), row("b", [1.5] * 50, everyone))
    assert cheaper == ((-25.0, -25.0), (0, 0))
    # dearer on half the jobs, cheaper on the other half, and 5 fewer kept: the cost interval spans 0, the
    # jobs' does not
    ours = row("our policy", [2.0, 0.0] * 25, [False] * 5 + [True] * 45)
    base = row("naive spot, with warning", [1.0] * 50, everyone)
    (c_lo, c_hi), (k_lo, k_hi) = sc.paired_interval(ours, base)
    assert c_lo < 0 < c_hi and k_lo <= -5 <= k_hi < 0
    line = sc.verdict([row("always on-demand", [3.0] * 50, everyone), ours, base], "our policy")
    assert "NOT at or below" in line and "ours +0.00 points, -5 kept" in line
    assert f"95 % interval {c_lo:+.2f} to {c_hi:+.2f} points, {k_lo:+d} to {k_hi:+d} kept" in line


def test_with_the_dags_inputs_the_policy_gets_one_fixed_rate_from_the_first_half_and_the_price_limit(
    tmp_path, monkeypatch
):
    # `--inputs dag`: what train_llama gives decide() (interruption_rate_per_hour fixed by the DAG's author,
    # max_spot_price as the price to wait for), not the zone's trailing rate and price low it does not gather
    sc, spot_traces = _benchmark_modules()
    _market(tmp_path)
    market = spot_traces.load_scenarios(tmp_path)[0].markets[0]
    world = sc.World(market, sc.Mechanics(), seed=0)
    # first half (576 ticks): zone a's 6 nodes drop to 3 at ticks 96, 192, 288, 384, 480 (a 4-node group is
    # lost each time) and it has 4 for 576 - 6 x 9 ticks; zone b has 20 throughout and loses none
    assert world.prior_rate(4) == 5 / ((576 - 6 * 9 + 576) * 300 / 3600)
    # a 1-node group loses its node to a 6 -> 3 drop with chance 3/6, and runs on both zones all the time
    assert world.prior_rate(1) == 5 * 0.5 / (2 * 576 * 300 / 3600)

    seen = []
    real = sc.strategies.decide  # the policy's own reference to it
    monkeypatch.setattr(sc.strategies, "decide", lambda inputs: seen.append(inputs) or real(inputs))
    job = sc.Job(0, 600, market.ticks, 4 * 3600.0, 4, 8 * 3600.0, 100.0)
    for inputs in ("measured", "dag"):
        policy = sc.Policy(0.5, float("inf"), 0.0, inputs=inputs)
        policy.choose(world, job, 700, 0.0, sc.State(), 0.0)  # tick 700: zone a (1.0/h) has its 6 nodes
    measured, dag = seen
    assert measured.spot_price == dag.spot_price == 1.0
    assert measured.interruption_rate_per_hour == world.rate(4)[0][700] != dag.interruption_rate_per_hour
    assert dag.interruption_rate_per_hour == world.prior_rate(4)
    assert measured.wait_target_price == min(world.recent_low[700], 2.0) and dag.wait_target_price == 2.0

    done = _run(str(tmp_path), "--jobs", "12", "--tune-jobs", "6", "--seed", "3", "--inputs", "dag")
    assert done.returncode == 0, done.stderr
    assert "our policy's inputs: dag" in done.stdout
    for table in [t.split("\n\n")[0] for t in done.stdout.split("\nsynthetic, ")[1:]]:
        ours = next(line.split("|") for line in table.splitlines() if line.startswith("| our policy |"))
        assert sum(int(ours[i].split()[0]) for i in (5, 6, 7, 8)) == 12 and ours[10].strip() == "0"


def test_a_parameter_set_is_left_out_of_the_tuning_only_where_it_cannot_differ():
    """spot_cost.distinct_sets runs one of the price limits that admit every price of the markets (with the
    measured inputs, they leave the same offers and the same wait target: same outcomes, job by job); a limit
    that some price lies above stays, and with the DAG's inputs (the limit is the wait target) every set
    stays."""
    spot_cost, spot_traces = _benchmark_modules()
    Market, Zone = spot_traces.Market, spot_traces.Zone
    ticks, od = 2 * 288, 4.0
    cap = [3 if (k % 96) < 9 else 6 for k in range(ticks)]
    steady = Zone("b", [1.6] * ticks, [20] * ticks)
    cheap = Market("cheap", 300.0, od, [Zone("a", [1.0] * ticks, cap), steady])
    grid = spot_cost.param_grid()
    kept = spot_cost.distinct_sets([cheap])
    assert {p[0] for p in kept} == {0.5} and len(kept) == len(grid) // len(spot_cost.PRICE_RATIOS)
    assert spot_cost.distinct_sets([cheap], "dag") == grid
    # a price of 0.6 x on-demand: the 0.5 limit refuses it, 0.75 and 1.0 admit every price
    dear = Market("dear", 300.0, od, [Zone("a", [2.4] * ticks, cap), steady])
    assert {p[0] for p in spot_cost.distinct_sets([dear])} == {0.5, 0.75}

    mech = spot_cost.Mechanics()
    world = spot_cost.World(cheap, mech, seed=1)
    jobs = spot_cost.make_jobs([cheap], 8, 4, 1, 1, mech)
    for rest in [(1.0, 0.2, None), (float("inf"), 0.0, 0.2)]:
        outcomes = [[spot_cost.simulate(world, j, spot_cost.Policy(ratio, *rest)) for j in jobs]
                    for ratio in spot_cost.PRICE_RATIOS]  # fmt: skip
        assert outcomes[0] == outcomes[1] == outcomes[2]
        assert any(o.started for o in outcomes[0])


def test_the_policy_is_told_the_time_left_to_the_deadline_not_a_tick_less():
    # a run chosen at a tick starts at that tick (the baselines count from there too): a job that spot
    # finishes with no preemption 100 s before its deadline, on a market that never loses a node, is run and
    # kept by "on time or stop", not stopped because the deadline was shaved by a 300 s tick
    sc, spot_traces = _benchmark_modules()
    ticks = 200
    market = spot_traces.Market("m", 300.0, 4.0, [spot_traces.Zone("z", [1.0] * ticks, [20] * ticks)])
    mech = sc.Mechanics()
    world = sc.World(market, mech, seed=0)
    job = sc.Job(0, 50, ticks, 3600.0, 4, 3600.0 + mech.startup_s + 100.0, 100.0)
    strict = sc.Policy(0.5, float("inf"), 1.0, 0.0, allow_late=False)
    out = sc.simulate(world, job, strict)
    assert out.finished and not out.stopped and out.time_s == 3600.0 + mech.startup_s <= job.deadline_s
    assert out.cost == (3600.0 + mech.startup_s) / 3600 * 4 * 1.0  # on spot all the way


def _rows(table: str) -> dict[str, list[str]]:
    return {
        line.split("|")[1].strip(): line.split("|") for line in table.splitlines() if line.startswith("| ")
    }


def test_several_seeds_pool_their_held_out_jobs_and_count_the_seeds_each_setting_met_the_line_on(tmp_path):
    _market(tmp_path)
    single = {}
    for seed in ("3", "4"):
        done = _run(str(tmp_path), "--jobs", "12", "--tune-jobs", "6", "--seed", seed)
        assert done.returncode == 0, done.stderr
        single[seed] = done.stdout
    done = _run(str(tmp_path), "--jobs", "12", "--tune-jobs", "6", "--seeds", "3-4")
    assert done.returncode == 0, done.stderr
    pooled = done.stdout
    assert "seeds 3-4 (2, pooled)" in pooled
    # each seed chose its own parameters, as its own run did
    for seed, out in single.items():
        for line in out.splitlines():
            if ", chosen on the first half" in line:
                assert line.replace("- ", f"- seed {seed}, ", 1) in pooled
    # every count of a pooled table is the sum of the seeds' own tables, strategy by strategy
    for size in ("1", "4", "16"):

        def table(out: str) -> dict[str, list[str]]:
            return _rows(out.split(f"\nsynthetic, {size} node(s), ")[1].split("\n\n")[0])

        mine, parts = table(pooled), [table(out) for out in single.values()]
        assert f"\nsynthetic, {size} node(s), 24 held-out jobs (second half, 2 seeds):" in pooled
        for name, cells in mine.items():
            if name == "strategy" or set(cells[2]) <= set("-:| "):
                continue
            for col in (5, 6, 8, 9, 10):  # on time, late, never started, kept, violations
                assert int(cells[col]) == sum(int(p[name][col]) for p in parts), (size, name, col)
        # the seed-by-seed count says on how many seeds the setting met the line on that seed's jobs alone
        block = pooled.split(f"\nsynthetic, {size} node(s), ")[1].split("\n\n")[0]
        for name in ("our policy", "our policy, on time or stop"):
            met = [seed for seed, out in single.items()
                   if not _verdict(out.split(f"\nsynthetic, {size} node(s), ")[1].split("\n\n")[0],
                                   name).startswith("NOT")]  # fmt: skip
            assert f"{name}, seed by seed: at or below every baseline on {len(met)} of 2 seeds" in block, (
                block
            )
    assert _run(str(tmp_path), "--seeds", "4-x").returncode == 2
