"""The spot-cost simulator runs on any trace directory in the documented formats."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_simulator_on_a_small_synthetic_trace_directory(tmp_path):
    # two zones, one cheap and flaky, one dearer and steady; 10 days of 300 s ticks
    ticks = 10 * 288
    cheap = [1.0 + 0.1 * ((k // 500) % 2) for k in range(ticks)]
    steady = [1.6] * ticks
    (tmp_path / "prices").mkdir()
    (tmp_path / "prices" / "zone-a.json").write_text(
        json.dumps({"prices": cheap, "gap_seconds": 300, "price_info": {"on_demand_price": 4.0, "instance_type": "x"}})
    )
    (tmp_path / "prices" / "zone-b.json").write_text(json.dumps({"prices": steady, "gap_seconds": 300}))
    rows = ["date,availability"] + [f"t{k},{0 if (k % 97) < 9 else 1}" for k in range(ticks)]
    (tmp_path / "zone-a_probe.csv").write_text("\n".join(rows))

    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "spot_cost.py"), str(tmp_path), "--jobs", "40", "--seed", "3"],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout

    assert "2 zones" in out and "$4.00/h" in out and "300 s" in out
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"budget policy", "always on-demand", "naive always-spot"}
    assert rows["budget policy"][7].strip() == "0"  # budget violations
    policy_cost = float(rows["budget policy"][3].strip().rstrip("%"))
    assert policy_cost < 100.0  # spot at 25-28% of on-demand must beat it
