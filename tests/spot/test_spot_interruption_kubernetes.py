"""SpotInterruptionSensor(backend="kubernetes") finds its group in the namespace it is given
(a fake API server on 127.0.0.1 that the real kubernetes client talks to, and moto's SQS)."""

from __future__ import annotations

import json
import time

import pytest

from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.sensors.spot_interruption import SpotInterruptionSensor
from tests.kubernetes.conftest import launch_debug_group
from tests.kubernetes.fake_apiserver import FakeKubernetesApiServer

GROUP, NAMESPACE = "spot-k8s-r0", "training"


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    server = FakeKubernetesApiServer().start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")  # its default namespace: "default"
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}),
    )
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))  # the platform team's namespace
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    yield server
    server.stop()


def test_the_sensor_watches_the_group_in_its_namespace_not_the_connections(cluster, sqs_queue, tmp_path):
    _, url = sqs_queue
    launcher = launch_debug_group(GROUP, tmp_path, namespace=NAMESPACE)
    cluster.run(GROUP, namespace=NAMESPACE)
    assert launcher.status(GROUP).state == GroupState.RUNNING and cluster.jobs("default") == []

    def sensor(**kwargs) -> SpotInterruptionSensor:
        return SpotInterruptionSensor(
            task_id="spot_watch",
            group="spot-k8s",
            node_names=["ip-10-0-0-1"],
            sqs_queue_url=url,
            backend="kubernetes",
            wait_time_seconds=0,
            **kwargs,
        )

    # No notice and the group runs in "training": keep watching.
    assert sensor(namespace=NAMESPACE).poke({}).is_done is False

    # A node is reclaimed (its pod exits 75 after the checkpoint): the group ends preempted, and the watch
    # with it.
    cluster.exit(GROUP, 0, 75, namespace=NAMESPACE, disruption="PreemptionByScheduler")
    ended = sensor(namespace=NAMESPACE).poke({})
    assert ended.is_done and ended.xcom_value == {
        "interrupted": False,
        "group": GROUP,
        "group_state": "preempted",
        "notices": [],
    }
    # A sensor looking in the connection's namespace never sees the group, and would watch on until its
    # timeout.
    assert sensor().poke({}).is_done is False


def _asked(cluster) -> list[str]:
    """The pods asked to checkpoint now, in order: each PATCH of a pod's checkpoint-now annotation."""
    return [
        path.rsplit("/", 1)[-1] for method, path in cluster.requests if method == "PATCH" and "/pods/" in path
    ]


def test_beside_the_train_task_every_warning_of_every_relaunch_is_acted_on_until_training_ends(
    cluster, tmp_path
):
    """The bundled DAG's set-up: the sensor names the train task, not a group, and has no queue
    and no instance list; it watches the nodes of that task's groups through their taints."""
    from airflow_dtrain.job.naming import group_base_name
    from tests.conftest import RecordingTI

    ti = RecordingTI(dag_id="train_llama", run_id="manual__2026-11-22T05:00:00+00:00", task_id="spot_watch")
    base = group_base_name(ti.dag_id, ti.run_id, "train_spot", -1)
    for i in (1, 2, 3):
        cluster.add_node(f"ip-10-0-0-{i}", f"i-00000000000000{i:03d}")

    sensor = SpotInterruptionSensor(
        task_id="spot_watch",
        train_task_id="train_spot",
        backend="kubernetes",
        namespace=NAMESPACE,
        sqs_queue_url="{{ params.interruption_queue_url or None }}",
    )
    sensor.sqs_queue_url = "None"  # as the template renders without a queue
    assert sensor.follow_relaunches_s == 600

    def poke():
        return sensor.poke({"ti": ti})

    assert poke().is_done is False  # the train task has not launched yet
    launch_debug_group(f"{base}-r0", tmp_path, namespace=NAMESPACE)
    cluster.run(f"{base}-r0", namespace=NAMESPACE, nodes={0: "ip-10-0-0-1", 1: "ip-10-0-0-2"})
    assert poke().is_done is False and _asked(cluster) == []

    cluster.taint("ip-10-0-0-2", "aws-node-termination-handler/spot-itn")
    assert poke().is_done is False  # acted on, and the watch goes on
    pods_r0 = sorted(cluster.pod(f"{base}-r0", i, namespace=NAMESPACE)["metadata"]["name"] for i in (0, 1))
    assert sorted(_asked(cluster)) == pods_r0  # every pod of the group, once
    assert poke().is_done is False and len(_asked(cluster)) == 2  # the taint stays; it is not acted on twice

    # The node goes: the group ends preempted; the train task relaunches it on another node.
    cluster.exit(f"{base}-r0", 1, 75, namespace=NAMESPACE, disruption="PreemptionByScheduler")
    assert poke().is_done is False  # a relaunch is expected
    launch_debug_group(f"{base}-r1", tmp_path, namespace=NAMESPACE)
    cluster.run(f"{base}-r1", namespace=NAMESPACE, nodes={0: "ip-10-0-0-1", 1: "ip-10-0-0-3"})
    assert poke().is_done is False
    cluster.taint("ip-10-0-0-3", "aws-node-termination-handler/rebalance-recommendation")
    assert poke().is_done is False and len(_asked(cluster)) == 4

    for index in (0, 1):
        cluster.exit(f"{base}-r1", index, 0, namespace=NAMESPACE)
    record = poke().xcom_value  # training is over: so is the watch
    assert (
        record["interrupted"],
        record["group"],
        record["group_state"],
        record["checkpoint_requested"],
    ) == (True, f"{base}-r1", "succeeded", 4)
    assert [(n["group"], n["kind"], n["node_name"], n["source"]) for n in record["notices"]] == [
        (f"{base}-r0", "spot-interruption", "ip-10-0-0-2", "node-taint"),
        (f"{base}-r1", "rebalance-recommendation", "ip-10-0-0-3", "node-taint"),
    ]


