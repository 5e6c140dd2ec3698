"""A spot group is billed at the spot prices in effect while it ran, not only at its launch price.

EC2 bills a running spot instance at the price in effect, to the second; the trainer counts at the
price its group was launched at. When the group ends, the session reads the zone's price history
(the amazon provider's EC2Hook, over HTTP to a moto server with injected histories) and keeps the
larger figure in the job's spend ledger, which the next relaunch's cap and the summary read.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from airflow.sdk.exceptions import TaskDeferred

from trainer.money.deadline import deadline_words, repriced_deadline
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.operators.fsdp_train import FSDPTrainOperator
from airflow_dtrain.session.group import GroupSession
from airflow_dtrain.session.watch import GroupWatch
from trainer.checkpoint.directory import CheckpointDir
from trainer.money.bill import at_prices_in_effect, dollars_at_prices

HOUR = 3600.0


def test_each_second_is_billed_at_the_price_in_effect_then():
    prices = [
        (1_000.0, 0.9),
        (1_000.0 + HOUR, 1.8),
        (0.0, 5.0),
    ]  # unordered; the 5.0 was replaced before the start
    # 2 nodes, from 30 min before the price change to 30 min after it
    assert dollars_at_prices(1_000.0 + HOUR / 2, 1_000.0 + 1.5 * HOUR, 2, prices) == pytest.approx(
        2 * (0.45 + 0.9)
    )
    # a price that takes effect after the end costs nothing
    later = [*prices, (1_000.0 + 2 * HOUR, 99.0)]
    assert dollars_at_prices(1_000.0, 1_000.0 + HOUR / 2, 1, later) == pytest.approx(0.45)


def test_a_history_that_starts_after_the_launch_cannot_price_it():
    assert dollars_at_prices(1_000.0, 2_000.0, 1, [(1_500.0, 0.9)]) is None
    assert dollars_at_prices(1_000.0, 2_000.0, 1, []) is None
    entry = {"launched_at": 1_000.0, "nodes": 1, "dollars": 0.25}
    kept = at_prices_in_effect(entry, [(1_500.0, 0.9)], until=2_000.0)
    assert kept["dollars"] == 0.25 and "does not reach back" in kept["priced_at"]


def _operator(tmp_path, **overrides) -> FSDPTrainOperator:
    arguments = dict(
        task_id="train_spot",
        flavor="debug",
        steps=4,
        global_batch_size=2,
        micro_batch_size=1,
        num_nodes=2,
        checkpoint_uri=str(tmp_path / "ckpt"),
        capacity="spot",
        price_per_node_hour=0.9,
        budget_usd=100.0,
        zone="us-east-1a",
        instance_type="p3.2xlarge",
    )
    return FSDPTrainOperator(**{**arguments, **overrides})


def _ended_group(
    tmp_path, op: FSDPTrainOperator, ran_hours: float
) -> tuple[GroupSession, str, logging.Logger]:
    """A session whose group was launched ``ran_hours`` ago (its spend file opened then), just ended."""
    spec = op.job_spec()
    log = logging.getLogger("test_spot_billing")
    session = GroupSession(LocalLauncher(tmp_path / "groups"), "dag-train-abc", spec, log=log,
                           spot_prices=op._spot_prices(spec))  # fmt: skip
    name = "dag-train-abc-r0"
    session._open_spend(name)
    spend_file = tmp_path / "ckpt" / "spend" / f"{name}.json"
    entry = json.loads(spend_file.read_text())
    spend_file.write_text(json.dumps({**entry, "launched_at": time.time() - ran_hours * HOUR}))
    return session, name, log


def _spend_entry(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / "ckpt" / "spend" / f"{name}.json").read_text())


def test_a_price_rise_while_the_group_ran_is_in_the_ledger_the_cap_and_the_log(tmp_path, spot_market, caplog):
    # p3.2xlarge in us-east-1a: $0.90 until an hour ago, $1.80 since; other zones and types must not count
    spot_market.set("us-east-1", {
        ("p3.2xlarge", "us-east-1a"): [(3, 0.9), (1, 1.8)],
        ("p3.2xlarge", "us-east-1b"): [(3, 0.3)],
        ("p3.8xlarge", "us-east-1a"): [(3, 9.0)],
    })  # fmt: skip
    session, name, _ = _ended_group(tmp_path, _operator(tmp_path), ran_hours=2)

    with caplog.at_level(logging.INFO, logger="test_spot_billing"):
        assert session.on_end({"status": "success", "name": name}) is None

    entry = _spend_entry(tmp_path, name)
    # 2 nodes: 1 h at $0.90 and 1 h at $1.80 = $5.40, where the launch price alone says 2 h x $0.90 = $3.60
    assert entry["dollars_at_prices_in_effect"] == pytest.approx(5.4, rel=1e-3)
    assert entry["dollars_at_launch_price"] == pytest.approx(3.6, rel=1e-3)
    assert entry["dollars"] == entry["dollars_at_prices_in_effect"] and entry["ended"] is True
    assert [p for _, p in entry["prices_in_effect"]] == [0.9, 1.8]
    # what the next relaunch's cap, its Kubernetes deadline and the task's summary read
    assert session._spent() == pytest.approx(5.4, rel=1e-3)
    assert CheckpointDir(str(tmp_path / "ckpt")).ledger().total_dollars == pytest.approx(5.4, rel=1e-3)
    said = [r.getMessage() for r in caplog.records if "prices in effect" in r.getMessage()]
    assert said and "$5.4" in said[0] and "$3.6" in said[0], said


def test_a_price_drop_never_counts_less_than_the_trainer_did(tmp_path, spot_market):
    spot_market.set("us-east-1", {("p3.2xlarge", "us-east-1a"): [(3, 0.9), (1, 0.3)]})
    session, name, _ = _ended_group(tmp_path, _operator(tmp_path), ran_hours=2)

    session.on_end({"status": "success", "name": name})

    entry = _spend_entry(tmp_path, name)
    assert entry["dollars_at_prices_in_effect"] == pytest.approx(2 * (0.9 + 0.3), rel=1e-3)
    assert entry["dollars"] == pytest.approx(3.6, rel=1e-3), "the cap keeps the larger of the two figures"


def test_a_history_that_begins_after_the_launch_keeps_the_launch_price_and_says_so(
    tmp_path, spot_market, caplog
):
    spot_market.set(
        "us-east-1", {("p3.2xlarge", "us-east-1a"): [(0.5, 0.3)]}
    )  # what the first half hour cost: unknown
    session, name, _ = _ended_group(tmp_path, _operator(tmp_path), ran_hours=1)

    with caplog.at_level(logging.WARNING, logger="test_spot_billing"):
        session.on_end({"status": "success", "name": name})

    entry = _spend_entry(tmp_path, name)
    assert entry["dollars"] == pytest.approx(1.8, rel=1e-3) and entry["priced_at"].startswith("launch price")
    assert any("stays counted at its launch price" in r.getMessage() for r in caplog.records)


def test_an_unreachable_price_api_keeps_the_launch_price_and_the_group_still_ends(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("AIRFLOW_CONN_AWS_NOWHERE", json.dumps({
        "conn_type": "aws", "login": "x", "password": "x",
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
                  "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}},
    }))  # fmt: skip
    session, name, _ = _ended_group(tmp_path, _operator(tmp_path, aws_conn_id="aws_nowhere"), ran_hours=1)

    with caplog.at_level(logging.WARNING, logger="test_spot_billing"):
        assert session.on_end({"status": "success", "name": name}) is None

    entry = _spend_entry(tmp_path, name)
    assert entry["ended"] is True and entry["dollars"] == pytest.approx(1.8, rel=1e-3)
    assert "could not be read" in entry["priced_at"]
    assert any("could not be read" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("overrides", [
    {"capacity": "on_demand", "price_per_node_hour": 3.06},  # on-demand prices do not move
    {"zone": None},  # no zone chosen: whose price?
    {"aws_conn_id": None},  # the DAG author turned it off
], ids=["on-demand", "no-zone", "no-connection"])  # fmt: skip
def test_only_a_spot_group_with_a_zone_and_type_is_priced_again(tmp_path, overrides):
    op = _operator(tmp_path, **overrides)
    assert op._spot_prices(op.job_spec()) is None


def test_while_a_spot_group_runs_its_prices_are_written_for_its_cap_every_refresh(tmp_path, spot_market):
    spot_market.set("us-east-1", {("p3.2xlarge", "us-east-1a"): [(3, 0.9), (1, 1.8)]})
    session, name, _ = _ended_group(tmp_path, _operator(tmp_path, spot_price_refresh_s=300), ran_hours=2)
    watch = GroupWatch(session.launcher, name, prices=session.price_watch())

    watch.feed_prices(wait=True)
    prices = CheckpointDir(str(tmp_path / "ckpt")).prices_in_effect(name)  # what the trainer's cap reads
    assert [p for _, p in prices] == [0.9, 1.8]
    assert prices[1][0] == pytest.approx(time.time() - HOUR, abs=60)
    asked = spot_market.requests
    watch.feed_prices(wait=True)
    assert spot_market.requests == asked, "not read again before spot_price_refresh_s"


@pytest.mark.torchrun
@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_a_spot_job_whose_price_is_10x_its_quote_stops_at_its_cap_at_the_price_in_effect(
    tmp_path, spot_market, slow_steps
):
    """End to end: the quote says $0.90/node-h, EC2 bills $9.00. The trigger feeds the price to the trainer,
    whose cap stops the job within its budget at that price; at the quote it would have run ten times
    longer."""
    from airflow_dtrain.triggers.fsdp_train import FSDPTrainTrigger
    from tests.conftest import RecordingTI, run_trigger
    from tests.integration.helpers import SMALL

    spot_market.set("us-east-1", {("p3.2xlarge", "us-east-1a"): [(3, 9.0)]})
    # at $9/h: 60 s, of which the trainer holds back ~25 s (its last save and exit, then the platform
    # deadline's 10 s grace and 5 s margin); at the quote, 600 s
    budget = 0.15
    op = _operator(tmp_path, **SMALL, num_nodes=1, steps=100_000, checkpoint_every=0, budget_usd=budget,
                   local_state_dir=str(tmp_path / "groups"), poll_interval=0.5, deferrable=True,
                   spot_price_refresh_s=1.0,
                   config={"checkpoint": {"grace_period_s": 10}, "cost": {"stop_margin_s": 5}})  # fmt: skip
    ti = RecordingTI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    classpath, kwargs = deferred.value.trigger.serialize()
    assert kwargs["prices"]["feed"]["zone"] == "us-east-1a"  # what the triggerer rebuilds it from
    name = deferred.value.trigger.name
    try:
        event = run_trigger(FSDPTrainTrigger(**kwargs), timeout=240)
    finally:
        LocalLauncher(tmp_path / "groups").stop(name)
    summary = op.execute_complete({"ti": ti}, event=event)

    assert summary["stopped"] == "budget", summary
    entry = _spend_entry(tmp_path, name)
    assert entry["dollars_at_prices_in_effect"] <= budget, entry  # what EC2 bills, within the cap
    assert entry["dollars_at_prices_in_effect"] == pytest.approx(
        10 * entry["dollars_at_launch_price"], rel=0.01
    )
    assert summary["dollars"] == pytest.approx(entry["dollars"]) and summary["dollars"] <= budget
    log = (tmp_path / "groups" / name / "group.log").read_text()
    assert "spot price now $9.0000/node-h (launched at $0.9000)" in log


def test_a_price_rise_brings_the_platform_deadline_forward_by_what_the_money_left_buys_now():
    """$10 budget, 2 nodes, quoted $1/node-h: the platform deadline of a group is 5 h less its grace and
    margin. An hour in, the price is $4 and $5 is spent (at the prices in effect): the $5 left buys
    37.5 min of 2 nodes at $4, so the deadline is 1 h 37.5 min after the launch, less the same grace and
    margin."""
    own = {
        "seconds": 5 * 3600 - 110 - 30,
        "budget_usd": 10.0,
        "spent_usd": 0.0,
        "nodes": 2,
        "usd_per_hour": 2.0,
        "grace_s": 110,
        "margin_s": 30,
        "save": "within",
    }
    new = repriced_deadline(own, spent_usd=5.0, price=4.0, elapsed_s=3600)
    assert new["seconds"] == 3600 + 2250 - 110 - 30 and new["usd_per_hour"] == 8.0 and new["spent_usd"] == 5.0
    assert "set 3600s after the launch" in deadline_words(new, "deadline") and "$8.0000/h" in deadline_words(
        new, "d"
    )
    # nothing left: at once (1 s, the least a Job takes)
    assert repriced_deadline(own, spent_usd=12.0, price=4.0, elapsed_s=3600)["seconds"] == 3600 - 110 - 30


@pytest.mark.torchrun
@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_your_program_on_spot_whose_price_doubled_is_stopped_by_its_supervisor_within_the_budget(
    tmp_path, spot_market
):
    """A program of your own has no cap of its own: the platform deadline is its cap. Quoted $36/node-h (a
    cent a
    second), it would get 90 s of its $0.90, and the supervisor would stop it 75 s after the launch (10 s
    grace,
    5 s margin) -- at the $72 EC2 bills, $1.50. The watch reads the price, and the deadline moves to 29-30
    s."""
    from tests.conftest import REPO, RecordingTI

    spot_market.set("us-east-1", {("p3.2xlarge", "us-east-1a"): [(3, 72.0)]})
    budget = 0.90
    op = _operator(
        tmp_path,
        entrypoint=[str(REPO / "examples" / "own_trainer" / "train.py"), "--step-sleep", "0.3"],
        job="own-mlp",
        steps=100_000,
        checkpoint_every=4,
        num_nodes=1,
        procs_per_node=2,
        price_per_node_hour=36.0,
        budget_usd=budget,
        local_state_dir=str(tmp_path / "groups"),
        poll_interval=0.5,
        deferrable=False,
        spot_price_refresh_s=1.0,
        config={"checkpoint": {"grace_period_s": 10}, "cost": {"stop_margin_s": 5}},
    )
    summary = op.execute({"ti": RecordingTI()})

    assert summary["stopped"] == "budget", summary
    reason = summary["budget_stop"]["reason"]
    assert "dollar cap by its supervisor" in reason and "the price then in effect, $72.0000/h" in reason, (
        reason
    )
    seconds = int(reason.split("deadline=", 1)[1].split()[0])
    assert seconds in (29, 30), reason  # 45 s at $72 (less the fraction of a second billed), less 15 s
    [name] = LocalLauncher(tmp_path / "groups").find("")
    entry = _spend_entry(tmp_path, name)
    assert entry["dollars_at_prices_in_effect"] <= budget, entry  # what EC2 bills, within the cap
    assert summary["dollars"] <= budget
