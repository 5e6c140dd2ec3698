"""FSDPTrainOperator(backend="kubernetes") against a fake API server, through the real kubernetes client.

The fake plays the cluster (the Job controller, the pods' phases, exit codes and logs);
each test drives it the way a cluster would behave and asserts on what the Airflow user
sees: the task's result, its error, its log, and what is left in the cluster.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from pathlib import Path

import pytest
from airflow.exceptions import TaskDeferred

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.operators.fsdp_train import TrainingFailed
from tests.conftest import RecordingTI, run_trigger
from tests.kubernetes.conftest import Background

STEPS = 20


def _operator(tmp_path: Path, *, kubernetes: dict | None = None, **overrides) -> FSDPTrainOperator:
    arguments = {
        "task_id": "train",
        "flavor": "debug",
        "steps": STEPS,
        "global_batch_size": 4,
        "micro_batch_size": 2,
        "num_nodes": 2,
        "procs_per_node": 1,
        "backend": "kubernetes",
        # a path on a PVC that the Airflow worker mounts too (here: the test's tmp dir)
        "checkpoint_uri": str(tmp_path / "ckpt"),
        "kubernetes": {
            "image": "ghcr.io/acme/dtrain:test",
            "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}],
            "pending_timeout_s": 60,
            **(kubernetes or {}),
        },
        "poll_interval": 0.05,
        "deferrable": True,
        **overrides,
    }
    return FSDPTrainOperator(**arguments)


def _defer(op: FSDPTrainOperator, ti: RecordingTI) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    return deferred.value


def _complete(op, ti, deferred: TaskDeferred, event: dict):
    return getattr(op, deferred.method_name)({"ti": ti}, event=event, **(deferred.kwargs or {}))


def _rebuilt(trigger):
    """The trigger as the triggerer rebuilds it from its serialised form."""
    classpath, kwargs = trigger.serialize()
    module, _, cls = classpath.rpartition(".")
    return getattr(importlib.import_module(module), cls)(**json.loads(json.dumps(kwargs)))


def _train(ckpt: Path, step: int, status: str = "running") -> None:
    """Write progress.json as rank 0 of the trainer does."""
    ckpt.mkdir(parents=True, exist_ok=True)
    progress = {
        "status": status, "step": step, "steps": STEPS, "loss": 2.5, "tokens_seen": step * 4 * 128,
        "latest_checkpoint": str(ckpt / f"step-{step:08d}"), "steps_lost": 0, "wall_time_s": 1.0,
    }  # fmt: skip
    (ckpt / "progress.json").write_text(json.dumps(progress))


def _finish(fake, name: str, ckpt: Path, nodes: int = 2) -> None:
    _train(ckpt, STEPS, "completed")
    for index in range(nodes):
        fake.exit(name, index, 0)


def _wait(predicate, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_group_goes_pending_running_succeeded_and_the_task_returns_its_summary(fake, tmp_path):
    op, ti = _operator(tmp_path), RecordingTI()
    deferred = _defer(op, ti)
    name = deferred.trigger.name
    launcher = KubernetesLauncher()

    assert fake.jobs() == [name] and fake.names("services") == [name]
    assert fake.names("configmaps") == [f"{name}-config"]
    assert launcher.status(name).state == GroupState.PENDING
    assert [fake.pod(name, i)["status"]["phase"] for i in (0, 1)] == ["Pending", "Pending"]

    watch = Background(run_trigger, _rebuilt(deferred.trigger), timeout=30)
    fake.run(name)
    assert launcher.status(name).state == GroupState.RUNNING
    _train(tmp_path / "ckpt", 10)
    assert not watch.done, "a running group keeps the trigger waiting"
    _finish(fake, name, tmp_path / "ckpt")
    event = watch.result()

    assert event["status"] == "success", event
    summary = _complete(op, ti, deferred, event)
    assert summary["final_step"] == STEPS and summary["group"] == name
    assert summary["preemptions"] == 0 and summary["relaunches"] == 0
    assert ti.xcoms["group"] == name
    assert (tmp_path / "ckpt" / "summary.json").is_file()
    # the ConfigMap and Service are owned by the Job: deleting the Job cleans up everything
    uid = fake.get("jobs", name)["metadata"]["uid"]
    for kind, object_name in (("services", name), ("configmaps", f"{name}-config")):
        assert [o["uid"] for o in fake.get(kind, object_name)["metadata"]["ownerReferences"]] == [uid]


def test_a_disrupted_pod_relaunches_the_group_from_the_checkpoint_and_it_finishes(fake, tmp_path):
    op, ti = _operator(tmp_path), RecordingTI()
    deferred = _defer(op, ti)
    first = deferred.trigger.name
    fake.run(first)
    _train(tmp_path / "ckpt", 10)
    # spot reclaim: node 1 is drained, its pod killed with a DisruptionTarget condition
    fake.exit(first, 1, 137, disruption="TerminationByKubelet")

    event = run_trigger(deferred.trigger, timeout=30)
    assert event["status"] == "preempted", event
    assert "node 1" in event["message"] and "disrupted" in event["message"]
    with pytest.raises(TaskDeferred) as relaunched:
        _complete(op, ti, deferred, event)
    second = relaunched.value.trigger.name
    assert second.endswith("-r1") and second[:-3] == first[:-3]

    # the preempted group is ended by its Job's deadline (no pod left, the Job finished: not suspended, which
    # no TTL deletes and Kueue would requeue); the new one resumes from the same checkpoint
    ended = fake.get("jobs", first)
    assert ended["spec"]["activeDeadlineSeconds"] == 1 and not ended["spec"].get("suspend"), ended["spec"]
    assert [c["reason"] for c in ended["status"]["conditions"] if c["type"] == "Failed"] == [
        "DeadlineExceeded"
    ]
    left = {fake.get("pods", p)["status"]["phase"] for p in fake.names("pods") if p.startswith(first)}
    assert left <= {"Failed"}, f"pods of the preempted group still alive: {left}"
    configs = [
        json.loads(fake.get("configmaps", f"{n}-config")["data"]["train_config.json"])
        for n in (first, second)
    ]
    assert configs[0]["checkpoint"]["uri"] == configs[1]["checkpoint"]["uri"] == str(tmp_path / "ckpt")
    assert KubernetesLauncher().status(first).state == GroupState.PREEMPTED

    fake.run(second)
    _finish(fake, second, tmp_path / "ckpt")
    summary = _complete(op, ti, relaunched.value, run_trigger(relaunched.value.trigger, timeout=30))
    assert summary["final_step"] == STEPS
    assert summary["preemptions"] == 1 and summary["relaunches"] == 1

    fake.advance(86_400 + 1)  # a day later the TTL controller has deleted both Jobs, the ended one too
    assert fake.jobs() == [] and fake.names("services") == [] and fake.names("configmaps") == []
    assert ti.xcoms["group"] == second


def test_a_node_exiting_75_is_a_preemption_and_the_watching_worker_relaunches(fake, tmp_path):
    op, ti = _operator(tmp_path, deferrable=False), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    first = _wait(lambda: ti.xcoms.get("group"), "the group")
    fake.run(first)
    fake.exit(first, 0, 75)  # SIGTERM from a spot notice: saved a checkpoint, exited "preempted"

    second = _wait(lambda: [j for j in fake.jobs() if j != first], "the relaunched group")[0]
    fake.run(second)
    _finish(fake, second, tmp_path / "ckpt")
    summary = task.result()
    assert summary["preemptions"] == 1 and summary["relaunches"] == 1
    assert KubernetesLauncher().status(first).message.endswith("exited 75 (preempted, resumable)")


def test_a_restarted_worker_reattaches_instead_of_creating_a_second_job(fake, tmp_path):
    first = _defer(_operator(tmp_path), RecordingTI(run_id="manual__reattach"))
    fake.run(first.trigger.name)

    # the worker died; Airflow runs the task again with a fresh operator instance
    second = _defer(_operator(tmp_path), RecordingTI(run_id="manual__reattach"))

    assert second.trigger.name == first.trigger.name
    assert fake.jobs() == [first.trigger.name]
    assert [r for r in fake.requests if r[0] == "POST" and r[1].endswith("/jobs")] == [
        ("POST", "/apis/batch/v1/namespaces/default/jobs")
    ], "exactly one Job was ever created"


def test_on_kill_deletes_the_job_service_configmap_and_pods(fake, tmp_path):
    op, ti = _operator(tmp_path, deferrable=False), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group")
    fake.run(name)
    _wait(lambda: KubernetesLauncher().status(name).state == GroupState.RUNNING, "running")

    op.on_kill()

    assert fake.jobs() == [] and fake.names("services") == [] and fake.names("configmaps") == []
    assert fake.names("pods") == [], "foreground deletion removes the Job's pods"
    assert isinstance(task.error(), TrainingFailed)


def test_killing_the_deferred_task_deletes_the_group(fake, tmp_path):
    deferred = _defer(_operator(tmp_path), RecordingTI())
    fake.run(deferred.trigger.name)
    asyncio.run(_rebuilt(deferred.trigger).on_kill())  # the user marks the deferred task failed
    assert fake.jobs() == [] and fake.names("services") == [] and fake.names("pods") == []


def test_a_group_pending_past_the_timeout_fails_saying_there_is_no_capacity(fake, tmp_path):
    op = _operator(tmp_path, deferrable=False, kubernetes={"pending_timeout_s": 5, "capacity_type": "spot"})
    ti = RecordingTI()
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group")
    fake.run(name, [0])
    fake.unschedulable(name, 1, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")

    error = task.error(timeout=30)

    assert isinstance(error, TrainingFailed)
    message = str(error)
    assert "no capacity" in message and "pending_timeout_s=5" in message
    assert "node 1: Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu." in message
    assert fake.names("pods") == [], "the stuck group does not linger, half-scheduled, holding a GPU node"
    assert fake.jobs() == [name], "the Job stays, with its verdict, for kubectl describe"


def test_a_pod_exiting_1_fails_the_task_with_that_pods_last_log_lines(fake, tmp_path):
    op, ti = _operator(tmp_path, deferrable=False), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group")
    fake.run(name)
    fake.log(name, 0, "[rank0]: step 1 loss 5.51")
    fake.log(name, 1, "[rank1]: Traceback (most recent call last):",
             "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")  # fmt: skip
    fake.exit(name, 1, 1)

    error = task.error()

    assert isinstance(error, TrainingFailed) and not isinstance(error, TaskDeferred)
    message = str(error)
    assert "failed" in message and "node 1" in message and "exited 1" in message
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in message
    assert len(fake.jobs()) == 1, "a failure is not relaunched"


def test_pod_logs_reach_the_task_log_while_the_group_runs(fake, tmp_path, capfd):
    op, ti = _operator(tmp_path, deferrable=False), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group")
    fake.run(name)
    output: list[str] = []

    def logged(text: str) -> bool:
        output.append(capfd.readouterr().out)
        return text in "".join(output)

    fake.log(name, 0, "[rank0]: step 1 loss 5.51")
    fake.log(name, 1, "[rank1]: step 1 loss 5.49")
    _wait(
        lambda: logged("[node0][rank0]: step 1 loss 5.51") and logged("[node1][rank1]: step 1 loss 5.49"),
        "logs",
    )
    fake.log(name, 0, "[rank0]: step 2 loss 5.12")
    _wait(lambda: logged("[node0][rank0]: step 2 loss 5.12"), "the next line")
    assert not task.done, "the lines arrived while the group was still running"

    _finish(fake, name, tmp_path / "ckpt")
    assert task.result()["final_step"] == STEPS
    assert "".join(output).count("step 1 loss 5.51") == 1, "no line is logged twice"


def test_the_task_instance_and_job_reach_the_pods_as_statsd_tags(fake, tmp_path):
    """What tells this run's metrics from every other's: in the trainer's config (ConfigMap) and the pods'
    env."""
    from trainer.base.statsd import parse_tags

    run_id = "manual__2026-05-01T09:30:00+00:00"
    op = _operator(tmp_path, job="demo", kubernetes={"statsd_host": "node"})
    name = _defer(op, RecordingTI(dag_id="train_llama", run_id=run_id)).trigger.name
    config = json.loads(fake.get("configmaps", f"{name}-config")["data"]["train_config.json"])
    expected = {
        "dag_id": "train_llama",
        "run_id": run_id,
        "task_id": "train",
        "map_index": "-1",
        "job": "demo",
    }
    assert parse_tags(config["metrics"]["statsd_tags"]) == expected
    container = fake.get("jobs", name)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert parse_tags(env["DTRAIN_STATSD_TAGS"]) == expected  # for a program of your own
    op.on_kill()
