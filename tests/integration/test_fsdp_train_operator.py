"""FSDPTrainOperator against real groups of torchrun processes on the local backend."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import threading

import pytest
from airflow.exceptions import TaskDeferred

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.operators.fsdp_train import TrainingFailed
from airflow_dtrain.job.naming import group_base_name
from airflow_dtrain.triggers.fsdp_train import FSDPTrainTrigger
from tests.conftest import RecordingTI, run_trigger
from tests.integration.helpers import SMALL, group_events, node_pids, wait_for, wait_for_step

pytestmark = pytest.mark.torchrun


def _operator(tmp_path, **overrides) -> FSDPTrainOperator:
    arguments = {
        **SMALL,
        "task_id": "train",
        "num_nodes": 2,
        "procs_per_node": 1,
        "checkpoint_uri": str(tmp_path / "ckpt"),
        "local_state_dir": str(tmp_path / "groups"),
        "poll_interval": 0.5,
        "deferrable": True,
        **overrides,
    }
    return FSDPTrainOperator(**arguments)


def _defer(op, ti) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    return deferred.value


def _complete(op, ti, deferred: TaskDeferred, event: dict):
    return getattr(op, deferred.method_name)({"ti": ti}, event=event, **(deferred.kwargs or {}))


def test_defers_to_a_serialisable_trigger_and_completes_with_a_summary(tmp_path):
    op, ti = _operator(tmp_path, steps=8), RecordingTI()
    deferred = _defer(op, ti)

    assert isinstance(deferred.trigger, FSDPTrainTrigger)
    classpath, kwargs = deferred.trigger.serialize()
    assert (
        kwargs["ledger_uri"].rstrip("/").endswith("ckpt")
    )  # an elastic group's sizes are billed as they come
    module, _, cls = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module), cls)(**kwargs)  # as the triggerer rebuilds it
    event = run_trigger(trigger)
    assert event["status"] == "success", event
    summary = _complete(op, ti, deferred, event)

    assert summary["final_step"] == 8
    assert summary["tokens_seen"] == 8 * 4 * 64
    assert summary["preemptions"] == 0 and summary["steps_lost"] == 0
    assert summary["final_loss"] > 0
    assert os.path.isfile(os.path.join(summary["latest_checkpoint"], "manifest.json"))
    assert ti.xcoms["group"] == summary["group"]
    assert (tmp_path / "ckpt" / "summary.json").is_file()


def test_restarted_task_reattaches_to_the_running_group(tmp_path, slow_steps):
    ti = RecordingTI(run_id="manual__reattach")
    first = _defer(_operator(tmp_path, steps=100_000), ti)
    wait_for_step(tmp_path / "ckpt", 1)

    # The worker died; Airflow runs the task again with a fresh operator instance.
    restarted = _operator(tmp_path, steps=100_000)
    second = _defer(restarted, RecordingTI(run_id="manual__reattach"))

    assert second.trigger.name == first.trigger.name
    launcher = LocalLauncher(tmp_path / "groups")
    assert launcher.find(group_base_name("dag", "manual__reattach", "train")) == [first.trigger.name]
    asyncio.run(second.trigger.on_kill())  # the user marks the deferred task failed
    assert launcher.status(first.trigger.name).state == GroupState.STOPPED
    assert launcher.processes(first.trigger.name) == []


def test_on_kill_stops_the_whole_group(tmp_path, slow_steps):
    op, ti = _operator(tmp_path, steps=100_000, deferrable=False), RecordingTI()
    outcome: dict = {}

    def run():
        try:
            op.execute({"ti": ti})
        except Exception as err:  # noqa: BLE001
            outcome["error"] = err

    worker = threading.Thread(target=run)
    worker.start()
    wait_for_step(tmp_path / "ckpt", 2)
    name = ti.xcoms["group"]

    op.on_kill()
    worker.join(timeout=120)

    launcher = LocalLauncher(tmp_path / "groups")
    assert launcher.processes(name) == []
    assert launcher.status(name).state == GroupState.STOPPED
    assert isinstance(outcome.get("error"), TrainingFailed) and "stopped" in str(outcome["error"])


@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_group_killed_mid_run_is_relaunched_from_its_checkpoint_and_finishes(tmp_path):
    # 40 steps: the kill at step 4 lands long before the end, on a loaded machine too.
    op, ti = _operator(tmp_path, steps=40), RecordingTI()
    deferred = _defer(op, ti)
    wait_for_step(tmp_path / "ckpt", 4)
    os.kill(node_pids(tmp_path / "groups", deferred.trigger.name)[1], signal.SIGTERM)

    event = run_trigger(deferred.trigger)
    assert event["status"] == "preempted", event
    with pytest.raises(TaskDeferred) as relaunched:
        _complete(op, ti, deferred, event)
    assert relaunched.value.trigger.name.endswith("-r1")

    summary = _complete(op, ti, relaunched.value, run_trigger(relaunched.value.trigger))
    assert summary["final_step"] == 40
    assert summary["preemptions"] == 1
    assert summary["steps_lost"] == 0


def test_synchronous_mode_recovers_a_simulated_preemption(tmp_path):
    op, ti = _operator(tmp_path, steps=10, simulate_preemption_at_step=5, deferrable=False), RecordingTI()
    summary = op.execute({"ti": ti})
    assert summary["final_step"] == 10
    assert summary["preemptions"] == 1 and summary["relaunches"] == 1
    assert summary["steps_lost"] == 0


def test_a_failing_group_fails_the_task_with_its_last_log_lines(tmp_path):
    # a dataset directory that does not exist: the trainer fails on every rank
    op, ti = _operator(tmp_path, steps=5, dataset=str(tmp_path / "missing"), deferrable=False), RecordingTI()
    with pytest.raises(TrainingFailed) as err:
        op.execute({"ti": ti})
    message = str(err.value)
    assert "failed" in message and "node" in message
    assert "missing" in message, "the error should carry the trainer's own complaint from the log"


def _worker_pids(group_dir) -> list[int]:
    """The training processes (not their torchrun agents) of a local group."""
    from airflow_dtrain.launchers.local_processes import workers

    return [proc.pid for proc in workers(LocalLauncher(group_dir.parent).processes(group_dir.name))]


def test_a_rank_killed_with_sigkill_is_relaunched_from_the_last_checkpoint_and_the_run_finishes(tmp_path):
    # One node of two ranks: SIGKILL one rank (as the OOM killer would). The node exits 76 (a worker
    # lost, resumable); the group is relaunched from its last committed checkpoint, counted against
    # max_failures, not max_preemptions. A short grace period: the surviving rank cannot save
    # (its peer is gone), so torchrun's shutdown timeout ends it.
    op, ti = (
        _operator(
            tmp_path,
            steps=40,
            num_nodes=1,
            procs_per_node=2,
            checkpoint_every=4,
            config={"checkpoint": {"grace_period_s": 5.0}},
            max_failures=1,
        ),
        RecordingTI(),
    )
    deferred = _defer(op, ti)
    wait_for_step(tmp_path / "ckpt", 8)
    from trainer.checkpoint.directory import CheckpointDir

    # an async save commits a few steps after its step: wait for one to be committed, not just trained past
    committed = wait_for(
        lambda: CheckpointDir(str(tmp_path / "ckpt")).latest(), 240, "a committed checkpoint"
    )
    [victim, *_] = _worker_pids(tmp_path / "groups" / deferred.trigger.name)
    os.kill(victim, signal.SIGKILL)

    event = run_trigger(deferred.trigger)
    assert event["status"] == "error" and "76" in str(event["node_exit_codes"]), event
    with pytest.raises(TaskDeferred) as relaunched:
        _complete(op, ti, deferred, event)
    assert relaunched.value.trigger.name.endswith("-r1")

    summary = _complete(op, ti, relaunched.value, run_trigger(relaunched.value.trigger))
    assert summary["final_step"] == 40 and summary["relaunches"] == 1
    assert summary["preemptions"] == 0, "a lost worker is a failure, not a preemption"
    [resume] = group_events(tmp_path / "groups", relaunched.value.trigger.name, "resume")[:1]
    assert committed is not None and resume["from_step"] >= committed[0] >= 4, (
        "resumed from the last committed checkpoint"
    )


def test_a_hung_trainer_is_stopped_by_its_supervisor_with_every_billed_second_within_the_budget(
    tmp_path, monkeypatch
):
    """The trainer's own cap acts between steps; one that hangs (here: its first step never ends, SIGTERM
    included) is stopped by the platform's budget deadline. $36 per node-hour is a cent a second: $0.45 buys
    45 s, the deadline is 10 s (the grace) and 5 s (the margin) before that, at 30 s, and SIGKILL comes at the
    end of the grace, so even the seconds of a trainer that ignores SIGTERM are billed within the budget (the
    deadline used to come a grace period after the money ran out: SIGKILL at 65 s, $0.65)."""
    from tests.conftest import slow_steps_env
    from trainer.checkpoint.directory import CheckpointDir

    slow_steps_env(monkeypatch, "600")  # the trainer's test hook: the first step sleeps 10 minutes
    budget = 0.45
    op = _operator(
        tmp_path,
        steps=100,
        num_nodes=1,
        capacity="spot",
        price_per_node_hour=36.0,
        budget_usd=budget,
        deferrable=False,
        config={"checkpoint": {"grace_period_s": 10}, "cost": {"stop_margin_s": 5}},
    )
    summary = op.execute({"ti": RecordingTI()})

    assert summary["stopped"] == "budget", summary
    reason = summary["budget_stop"]["reason"]
    assert "dollar cap by its supervisor" in reason and "deadline=30" in reason, reason
    assert "SIGKILL after the 10s grace period to node(s) 0, still running" in reason, (
        reason
    )  # it saved nothing
    [group] = LocalLauncher(tmp_path / "groups").find("")  # stopped, not relaunched
    assert LocalLauncher(tmp_path / "groups").status(group).state == GroupState.AT_BUDGET
    spend = CheckpointDir(str(tmp_path / "ckpt")).spend()
    assert all(e["ended"] for e in spend.attempts.values()), spend
    # billed from the launch until the group's end was seen: SIGKILL at 40 s, and seen within the margin
    assert 0.35 < spend.total_dollars <= budget, spend
    assert summary["dollars"] == pytest.approx(spend.total_dollars)
