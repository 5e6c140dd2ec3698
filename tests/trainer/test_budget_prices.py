"""The trainer's cap counts each second of a spot attempt at the price in effect then, as the provider
writes it (``prices/<attempt>.json``), not only at the price the group was launched at."""

from __future__ import annotations

import json
import time

import pytest

from trainer.money.cap import BudgetGuard
from trainer.checkpoint.directory import CheckpointDir
from trainer.config.sections import CostConfig
from trainer.money.ledger import CostLedger

HOUR = 3600.0


def _guard(
    tmp_path, *, budget: float, launched_hours_ago: float, price: float = 0.9, grace_period_s: float = 0.0
) -> BudgetGuard:
    cost = CostLedger(price_per_node_hour=price, capacity_type="spot", gpus_per_node=8, nodes=2,
                      since=time.time() - launched_hours_ago * HOUR)  # fmt: skip
    cfg = CostConfig(price_per_node_hour=price, capacity_type="spot", budget_usd=budget, stop_margin_s=30.0)
    return BudgetGuard(cfg, cost, CheckpointDir(str(tmp_path)), "job-r0", grace_period_s)


def test_a_price_rise_counts_from_the_second_it_took_effect_and_stops_the_job_at_its_cap(tmp_path):
    guard = _guard(tmp_path, budget=6.0, launched_hours_ago=2)
    # at the launch price: 2 nodes x 2 h x $0.90 = $3.60, well inside $6
    assert guard.over() is None
    assert guard.cost.attempt_entry()["dollars"] == pytest.approx(3.6, rel=1e-3)

    now = time.time()
    prices = CheckpointDir(str(tmp_path))
    prices.record_prices("job-r0", {"prices_in_effect": [[now - 3 * HOUR, 0.9], [now - HOUR, 1.8]]})
    guard._others_at = float("-inf")  # the next look re-reads the files (every refresh_s in a run)

    over = guard.over()
    # 1 h at $0.90 and 1 h at $1.80 on 2 nodes: $5.40; the time ahead (a save and the 30 s margin) at the
    # current $1.80 adds about $0.04: still under $6
    assert over is None
    entry = guard.cost.attempt_entry()
    assert entry["dollars"] == pytest.approx(5.4, rel=1e-3)
    assert entry["dollars_at_launch_price"] == pytest.approx(3.6, rel=1e-3)
    assert guard.cost.snapshot()["spot"]["dollars"] == pytest.approx(5.4, rel=1e-3), (
        "the manifest's ledger agrees"
    )

    prices.record_prices("job-r0", {"prices_in_effect": [[now - 3 * HOUR, 0.9], [now - HOUR, 2.5]]})
    guard._others_at = float("-inf")
    over = guard.over()
    assert over is not None, "at $2.50 since an hour ago the job has spent $6.80: past its $6 cap"
    assert over["spent_usd"] == pytest.approx(2 * (0.9 + 2.5), rel=1e-3) and over[
        "usd_per_hour"
    ] == pytest.approx(5.0)


def test_prices_read_after_the_launch_keep_the_launch_price_for_the_seconds_before(tmp_path):
    guard = _guard(tmp_path, budget=100.0, launched_hours_ago=2)
    now = time.time()
    # the provider's first read knows only a change an hour ago: the hour before is at the launch price
    CheckpointDir(str(tmp_path)).record_prices("job-r0", {"prices_in_effect": [[now - HOUR, 1.8]]})
    guard.over()
    assert guard.cost.attempt_entry()["dollars"] == pytest.approx(2 * (0.9 + 1.8), rel=1e-3)


def test_a_price_drop_never_counts_less_than_the_launch_price(tmp_path):
    guard = _guard(tmp_path, budget=100.0, launched_hours_ago=2)
    now = time.time()
    drop = [[now - 3 * HOUR, 0.9], [now - HOUR, 0.1]]
    CheckpointDir(str(tmp_path)).record_prices("job-r0", {"prices_in_effect": drop})
    guard.over()
    entry = guard.cost.attempt_entry()
    assert entry["dollars_at_prices_in_effect"] == pytest.approx(2 * (0.9 + 0.1), rel=1e-3)
    assert entry["dollars"] == pytest.approx(3.6, rel=1e-3)


def test_a_malformed_prices_file_is_named_and_the_cap_keeps_the_prices_it_had(tmp_path, capsys):
    guard = _guard(tmp_path, budget=100.0, launched_hours_ago=1)
    (tmp_path / "prices").mkdir()
    (tmp_path / "prices" / "job-r0.json").write_text(
        json.dumps({"prices_in_effect": [["yesterday", "cheap"]]})
    )
    guard.over()
    err = capsys.readouterr().err
    assert (
        "could not read the spot prices in effect" in err
        and "prices/job-r0.json" in err
        and "yesterday" in err
    )
    assert guard.cost.attempt_entry()["dollars"] == pytest.approx(1.8, rel=1e-3)


def test_the_trainer_stops_before_the_platform_deadline_so_that_it_never_has_to(tmp_path):
    """The platform's budget deadline sends SIGTERM a grace period and the stop margin before the money runs
    out
    (so that even a hung trainer is killed within the budget). The trainer stops itself, its step saved and
    its process gone, before that deadline: it keeps back its own save and exit, and the deadline's
    reserve."""
    # 2 nodes at $3.60/node-h: $7.20/h, $0.002/s; an hour in, $7.20 is spent. $0.40 more buys 200 s.
    guard = _guard(tmp_path, budget=7.2 + 0.002 * 200, launched_hours_ago=1, price=3.6, grace_period_s=110.0)
    guard.observe_step(1.0)
    guard.observe_save(4.0)
    # a step, its save and exit (4 s + the 30 s margin), then the deadline's 110 s grace and 30 s margin: 175
    # s
    assert guard.over() is None
    # with a 30 s step, 204 s are needed: stop now, although a step, a save and the margin alone (64 s) fit
    guard.observe_step(30.0)
    over = guard.over()
    assert over is not None and over["seconds_ahead"] == pytest.approx(30 + 4 + 30 + 110 + 30), over
    # a slow save is reserved in full, on top of the deadline's reserve
    slow = _guard(tmp_path, budget=7.2 + 0.002 * 200, launched_hours_ago=1, price=3.6, grace_period_s=110.0)
    slow.observe_step(1.0)
    slow.observe_save(60.0)
    assert slow.over()["seconds_ahead"] == pytest.approx(1 + 60 + 30 + 110 + 30)
