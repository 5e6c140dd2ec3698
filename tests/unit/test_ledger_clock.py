"""A node whose clock is off does not move the launch the provider recorded (benchmarks/faults.py's
clock-5min-budget found it: a trainer 5 minutes behind wrote its own "launch" into the spend file, and the
provider's final bill then counted 5 minutes that never ran)."""

from __future__ import annotations

import time

import pytest

from trainer.money.ledger import LAUNCHED_AT_ENV, CostLedger


@pytest.mark.parametrize("skew_s", [-300.0, 300.0])
def test_the_spend_file_keeps_the_providers_launch_whatever_this_nodes_clock_says(monkeypatch, skew_s):
    launched = 1_800_000_000.0
    monkeypatch.setenv(LAUNCHED_AT_ENV, str(launched))
    real_now = launched + 60.0  # a minute after the launch, by the provider's clock
    monkeypatch.setattr(time, "time", lambda: real_now + skew_s)
    ledger = CostLedger(
        price_per_node_hour=3.6, capacity_type="spot", gpus_per_node=0, nodes=1, since=launched
    )
    assert ledger.attempt_entry()["launched_at"] == launched
