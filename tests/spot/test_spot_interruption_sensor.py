"""SpotInterruptionSensor with moto's SQS on 127.0.0.1 and a real local training group.

One group trains for the whole module (a real torchrun agent, 1 node × 1 process); each
test sends EventBridge-shaped messages to a fresh queue and looks at what a user would:
a "checkpoint-now" checkpoint committed while the group keeps training, the message gone
from the queue (or still there for its owner), a warning in the log.
"""

from __future__ import annotations

import json
import logging

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.sensors.spot_interruption import SpotInterruptionSensor
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.triggers.spot_interruption import SpotInterruptionTrigger
from tests.conftest import run_trigger, slow_steps_env
from tests.integration.helpers import SMALL, progress, wait_for, wait_for_step
from tests.spot.events import rebalance, sns, spot_warning, state_change

pytestmark = pytest.mark.torchrun

GROUP_INSTANCES = ["i-0a1b2c3d4e5f60001", "i-0a1b2c3d4e5f60002"]
OTHER_INSTANCE = "i-0fedcba987654321f"
GROUP = "spot-watch-r0"


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """A real local group training until stopped, checkpointing only when asked (checkpoint_every=0)."""
    root = tmp_path_factory.mktemp("spot-group")
    spec = JobSpec.from_arguments(
        **SMALL,
        steps=100_000,
        checkpoint_every=0,
        num_nodes=1,
        procs_per_node=1,
        checkpoint_uri=str(root / "ckpt"),
    )
    launcher = LocalLauncher(root / "groups")
    with pytest.MonkeyPatch.context() as env:  # it trains until the module ends: leave the CPU to the tests
        slow_steps_env(env)
        launcher.launch(GROUP, spec)
    wait_for_step(root / "ckpt", 2)
    yield launcher, root
    launcher.stop(GROUP, grace_period_s=20)
    assert launcher.processes(GROUP) == []


def _sensor(root, queue_url, **kwargs) -> SpotInterruptionSensor:
    arguments = {
        "task_id": "spot_watch",
        "group": GROUP,
        "instance_ids": GROUP_INSTANCES,
        "sqs_queue_url": queue_url,
        "local_state_dir": str(root / "groups"),
        "wait_time_seconds": 0,
    }
    return SpotInterruptionSensor(**{**arguments, **kwargs})


def _send(client, url, *bodies) -> None:
    for body in bodies:
        client.send_message(QueueUrl=url, MessageBody=body if isinstance(body, str) else json.dumps(body))


def _remaining(client, url) -> list[str]:
    messages = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
        "Messages", []
    )
    return [m["Body"] for m in messages]


def _checkpoint_now_saves(launcher) -> list[dict]:
    """The group's checkpoint-now saves so far, from its events files (it is still running)."""
    events, _ = launcher.events(GROUP)
    return [e for e in events if e["event"] == "checkpoint" and e.get("reason") == "checkpoint-now"]


def _assert_saved_and_still_training(launcher, root, saves_before: int) -> int:
    """A new checkpoint-now save is committed and the group trains on past it; returns its step."""
    wait_for(lambda: len(_checkpoint_now_saves(launcher)) > saves_before, 90, "a checkpoint-now save")
    saved = _checkpoint_now_saves(launcher)[-1]
    # progress.json names the save a moment after its event is printed (the previous test's until then)
    name = f"step-{saved['step']:08d}"
    wait_for(
        lambda: (
            (progress(root / "ckpt").get("latest_checkpoint") or "").rstrip("/").rsplit("/", 1)[-1] >= name
        ),
        30,
        f"latest_checkpoint to reach {name}",
    )
    assert (root / "ckpt" / f"step-{saved['step']:08d}" / "manifest.json").exists()
    wait_for_step(root / "ckpt", saved["step"] + 2)
    assert launcher.status(GROUP).state == GroupState.RUNNING
    return saved["step"]


def test_warning_for_an_instance_of_the_group_checkpoints_now_poke_mode(group, sqs_queue, capsys):
    launcher, root = group
    client, url = sqs_queue
    saves = len(_checkpoint_now_saves(launcher))
    other = json.dumps(spot_warning(OTHER_INSTANCE))
    _send(client, url, other, spot_warning(GROUP_INSTANCES[1]))

    result = _sensor(root, url).poke({})

    assert result.is_done
    record = result.xcom_value
    assert record["interrupted"] and record["group"] == GROUP and record["checkpoint_requested"] == 1
    assert [(n["kind"], n["instance_id"], n["action"]) for n in record["notices"]] == [
        ("spot-interruption", GROUP_INSTANCES[1], "terminate")
    ]
    assert f"spot-interruption for {GROUP_INSTANCES[1]}" in capsys.readouterr().out
    _assert_saved_and_still_training(launcher, root, saves)
    # the group's message is consumed; the other group's warning stays for its owner
    assert _remaining(client, url) == [other]


