"""An elastic group is billed for the nodes it had, interval by interval, and its size goes to the metrics.

The session reads its launcher's ``node_changes`` at every poll and when the group ends, and writes them
into the group's spend file (the real one, on disk) with its bill over them; an entry without them (an
all-or-nothing group, an older ledger) is billed at ``num_nodes`` throughout, as before.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from airflow_dtrain.launchers.base import GroupState, GroupStatus, LogChunk
from airflow_dtrain.session.group import GroupSession
from airflow_dtrain.job.spec import JobSpec
from trainer.money.bill import at_prices_in_effect, billed, node_intervals
from trainer.money.ledger import CostLedger
from trainer.base.statsd import parse_line

NAME = "dag-train-abc-r0"


class ElasticLauncher:
    """A launcher whose one group runs through ``script``: at each look, its state and its node changes so
    far (what a real launcher reads from its nodes.jsonl or its pods)."""

    backend = "fake"

    def __init__(self, script: list[tuple[GroupState, list[tuple[float, int]]]], spend_file):
        self.script, self.looks, self.spend_file = script, 0, spend_file
        self.spend_seen: list[dict] = []
        """The group's spend file as it was at each look: what the cap and the status line read meanwhile."""
        self.launched: list[str] = []

    def launch(self, name, spec, *, spent_usd=0.0):
        self.launched.append(name)
        return GroupStatus(name, GroupState.PENDING)

    def find(self, prefix):
        return [n for n in self.launched if n.startswith(prefix)]

    def status(self, name):
        self.spend_seen.append(json.loads(self.spend_file.read_text()))
        state = self.script[min(self.looks, len(self.script) - 1)][0]
        self.looks += 1
        return GroupStatus(name, state, "ended" if state.terminal else "")

    def node_changes(self, name):
        return list(self.script[min(self.looks, len(self.script)) - 1][1]) if self.looks else []

    def logs(self, name, cursor=None):
        return LogChunk([], cursor)

    def checkpoint_now(self, name):
        return 0

    def stop(self, name, grace_period_s=30.0):
        return self.status(name)


def _spec(tmp_path) -> JobSpec:
    return JobSpec.from_arguments(
        flavor="debug", steps=4, global_batch_size=2, micro_batch_size=1, num_nodes=2, min_nodes=1,
        price_per_node_hour=3.6, checkpoint_uri=str(tmp_path / "ckpt"),
    )  # fmt: skip


def test_two_nodes_for_100_s_then_one_for_50_s_bill_exactly_a_quarter(tmp_path, statsd_listener):
    spend_file = tmp_path / "ckpt" / "spend" / f"{NAME}.json"
    t0 = time.time() - 150  # the group was launched 150 s ago: 100 s at 2 nodes, then 50 s at 1, then none
    script = [
        (GroupState.RUNNING, [(t0, 2)]),
        (GroupState.RUNNING, [(t0, 2), (t0 + 100, 1)]),
        (GroupState.SUCCEEDED, [(t0, 2), (t0 + 100, 1), (t0 + 150, 0)]),
    ]
    launcher = ElasticLauncher(script, spend_file)
    session = GroupSession(launcher, "dag-train-abc", _spec(tmp_path), log=logging.getLogger("test"))
    assert session.launch(0) == NAME
    spend_file.write_text(json.dumps({**json.loads(spend_file.read_text()), "launched_at": t0}))

    event = session.watch(NAME, poll_interval=0)
    session.on_end(event)

    entry = json.loads(spend_file.read_text())
    assert entry["dollars"] == 0.25 and entry["ended"] is True  # 2 x 100 s + 1 x 50 s at $3.6/node-h
    assert entry["node_hours"] == pytest.approx((2 * 100 + 50) / 3600)
    assert entry["node_changes"] == [[t0, 2], [t0 + 100, 1], [t0 + 150, 0]]
    assert session._ledger_dir().spend().total_dollars == 0.25  # what the next launch's cap and deadline read
    # while it ran: the shrink was in the spend file from the poll that saw it, billed over it
    during = launcher.spend_seen[2]
    assert during["node_changes"] == [[t0, 2], [t0 + 100, 1]]
    assert 0.25 <= during["dollars"] < 0.26
    # the size at each change, and one resize (the group's end is none)
    statsd_listener.wait_for("dtrain.group.nodes:0|g")
    lines = [parse_line(text) for text in statsd_listener.lines]
    assert [v for n, v, kind, _ in lines if n == "dtrain.group.nodes" and kind == "g"] == [2, 1, 0]
    assert [v for n, v, _, _ in lines if n == "dtrain.group.resizes"] == [1]


def test_a_group_that_never_changed_size_is_billed_at_num_nodes_as_before(tmp_path):
    spend_file = tmp_path / "ckpt" / "spend" / f"{NAME}.json"
    t0 = time.time() - 100
    launcher = ElasticLauncher([(GroupState.SUCCEEDED, [(t0 + 5, 2)])], spend_file)
    session = GroupSession(launcher, "dag-train-abc", _spec(tmp_path), log=logging.getLogger("test"))
    session.launch(0)
    spend_file.write_text(json.dumps({**json.loads(spend_file.read_text()), "launched_at": t0}))

    session.on_end(session.watch(NAME, poll_interval=0))

    entry = json.loads(spend_file.read_text())
    assert "node_changes" not in entry  # the file says what it always said: num_nodes throughout
    assert entry["dollars"] >= 2 * 100 * 3.6 / 3600


