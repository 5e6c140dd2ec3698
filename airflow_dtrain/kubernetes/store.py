"""The rendezvous store of an elastic group on Kubernetes: a pod of its own, so that no node's loss loses it.

An all-or-nothing group rendezvous with pod 0, whose agent hosts the c10d store: harmless there, since any
lost pod ends the group. An elastic group goes on without a lost pod, index 0 included, so its store runs in
a small pod ``<group>-rdzv`` (``python -m trainer.elastic.rdzv_store``: torch's TCPStore, from the group's
image), behind a headless Service of the same name; every node's agent is its client (``is_host=0``). Both are
created before the Job, owned by it once it exists, and deleted with it. A lost store pod is a lost
rendezvous: the group ends as preempted and is relaunched as a whole (``elastic_status``).

The pod asks for little (no GPU) and is scheduled by the author's ``node_selector`` and ``tolerations``:
not on the group's spot capacity, zone or instance type, whose loss it is there to outlive. It prefers
on-demand nodes (Karpenter's and EKS's capacity labels, ``Capacity.ON_DEMAND.node_labels``): a preference,
so that a cluster without those labels, or without on-demand nodes, still schedules it; on a spot node a
reclaim would end the whole group. Pure functions, no kubernetes client.
"""

from __future__ import annotations

import copy
from typing import Any

from airflow_dtrain.kubernetes.container import _CONTAINER_SECURITY
from airflow_dtrain.kubernetes.names import LABEL_GROUP, LABEL_STORE, group_labels, store_name
from airflow_dtrain.job.spec import JobSpec
from trainer.money.capacity import Capacity

STORE_CONTAINER = "rdzv"
STORE_RESOURCES = {"cpu": "250m", "memory": "1Gi", "ephemeral-storage": "1Gi"}
"""Enough for python, torch's import and a TCPStore; requests equal limits (Guaranteed)."""


def store_labels(name: str) -> dict[str, str]:
    """The group's labels but its node selector (``LABEL_GROUP``): the store's own instead."""
    labels = {key: value for key, value in group_labels(name).items() if key != LABEL_GROUP}
    return {**labels, "app.kubernetes.io/component": "rendezvous", LABEL_STORE: name}


def render_store_service(name: str, spec: JobSpec, *, namespace: str) -> dict[str, Any]:
    port = spec.kubernetes.rdzv_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": store_name(name), "namespace": namespace, "labels": store_labels(name)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # resolvable as soon as it has an IP, as the group's Service
            "selector": {LABEL_STORE: name},
            "ports": [{"name": "rdzv", "port": port, "targetPort": port}],
        },
    }


def render_store_pod(name: str, spec: JobSpec, *, namespace: str) -> dict[str, Any]:
    k8s = spec.kubernetes
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a restarted store has lost the rendezvous: the group is relaunched
        "serviceAccountName": k8s.service_account,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": STORE_CONTAINER,
            "image": k8s.image,
            "imagePullPolicy": k8s.image_pull_policy,
            "command": ["python", "-m", "trainer.elastic.rdzv_store", "0.0.0.0", str(k8s.rdzv_port)],
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "HOME", "value": "/tmp"}],
            "ports": [{"name": "rdzv", "containerPort": k8s.rdzv_port, "protocol": "TCP"}],
            "securityContext": {**copy.deepcopy(_CONTAINER_SECURITY), "readOnlyRootFilesystem": True},
            "resources": {"requests": dict(STORE_RESOURCES), "limits": dict(STORE_RESOURCES)},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "512Mi"}}],
    }  # fmt: skip
    if k8s.node_selector:
        pod_spec["nodeSelector"] = dict(k8s.node_selector)
    on_demand = [
        {"key": key, "operator": "In", "values": [value]} for key, value in Capacity.ON_DEMAND.node_labels
    ]
    prefer = [{"weight": 100, "preference": {"matchExpressions": [term]}} for term in on_demand]
    pod_spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": prefer}}
    # where the author's node_selector sends it, a GPU node's taint must not keep it out (it takes no GPU)
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    gpu *= bool(spec.resources.gpus_per_node)
    if gpu or k8s.tolerations:
        pod_spec["tolerations"] = [*gpu, *(dict(t) for t in k8s.tolerations)]
    if k8s.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in k8s.image_pull_secrets]
    if k8s.priority_class:
        pod_spec["priorityClassName"] = k8s.priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": store_name(name), "namespace": namespace, "labels": store_labels(name)},
        "spec": pod_spec,
    }
