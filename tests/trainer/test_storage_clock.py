"""A node whose clock is minutes off bills what ran, by the storage's clock (``trainer.money.clock``).

benchmarks/faults.py's clock-5min-budget found it: a trainer 5 minutes ahead billed 5 minutes that had not
run, wrote them into its spend file and stopped at its cap at once. Here the node's clock is moved for the
trainer's clock module only; the storage (the local filesystem's kernel, moto's S3 server in this process)
keeps the true time, as the provider's storage does.
"""

from __future__ import annotations

import json
import os
import time
import types

import pytest

from conftest import BUCKET
from trainer.money import clock
from trainer.money.ledger import CostLedger
from trainer.base.storage import Storage

SKEW_S = 300.0


@pytest.fixture
def node_clock_off(monkeypatch):
    """Move this node's clock as ``trainer.money.clock`` reads it by ``offset`` seconds."""

    def move(offset: float) -> None:
        monkeypatch.setattr(clock, "time", types.SimpleNamespace(time=lambda: time.time() + offset))

    return move


@pytest.mark.parametrize("offset", [SKEW_S, -SKEW_S])
def test_a_node_clock_five_minutes_off_bills_the_minute_that_ran(tmp_path, node_clock_off, offset, capsys):
    node_clock_off(offset)
    launched = time.time() - 60.0  # the provider's launch, a minute ago on the true clock
    node = clock.measured(Storage(str(tmp_path)))
    assert node.skew_s == pytest.approx(offset, abs=clock.TOLERANCE_S)
    ledger = CostLedger(price_per_node_hour=3600.0, capacity_type="spot", gpus_per_node=0, nodes=1,
                        since=launched, clock=node)  # fmt: skip
    entry = ledger.attempt_entry()
    assert entry["billed_s"] == pytest.approx(60.0, abs=3.0)  # not 360 s, nor 0
    assert entry["dollars"] == pytest.approx(60.0, abs=3.0)
    assert f"{offset:+.0f} s off the storage's" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # the probe is gone


def test_a_clock_within_the_tolerance_is_not_corrected(tmp_path, capsys):
    assert clock.measured(Storage(str(tmp_path))).skew_s == 0.0
    assert "off the storage's" not in capsys.readouterr().err


def test_a_storage_the_probe_cannot_be_written_to_leaves_the_nodes_clock_and_says_so(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert clock.measured(Storage(str(blocker))).skew_s == 0.0
    assert "billing runs on this node's clock" in capsys.readouterr().err


def test_on_s3_the_objects_last_modified_is_the_clock(s3, node_clock_off):
    node_clock_off(SKEW_S)
    storage = Storage(f"s3://{BUCKET}/job")
    assert clock.measured(storage).skew_s == pytest.approx(SKEW_S, abs=clock.TOLERANCE_S)
    assert storage.listdir(storage.root) == []


def test_a_program_of_your_own_on_a_node_five_minutes_ahead_bills_the_minute_that_ran(tmp_path, monkeypatch):
    """trainer/contract.py's ``progress`` bills the operator's spend file on the filesystem's clock."""
    from trainer import contract_files

    monkeypatch.setattr(contract_files, "_SKEW", {})
    monkeypatch.setattr(contract_files, "time", types.SimpleNamespace(time=lambda: time.time() + SKEW_S))
    launched = time.time() - 60.0
    (tmp_path / "spend").mkdir()
    opened = {"capacity": "spot", "nodes": 1, "price_per_node_hour": 3600.0, "launched_at": launched}
    (tmp_path / "spend" / "a1.json").write_text(json.dumps(opened))
    now = contract_files.storage_now(str(tmp_path))
    assert now == pytest.approx(time.time(), abs=clock.TOLERANCE_S)
    contract_files.record_spend(str(tmp_path), "a1", now, force=True, step_time_s=None)
    billed = json.loads((tmp_path / "spend" / "a1.json").read_text())
    assert billed["billed_s"] == pytest.approx(60.0, abs=3.0)
    assert billed["dollars"] == pytest.approx(60.0, abs=3.0)
    assert sorted(os.listdir(tmp_path / "spend")) == ["a1.json"]  # the probe is gone
