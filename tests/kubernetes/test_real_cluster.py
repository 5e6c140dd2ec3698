"""The debug flavour on a real cluster (kind or k3d), CPU pods: skipped unless one is provided.

    kind create cluster && docker build -f docker/Dockerfile -t dtrain-trainer:dev \\
        --build-arg BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime . \\
        && kind load docker-image dtrain-trainer:dev
    DTRAIN_TEST_KUBECONFIG=~/.kube/config DTRAIN_TEST_IMAGE=dtrain-trainer:dev \\
        .venv/bin/python -m pytest tests/kubernetes/test_real_cluster.py

It creates (and deletes) a namespace and a ReadWriteOnce PVC for the checkpoints: kind's
and k3d's local-path provisioner put both pods on the cluster's single node with it.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.job.spec import JobSpec

KUBECONFIG = os.environ.get("DTRAIN_TEST_KUBECONFIG")
IMAGE = os.environ.get("DTRAIN_TEST_IMAGE", "dtrain-trainer:dev")

pytestmark = pytest.mark.skipif(
    not KUBECONFIG,
    reason="needs a real cluster: set DTRAIN_TEST_KUBECONFIG to a kind/k3d kubeconfig "
    "and DTRAIN_TEST_IMAGE to the trainer image loaded into it (see this module's docstring)",
)


@pytest.fixture
def namespace(monkeypatch):
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT",
        json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": os.path.expanduser(KUBECONFIG)}}
        ),
    )
    core = KubernetesHook().core_v1_client
    name = f"dtrain-test-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_service_account(name, {"metadata": {"name": "dtrain-trainer"}})
    core.create_namespaced_persistent_volume_claim(name, {
        "metadata": {"name": "checkpoints"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    yield name
    core.delete_namespace(name)


def test_debug_flavour_trains_on_cpu_pods_and_the_logs_come_back(namespace):
    from airflow_dtrain.kubernetes.launcher import KubernetesLauncher

    spec = JobSpec.from_arguments(
        flavor="debug",
        steps=10,
        seq_len=64,
        global_batch_size=4,
        micro_batch_size=2,
        log_every=2,
        num_nodes=2,
        procs_per_node=1,
        backend="kubernetes",
        checkpoint_uri="/mnt/ckpt/run",
        resources={"cpu": "500m", "memory": "2Gi"},
        kubernetes={
            "image": IMAGE,
            "namespace": namespace,
            "image_pull_policy": "IfNotPresent",
            "shm_size": "256Mi",
            "volumes": [{"claim": "checkpoints", "mount_path": "/mnt/ckpt"}],
            "pending_timeout_s": 300,
        },
    )
    launcher = KubernetesLauncher(namespace=namespace)
    name = "real-cluster-r0"
    launcher.launch(name, spec)
    lines, cursor, deadline = [], None, time.monotonic() + 600
    while True:
        status = launcher.status(name)
        chunk = launcher.logs(name, cursor)
        lines += chunk.lines
        cursor = chunk.cursor
        if status.state.terminal or time.monotonic() > deadline:
            break
        time.sleep(2)
    text = "\n".join(lines)
    assert status.state == GroupState.SUCCEEDED, f"{status.message}\n{text[-3000:]}"
    assert "[node0]" in text and "[node1]" in text, text[-3000:]
    launcher.stop(name)
    assert launcher.status(name).state == GroupState.NOT_FOUND
