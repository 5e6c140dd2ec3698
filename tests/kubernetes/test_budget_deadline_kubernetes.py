"""The cluster enforces the budget too: each group's Job gets the activeDeadlineSeconds that the money left
buys at the group's price, recomputed from the spend ledger at every relaunch; the fake API server's Job
controller stops a group that runs into it with nobody watching, and the task then ends at the budget;
finished Jobs are deleted after ttlSecondsAfterFinished without losing the task's preemption count."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from airflow.exceptions import TaskDeferred

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.operators.fsdp_train import TrainingFailed
from tests.conftest import RecordingTI
from tests.kubernetes.conftest import Background

# fixtures: the zone's spot price history
from tests.spot.conftest import moto_server, spot_market  # noqa: F401
from trainer.checkpoint.directory import CheckpointDir

BUDGET, PRICE, NODES, STEPS = 5.0, 3.6, 2, 20  # the group costs $7.20/h: the budget buys 2,500 s of it
GRACE, MARGIN = 110, 30  # the trainer's default checkpoint.grace_period_s and cost.stop_margin_s


def _operator(tmp_path: Path, **overrides) -> FSDPTrainOperator:
    return FSDPTrainOperator(**{
        "task_id": "train", "flavor": "debug", "steps": STEPS, "global_batch_size": 4, "micro_batch_size": 2,
        "num_nodes": NODES, "backend": "kubernetes", "checkpoint_uri": str(tmp_path / "ckpt"),
        "budget_usd": BUDGET, "price_per_node_hour": PRICE,
        "kubernetes": {"image": "ghcr.io/acme/dtrain:test",
                       "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}]},
        "poll_interval": 0.05, "deferrable": False, **overrides,
    })  # fmt: skip


def _expected_deadline(spent: float) -> float:
    """What the test computes by hand: the money left over the group's $/s, less the grace for a final save
    and the margin for the exit (so that what SIGKILL ends is ended within the budget)."""
    return (BUDGET - spent) / (PRICE * NODES) * 3600 - GRACE - MARGIN


def _wait(predicate, what: str, task: Background | None = None, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if task is not None and task.done:
            task.result()  # it ended early: its error says why
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _finish(fake, name: str, ckpt: Path) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "progress.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "step": STEPS,
                "steps": STEPS,
                "loss": 2.5,
                "tokens_seen": STEPS * 512,
                "latest_checkpoint": str(ckpt / f"step-{STEPS:08d}"),
                "steps_lost": 0,
                "wall_time_s": 1.0,
            }
        )
    )
    for index in range(NODES):
        fake.exit(name, index, 0)


def test_the_jobs_deadline_is_what_the_budget_left_buys_and_a_relaunch_shrinks_it_by_the_spend(
    fake, tmp_path
):
    op, ti = _operator(tmp_path), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    first = _wait(lambda: ti.xcoms.get("group"), "the first group", task)
    job = fake.get("jobs", first)
    assert abs(job["spec"]["activeDeadlineSeconds"] - _expected_deadline(0.0)) <= 1  # 2,360 s
    assert job["spec"]["ttlSecondsAfterFinished"] == 86_400

    # The group trains; its rank 0 keeps its spend file current (here: $2.00 so far), then a node is
    # reclaimed.
    fake.run(first)
    ledger = CheckpointDir(str(tmp_path / "ckpt"))
    ledger.record_spend(first, {**ledger.spend_entry(first), "dollars": 2.0, "updated_at": time.time()})
    fake.exit(first, 1, 75)
    second = _wait(lambda: ti.xcoms.get("group") != first and ti.xcoms.get("group"), "the relaunch", task)

    relaunched = fake.get("jobs", second)
    spent = json.loads(relaunched["metadata"]["annotations"]["airflow-dtrain/deadline"])["spent_usd"]
    assert spent == pytest.approx(2.0, abs=0.01)  # the ledger's spend, not the first group's deadline
    assert abs(relaunched["spec"]["activeDeadlineSeconds"] - _expected_deadline(2.0)) <= 1  # 1,360 s
    assert relaunched["spec"]["activeDeadlineSeconds"] < job["spec"]["activeDeadlineSeconds"]

    fake.run(second)
    _finish(fake, second, tmp_path / "ckpt")
    summary = task.result()
    assert summary["preemptions"] == 1 and "stopped" not in summary


def test_no_budget_still_a_deadline_the_runtime_ceiling(fake, tmp_path, monkeypatch):
    op, ti = _operator(tmp_path, budget_usd=None, deferrable=True), RecordingTI()
    with pytest.raises(TaskDeferred):
        op.execute({"ti": ti})
    job = fake.get("jobs", ti.xcoms["group"])
    assert job["spec"]["activeDeadlineSeconds"] == 86_400  # the platform's default max_runtime_s
    assert json.loads(job["metadata"]["annotations"]["airflow-dtrain/deadline"])["by"] == "max_runtime_s"
    # only an admin can take the ceiling away
    monkeypatch.setenv("AIRFLOW__DTRAIN__LIMITS", '{"max_runtime_s": null}')
    op, ti = _operator(tmp_path / "other", budget_usd=None, deferrable=True), RecordingTI(run_id="other")
    with pytest.raises(TaskDeferred):
        op.execute({"ti": ti})
    assert "activeDeadlineSeconds" not in fake.get("jobs", ti.xcoms["group"])["spec"]


def test_a_group_left_running_with_its_airflow_side_gone_is_stopped_by_the_cluster_at_the_budget(
    fake, tmp_path
):
    op, ti = _operator(tmp_path, deferrable=True), RecordingTI()
    with pytest.raises(TaskDeferred):
        op.execute(
            {"ti": ti}
        )  # the group is launched, the task defers ... and the triggerer, worker, scheduler die
    name = ti.xcoms["group"]
    fake.run(name)
    deadline = fake.get("jobs", name)["spec"]["activeDeadlineSeconds"]

    fake.advance(deadline - 5)  # nobody calls the API: the cluster's own controllers act
    assert [fake.pod(name, i)["status"]["phase"] for i in range(NODES)] == ["Running"] * NODES
    fake.advance(10)
    job = fake.get("jobs", name)
    [failed] = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "DeadlineExceeded"
    with pytest.raises(KeyError):
        fake.pod(name, 0)  # its pods are gone: nothing is billed any more

    # The Airflow side comes back (a retry of the task): the group ended at the budget, not failed.
    status = KubernetesLauncher().status(name)
    assert status.state == GroupState.AT_BUDGET
    assert f"activeDeadlineSeconds={deadline}" in status.message and "$5.00 budget" in status.message
    retry, retry_ti = _operator(tmp_path), RecordingTI()
    summary = retry.execute({"ti": retry_ti})
    assert summary["stopped"] == "budget" and summary["group"] == name
    assert "dollar cap by the cluster" in summary["budget_stop"]["reason"]
    assert fake.jobs() == [name], "no group launched after the budget was spent"


def test_finished_jobs_are_deleted_after_their_ttl_and_the_task_still_counts_their_preemptions(
    fake, tmp_path, monkeypatch
):
    monkeypatch.setenv(
        "AIRFLOW__DTRAIN__LIMITS", '{"max_runtime_s": null}'
    )  # the second group outlives a day
    op, ti = _operator(tmp_path, budget_usd=None, max_preemptions=1), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    first = _wait(lambda: ti.xcoms.get("group"), "the first group", task)
    fake.run(first)
    fake.exit(first, 0, 75)
    second = _wait(lambda: ti.xcoms.get("group") != first and ti.xcoms.get("group"), "the relaunch", task)
    fake.run(second)

    fake.advance(86_400 + 1)  # a day after the first group ended: the TTL controller deletes its Job
    assert fake.jobs() == [second]
    assert fake.names("configmaps") == [f"{second}-config"] and fake.names("services") == [second]
    assert KubernetesLauncher().status(first).state == GroupState.PREEMPTED  # remembered by the second Job

    fake.exit(second, 0, 75)
    error = task.error()
    assert isinstance(error, TrainingFailed)
    assert "preempted 2 times, more than max_preemptions=1" in str(error)


def test_every_group_is_stopped_before_the_money_runs_out_with_its_final_save_paid_for():
    """A program of your own has no guard of its own: its Job's deadline comes the grace and the stop margin
    before the money runs out, so SIGTERM, its save and its exit are billed within the budget. The bundled
    trainer stops itself before the cap; its deadline is the same, a backstop that ends even a hung trainer,
    SIGKILL included, within the budget (it used to come a grace period after the money ran out)."""
    from airflow_dtrain.kubernetes.objects import render_group
    from airflow_dtrain.job.spec import JobSpec

    def job(**own):
        spec = JobSpec.from_arguments(
            steps=STEPS,
            num_nodes=NODES,
            backend="kubernetes",
            checkpoint_uri="s3://ckpt/own",
            budget_usd=BUDGET,
            price_per_node_hour=PRICE,
            kubernetes={"image": "registry.example.com/own-trainer:1"},
            config={"checkpoint": {"grace_period_s": 60}, "cost": {"stop_margin_s": 20}},
            **own,
        )
        return render_group("own-r0", spec, namespace="ml", spent_usd=1.0)[2]

    left_s = (BUDGET - 1.0) / (PRICE * NODES) * 3600  # 2,000 s
    bundled, own = job(), job(entrypoint=["/opt/own/train.py"])
    for job in (bundled, own):
        assert job["spec"]["activeDeadlineSeconds"] == pytest.approx(left_s - 60 - 20, abs=1)  # 1,920 s
        pod = job["spec"]["template"]["spec"]
        assert job["spec"]["activeDeadlineSeconds"] + pod["terminationGracePeriodSeconds"] <= left_s + 1
        how = json.loads(job["metadata"]["annotations"]["airflow-dtrain/deadline"])
        assert (how["save"], how["grace_s"], how["margin_s"]) == ("within", 60, 20)


def test_a_spot_price_rise_brings_the_jobs_deadline_forward_and_the_cluster_stops_it_there(
    fake, tmp_path, spot_market
):
    """Quoted $3.60/node-h, the Job gets 2,610 s; EC2 bills $7.20. The watch reads the zone's price and
    patches activeDeadlineSeconds to what the money left buys at $7.20 (1,250 s, less the grace and the
    margin), so the cluster stops the group within the budget even if the Airflow side goes away now."""
    spot_market.set("us-east-1", {("p3.2xlarge", "us-east-1a"): [(3, 2 * PRICE)]})
    op = _operator(tmp_path, capacity="spot", zone="us-east-1a", instance_type="p3.2xlarge",
                   spot_price_refresh_s=0.5)  # fmt: skip
    ti = RecordingTI()
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group", task)
    fake.run(name)
    job = _wait(
        lambda: (j := fake.get("jobs", name))["spec"]["activeDeadlineSeconds"] < 2000 and j,
        "the deadline at the price in effect",
        task,
    )
    assert (
        abs(job["spec"]["activeDeadlineSeconds"] - (BUDGET / (2 * PRICE * NODES) * 3600 - GRACE - MARGIN))
        <= 2
    )
    said = json.loads(job["metadata"]["annotations"]["airflow-dtrain/deadline"])
    assert said["usd_per_hour"] == pytest.approx(2 * PRICE * NODES) and "repriced" in said

    fake.advance(
        job["spec"]["activeDeadlineSeconds"] + 1
    )  # nobody needs to call the API: the Job controller acts
    summary = task.result()
    assert summary["stopped"] == "budget", summary
    assert "$14.4000/h" in summary["budget_stop"]["reason"], summary["budget_stop"]