def test_old_entries_bill_num_nodes_and_changes_reach_back_to_the_launch():
    old = {"launched_at": 0.0, "nodes": 2, "price_per_node_hour": 3.6}
    assert billed(old, until=150.0)["dollars"] == 0.3
    # the first change's count covers the seconds before it (the nodes were starting: billed)
    assert node_intervals(0.0, 150.0, 2, [[10.0, 2], [100.0, 1]]) == [(0.0, 100.0, 2), (100.0, 150.0, 1)]
    grown = billed({**old, "node_changes": [[0.0, 1], [50.0, 2]]}, until=150.0)
    assert grown["dollars"] == 0.25 and grown["node_hours"] == pytest.approx(250 / 3600)
    # a price that doubled at 100 s: the 1-node interval after it at $7.2
    repriced = at_prices_in_effect(
        billed({**old, "node_changes": [[0.0, 2], [100.0, 1]]}, until=150.0),
        [(0.0, 3.6), (100.0, 7.2)],
        until=150.0,
    )
    assert repriced["dollars_at_prices_in_effect"] == pytest.approx(0.2 + 0.1)
    assert repriced["dollars_at_launch_price"] == pytest.approx(0.25)


def test_the_trainer_bills_the_recorded_sizes_and_keeps_them_when_it_rewrites_the_file(tmp_path):
    from trainer.checkpoint.directory import CheckpointDir
    from trainer.config.sections import CostConfig
    from trainer.money.cap import BudgetGuard

    t0 = time.time() - 150
    root = CheckpointDir(str(tmp_path))
    changes = [[t0, 2], [t0 + 100, 1]]
    root.record_spend(
        NAME, {"launched_at": t0, "nodes": 2, "price_per_node_hour": 3.6, "node_changes": changes}
    )
    # the worker restarted at 1 node after the shrink: its size, billed back to the launch, would say $0.15
    cost = CostLedger(price_per_node_hour=3.6, capacity_type="spot", gpus_per_node=1, nodes=1, since=t0)
    guard = BudgetGuard(CostConfig(price_per_node_hour=3.6), cost, root, NAME)

    guard.record(force=True)

    entry = root.spend_entry(NAME)
    assert entry["node_changes"] == changes
    assert 0.25 <= entry["dollars"] < 0.26
    assert 0.25 <= cost.snapshot()["total_dollars"] < 0.26


def _follow(tmp_path, *, ran_s: float, shrunk_at_s: float, prices=None) -> dict:
    """The deadline ``follow_deadline`` gives a group of 2 nodes at $3.60/node-h with a $10 budget that
    launched ``ran_s`` ago and went down to 1 node ``shrunk_at_s`` after its launch (``prices``: the spot
    prices in effect, ``[(seconds after the launch, price), ...]``)."""
    from airflow_dtrain.session.watch import follow_deadline
    from trainer.checkpoint.directory import CheckpointDir
    from trainer.money.deadline import budget_deadline

    spec = JobSpec.from_arguments(
        flavor="debug", steps=4, global_batch_size=2, micro_batch_size=1, num_nodes=2, min_nodes=1,
        price_per_node_hour=3.6, budget_usd=10.0, checkpoint_uri=str(tmp_path / "ckpt"),
    )  # fmt: skip
    assert budget_deadline(spec)["seconds"] == 4860  # 5,000 s of both nodes, less 110 s grace and 30 s margin
    now = time.time()
    t0 = now - ran_s
    changes = [[t0, 2], [t0 + shrunk_at_s, 1]]
    entry = {"launched_at": t0, "nodes": 2, "price_per_node_hour": 3.6, "node_changes": changes}
    ledger = CheckpointDir(str(tmp_path / "ckpt"))
    ledger.record_spend(NAME, entry)
    moved = []

    class Launcher:
        def move_deadline(self, name, deadline):
            moved.append(deadline)
            return 4860

    history = [(t0 + at, price) for at, price in prices] if prices else None
    follow_deadline(Launcher(), NAME, budget_deadline(spec), ledger, entry, now, history)
    (deadline,) = moved
    return deadline


def test_the_cap_counts_the_sizes_behind_and_num_nodes_ahead_when_the_price_moves(tmp_path):
    # the price doubled when the group went down to 1 node
    deadline = _follow(tmp_path, ran_s=150, shrunk_at_s=100, prices=[(0, 3.6), (100, 7.2)])
    assert deadline["spent_usd"] == pytest.approx(0.2 + 50 * 7.2 / 3600, abs=1e-6)  # 2 x 100 s, 1 x 50 s
    assert (
        deadline["nodes"] == 2 and deadline["usd_per_hour"] == 2 * 7.2
    )  # a group that grows back is covered
    assert deadline["seconds"] <= 150 + (10.0 - deadline["spent_usd"]) / (2 * 7.2) * 3600


@pytest.mark.parametrize("prices", [None, [(0, 3.6), (1000, 1.8)]])
def test_a_group_that_ran_on_fewer_nodes_has_its_deadline_moved_later_by_what_it_did_not_spend(
    tmp_path, prices
):
    """After 400 s on 2 nodes and 1,600 s on 1, $2.40 is spent; the $7.60 left buys 3,800 s of both nodes:
    2,000 + 3,800 - 140 = 5,660 s, where the launch deadline was 4,860 s. A spot price that fell meanwhile
    buys no more time ahead (priced at the dearer of it and the launch's)."""
    deadline = _follow(tmp_path, ran_s=2000, shrunk_at_s=400, prices=prices)
    assert deadline["spent_usd"] == pytest.approx(2.4, abs=1e-6)
    assert deadline["seconds"] in (5659, 5660) and deadline["usd_per_hour"] == 7.2 and deadline["nodes"] == 2