def test_warning_for_an_unrelated_instance_is_ignored(group, sqs_queue):
    launcher, root = group
    client, url = sqs_queue
    saves = len(_checkpoint_now_saves(launcher))
    step = progress(root / "ckpt")["step"]
    _send(
        client, url, spot_warning(OTHER_INSTANCE), rebalance(OTHER_INSTANCE), state_change(GROUP_INSTANCES[0])
    )

    assert not _sensor(root, url).poke({}).is_done

    wait_for_step(root / "ckpt", step + 4)
    assert len(_checkpoint_now_saves(launcher)) == saves
    assert len(_remaining(client, url)) == 3  # released for other consumers, not deleted


def test_malformed_messages_are_logged_and_skipped(group, sqs_queue, caplog):
    launcher, root = group
    client, url = sqs_queue
    caplog.set_level(logging.WARNING, logger="airflow_dtrain.aws.sqs")
    garbage = [
        "not json",
        json.dumps({"hello": "world"}),
        json.dumps({"Type": "Notification", "Message": "{broken"}),
        json.dumps({**spot_warning(GROUP_INSTANCES[0]), "detail": {"instance-id": None}}),
    ]
    _send(client, url, *garbage)
    sensor = _sensor(root, url)

    assert not sensor.poke({}).is_done  # nothing usable, and no crash

    skipped = [r.getMessage() for r in caplog.records if "Skipping malformed SQS message" in r.getMessage()]
    assert len(skipped) == len(garbage), skipped
    assert any("body is not JSON" in s for s in skipped) and any("no detail-type" in s for s in skipped)
    assert any("without a valid detail.instance-id" in s for s in skipped)

    # a valid warning behind the garbage is still acted on
    saves = len(_checkpoint_now_saves(launcher))
    _send(client, url, sns(spot_warning(GROUP_INSTANCES[0])))
    result = wait_for(lambda: (r := sensor.poke({})).is_done and r, 30, "the valid warning")
    assert result.xcom_value["notices"][0]["instance_id"] == GROUP_INSTANCES[0]
    _assert_saved_and_still_training(launcher, root, saves)


def test_rebalance_recommendation_in_deferrable_mode(group, sqs_queue):
    launcher, root = group
    client, url = sqs_queue
    saves = len(_checkpoint_now_saves(launcher))
    sensor = _sensor(root, url, deferrable=True, poke_interval=0.2)

    with pytest.raises(TaskDeferred) as deferred:  # nothing in the queue yet
        sensor.execute({})
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "airflow_dtrain.triggers.spot_interruption.SpotInterruptionTrigger"
    trigger = SpotInterruptionTrigger(**json.loads(json.dumps(kwargs)))  # as the triggerer rebuilds it

    _send(client, url, state_change(GROUP_INSTANCES[0]), sns(rebalance(GROUP_INSTANCES[0])))
    event = run_trigger(trigger, timeout=60)
    record = sensor.execute_complete({}, event)

    assert record["interrupted"] and record["checkpoint_requested"] == 1
    assert record["notices"][0]["kind"] == "rebalance-recommendation"
    _assert_saved_and_still_training(launcher, root, saves)


def test_a_group_that_ended_ends_the_watch(group, sqs_queue, tmp_path):
    _, root = group
    client, url = sqs_queue
    # a group directory whose result says it ended, as the local backend leaves it
    (tmp_path / "done-r0").mkdir()
    (tmp_path / "done-r0" / "group.json").write_text(json.dumps({"created_at": 1.0}))
    (tmp_path / "done-r0" / "result.json").write_text(
        json.dumps({"state": "succeeded", "message": "every node exited 0", "node_exit_codes": {"0": 0}})
    )
    sensor = _sensor(root, url, group="done", local_state_dir=str(tmp_path))
    assert LocalLauncher(tmp_path).status("done-r0").state == GroupState.SUCCEEDED

    result = sensor.poke({})

    assert result.is_done and result.xcom_value["interrupted"] is False
    assert result.xcom_value == {
        "interrupted": False,
        "group": "done-r0",
        "group_state": "succeeded",
        "notices": [],
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instance_ids": None}, "instance_ids / node_names / instance_source: give one"),
        ({"kinds": ["earthquake"]}, "kinds: expected some of"),
        ({"sqs_queue_url": None}, "sqs_queue_url: required unless the instances come from node taints"),
        ({"group": None}, "group / train_task_id: give one, got None / None"),
        ({"train_task_id": "train"}, "group / train_task_id: give one, got 'g' / 'train'"),
        ({"backend": "slurm"}, "backend: expected 'local' or 'kubernetes', got 'slurm'"),
        ({"wait_time_seconds": 60}, "wait_time_seconds: must be an integer 0-20, got 60"),
    ],
)
def test_bad_arguments_fail_when_the_dag_is_parsed(kwargs, message):
    arguments = {
        "task_id": "w",
        "group": "g",
        "instance_ids": GROUP_INSTANCES,
        "sqs_queue_url": "http://q",
        **kwargs,
    }
    with pytest.raises(ValueError, match="SpotInterruptionSensor\\(task_id='w'\\)") as err:
        SpotInterruptionSensor(**arguments)
    assert message in str(err.value)