def test_following_a_preempted_group_that_is_not_relaunched_ends_after_the_grace(cluster, tmp_path):
    launch_debug_group("alone-r0", tmp_path, namespace=NAMESPACE)
    cluster.run("alone-r0", namespace=NAMESPACE)
    cluster.exit("alone-r0", 0, 75, namespace=NAMESPACE, disruption="PreemptionByScheduler")
    sensor = SpotInterruptionSensor(
        task_id="w", group="alone", backend="kubernetes", namespace=NAMESPACE, follow_relaunches_s=1.0
    )
    assert sensor.poke({}).is_done is False
    time.sleep(1.1)
    record = sensor.poke({}).xcom_value
    assert record == {"interrupted": False, "group": "alone-r0", "group_state": "preempted", "notices": []}


def test_by_default_a_karpenter_disruption_taint_asks_the_group_to_checkpoint(
    cluster, tmp_path, statsd_listener
):
    """On a Karpenter cluster that handles spot warnings itself, the node's only sign is
    Karpenter's taint; the default kinds act on it. Scheduled maintenance (days away) is not."""
    cluster.add_node("ip-10-0-0-7", "i-00000000000000007")
    cluster.add_node("ip-10-0-0-8", "i-00000000000000008")
    launch_debug_group("karp-r0", tmp_path, namespace=NAMESPACE)
    cluster.run("karp-r0", namespace=NAMESPACE, nodes={0: "ip-10-0-0-7", 1: "ip-10-0-0-8"})
    sensor = SpotInterruptionSensor(task_id="w", group="karp", backend="kubernetes", namespace=NAMESPACE)

    cluster.taint("ip-10-0-0-7", "aws-node-termination-handler/scheduled-maintenance")
    assert sensor.poke({}).is_done is False and _asked(cluster) == []
    cluster.taint("ip-10-0-0-8", "karpenter.sh/disrupted")
    record = sensor.poke({}).xcom_value
    assert (record["interrupted"], record["checkpoint_requested"]) == (True, 2)
    assert [(n["kind"], n["node_name"]) for n in record["notices"]] == [("disruption", "ip-10-0-0-8")]
    assert len(_asked(cluster)) == 2
    statsd_listener.wait_for("dtrain.spot.node_disruption:1|c")  # its own counter, not a spot warning
    assert "dtrain.spot.interruption_warning" not in statsd_listener.names()


def test_following_relaunches_in_reschedule_mode_is_refused_naming_the_mode():
    with pytest.raises(ValueError, match=r"task_id='w'\): mode: 'reschedule'.*follow_relaunches_s=600"):
        SpotInterruptionSensor(
            task_id="w", train_task_id="train_spot", backend="kubernetes", mode="reschedule"
        )
    # Deferrable, or a single-shot watch of one group, keeps nothing between pokes that matters.
    SpotInterruptionSensor(
        task_id="w", train_task_id="train_spot", backend="kubernetes", mode="reschedule", deferrable=True
    )
    SpotInterruptionSensor(task_id="w", group="g", backend="kubernetes", mode="reschedule")
