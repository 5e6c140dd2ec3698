"""SpotInterruptionSensor(backend="kubernetes") finds its group in the namespace it is given
(a fake API server on 127.0.0.1 that the real kubernetes client talks to, and moto's SQS)."""

from __future__ import annotations

import json

import pytest

from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.kubernetes import KubernetesLauncher
from airflow_dtrain.sensors.spot_interruption import SpotInterruptionSensor
from airflow_dtrain.spec import JobSpec
from tests.kubernetes.fake_apiserver import FakeKubernetesApiServer

GROUP, NAMESPACE = "spot-k8s-r0", "training"


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    server = FakeKubernetesApiServer().start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")  # its default namespace: "default"
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT",
                       json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))  # the platform team's namespace
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    yield server
    server.stop()


def test_the_sensor_watches_the_group_in_its_namespace_not_the_connections(cluster, sqs_queue, tmp_path):
    _, url = sqs_queue
    spec = JobSpec.from_arguments(
        flavor="debug", steps=10, global_batch_size=2, micro_batch_size=1, num_nodes=2, procs_per_node=1,
        backend="kubernetes", checkpoint_uri=str(tmp_path / "ckpt"),
        kubernetes={"image": "ghcr.io/acme/dtrain:test", "namespace": NAMESPACE,
                    "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}]},
    )  # fmt: skip
    launcher = KubernetesLauncher(namespace=NAMESPACE)
    launcher.launch(GROUP, spec.to_dict())
    cluster.run(GROUP, namespace=NAMESPACE)
    assert launcher.status(GROUP).state == GroupState.RUNNING and cluster.jobs("default") == []

    def sensor(**kwargs) -> SpotInterruptionSensor:
        return SpotInterruptionSensor(task_id="spot_watch", group="spot-k8s", node_names=["ip-10-0-0-1"],
                                      sqs_queue_url=url, backend="kubernetes", wait_time_seconds=0, **kwargs)

    # No notice and the group runs in "training": keep watching.
    assert sensor(namespace=NAMESPACE).poke({}).is_done is False

    # A node is reclaimed (its pod exits 75 after the checkpoint): the group ends preempted, and the watch with it.
    cluster.exit(GROUP, 0, 75, namespace=NAMESPACE, disruption="PreemptionByScheduler")
    ended = sensor(namespace=NAMESPACE).poke({})
    assert ended.is_done and ended.xcom_value == {
        "interrupted": False, "group": GROUP, "group_state": "preempted", "notices": []}
    # A sensor looking in the connection's namespace never sees the group, and would watch on until its timeout.
    assert sensor().poke({}).is_done is False


def test_beside_the_train_task_a_node_taint_asks_the_kubernetes_group_to_checkpoint_now(cluster, tmp_path):
    """The bundled DAG's set-up: the sensor names the train task, not a group, and has no queue
    and no instance list; it watches the nodes of that task's newest group through their taints."""
    from airflow_dtrain.spec import group_base_name
    from tests.conftest import RecordingTI

    ti = RecordingTI(dag_id="train_llama", run_id="manual__2026-11-22T05:00:00+00:00", task_id="spot_watch")
    group = group_base_name(ti.dag_id, ti.run_id, "train_spot", -1) + "-r1"  # relaunched once already
    spec = JobSpec.from_arguments(
        flavor="debug", steps=10, global_batch_size=2, micro_batch_size=1, num_nodes=2, procs_per_node=1,
        backend="kubernetes", checkpoint_uri=str(tmp_path / "ckpt"),
        kubernetes={"image": "ghcr.io/acme/dtrain:test", "namespace": NAMESPACE,
                    "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}]},
    )  # fmt: skip
    KubernetesLauncher(namespace=NAMESPACE).launch(group, spec.to_dict())
    for i in (1, 2):
        cluster.add_node(f"ip-10-0-0-{i}", f"i-00000000000000{i:03d}")
    cluster.run(group, namespace=NAMESPACE, nodes={0: "ip-10-0-0-1", 1: "ip-10-0-0-2"})
    cluster.exec_handler = lambda ns, pod, container, command: ("1\n", "", 0)  # one trainer per pod signalled

    sensor = SpotInterruptionSensor(task_id="spot_watch", train_task_id="train_spot", backend="kubernetes",
                                    namespace=NAMESPACE, sqs_queue_url="{{ params.interruption_queue_url or None }}")
    sensor.sqs_queue_url = "None"  # as the template renders without a queue
    assert sensor.poke({"ti": ti}).is_done is False and cluster.execs == []

    cluster.taint("ip-10-0-0-2", "aws-node-termination-handler/spot-itn")
    record = sensor.poke({"ti": ti}).xcom_value
    assert (record["interrupted"], record["group"], record["checkpoint_requested"]) == (True, group, 2)
    [notice] = record["notices"]
    assert (notice["kind"], notice["instance_id"], notice["node_name"], notice["source"]) == (
        "spot-interruption", "i-00000000000000002", "ip-10-0-0-2", "node-taint")
    assert sorted(pod for _, pod, _, _ in cluster.execs) == sorted(
        cluster.pod(group, i, namespace=NAMESPACE)["metadata"]["name"] for i in (0, 1))  # every pod of the group
