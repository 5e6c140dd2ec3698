"""The task log's one-line status of a training job, and the group's output batched into it."""

from __future__ import annotations

import json

from airflow_dtrain.status_line import StatusLine, log_lines
from trainer.checkpoint.directory import CheckpointDir


def _event(**fields) -> str:
    return "[node0][rank0]: " + json.dumps(fields)


def test_the_status_line_has_every_field_from_the_trainers_events_and_the_ledger(tmp_path):
    ledger = CheckpointDir(str(tmp_path))
    ledger.record_spend("g-r0", {"capacity": "spot", "nodes": 2, "price_per_node_hour": 1.0, "launched_at": 0,
                                 "billed_s": 100.0, "node_hours": 0.05, "gpu_hours": 0.0, "dollars": 12.4,
                                 "budget_usd": 50.0})  # fmt: skip
    status = StatusLine(steps=5000, tokens_per_step=4096 * 32, budget_usd=50.0, ledger_uri=str(tmp_path))
    status.feed([_event(event="checkpoint", step=1000, seconds=3.2, path="p", reason="interval")], now=1000.0)
    status.feed(
        ["[node1][rank1]: some warning", _event(event="train", step=1200, loss=2.5, tokens_per_s=41_000.0)],
        now=1120.0,
    )
    line = status.line(now=1120.0)
    # 4096*32 tokens at 41k tok/s = 3.2 s/step; 3800 steps to go = 3h22m
    assert line == (
        "step 1200/5000 · 3.2 s/step · 41k tok/s · ETA 3h22m · $12.40 of $50.00 · "
        "last ckpt step 1000 (2m00s ago)"
    )


def test_before_the_first_step_and_without_a_budget_it_says_so():
    status = StatusLine(steps=60, tokens_per_step=1024)
    assert status.line(now=0) == "step 0/60 · s/step – · tok/s – · ETA – · no checkpoint yet"
    status.feed([_event(event="resume", from_step=30, path="p")], now=5)
    assert status.line(now=5).startswith("step 30/60") and "last ckpt step 30" in status.line(now=5)


def test_it_is_due_every_interval_not_every_step():
    status = StatusLine(steps=100, tokens_per_step=10, every_s=15)
    assert status.due(now=0) is not None  # at once
    assert status.due(now=14.9) is None
    assert status.due(now=15.0) is not None
    # carried by a trigger as plain values, and goes on where it was
    again = StatusLine.from_dict(json.loads(json.dumps(status.to_dict())))
    assert again.due(now=20.0) is None and again.due(now=30.0) is not None


class _Log:
    def __init__(self):
        self.records: list[str] = []

    def info(self, fmt, *args):
        self.records.append(fmt % args)


def test_a_polls_lines_are_one_record_capped_and_errors_always_kept():
    log = _Log()
    log_lines(log, ["[node0][rank0]: a", "[node1][rank1]: b"])
    assert log.records == ["[node0][rank0]: a\n[node1][rank1]: b"]  # one record, the prefixes kept

    flood = [f"[node{i % 4}][rank{i % 32}]: step chatter {i}" for i in range(5000)]
    flood[2500] = "[node3][rank17]: Traceback (most recent call last):"
    flood[2501] = "[node3][rank17]: RuntimeError: CUDA error: an illegal memory access was encountered"
    log_lines(log, flood, limit=200)
    shown = log.records[-1].splitlines()
    assert len(shown) <= 203
    assert flood[2500] in shown and flood[2501] in shown  # errors from the middle are kept
    assert shown[0] == flood[0] and shown[-1] == flood[-1]
    assert any("lines not shown" in line for line in shown)


def test_nothing_is_logged_for_an_empty_poll():
    log = _Log()
    log_lines(log, [])
    assert log.records == []
