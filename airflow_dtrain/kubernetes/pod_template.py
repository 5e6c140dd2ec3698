"""The pod template of a group's Job: the pod spec, where it may be scheduled, and the author's overrides.

``render_pod_template`` builds the locked-down pod around the trainer container (``container``) and
merges the DAG author's ``pod_template`` over it the way kubectl's strategic merge does; every container
that merge adds is locked down too. Pure functions, no kubernetes client.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from airflow_dtrain.kubernetes.container import _CONTAINER_SECURITY, render_container, volumes_and_mounts
from airflow_dtrain.kubernetes.names import LABEL_GROUP, group_labels
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.job.checks import INSTANCE_TYPE_LABEL, ZONE_LABEL

# Leave torchrun's agent time after the workers' save to exit on its own, before SIGKILL.
_GRACE_MARGIN_S = 15
# A container a pod template adds (a sidecar, an init container) without resources of its own gets these.
_EXTRA_CONTAINER_RESOURCES = {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"}
# Lists of a PodSpec that merge element by element on "name", as kubectl's strategic merge does.
_MERGE_BY_NAME = {
    "containers",
    "initContainers",
    "volumes",
    "env",
    "volumeMounts",
    "ports",
    "imagePullSecrets",
}


def termination_grace_period_s(spec: JobSpec) -> int:
    """Long enough for every rank to finish its step and save before the kubelet's SIGKILL."""
    return math.ceil(spec.train.checkpoint.grace_period_s) + _GRACE_MARGIN_S


def _node_affinity(spec: JobSpec) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The required node affinity to the capacity's labels and the chosen zone and instance type (None:
    no constraint), and the tolerations of the capacity's taints."""
    capacity_labels = spec.capacity.node_labels
    # Where the price was chosen: the zone and instance type of the budget decision's offer.
    chosen = [
        {"key": key, "operator": "In", "values": [value]}
        for key, value in ((ZONE_LABEL, spec.zone), (INSTANCE_TYPE_LABEL, spec.instance_type))
        if value
    ]
    if not (capacity_labels or chosen):
        return None, []
    # Node selector terms are ORed (a Karpenter node or an EKS managed node group node), the
    # expressions of one term ANDed: the capacity, and the chosen zone and type, in every term.
    terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}, *copy.deepcopy(chosen)]}
             for key, value in capacity_labels] or [{"matchExpressions": chosen}]  # fmt: skip
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}  # fmt: skip
    tolerations = [
        {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}
        for key, value in capacity_labels
    ]
    return affinity, tolerations


def _scheduling(name: str, spec: JobSpec) -> dict[str, Any]:
    k8s = spec.kubernetes
    pod: dict[str, Any] = {}
    if k8s.node_selector:
        pod["nodeSelector"] = dict(k8s.node_selector)
    affinity, tolerations = _node_affinity(spec)
    if affinity is not None:
        pod["affinity"] = affinity
    if spec.resources.gpus_per_node:
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    tolerations += [dict(t) for t in k8s.tolerations]
    if tolerations:
        pod["tolerations"] = tolerations
    if k8s.topology_spread:
        pod["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": k8s.topology_spread,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {LABEL_GROUP: name}},
            }
        ]
    if k8s.priority_class:
        pod["priorityClassName"] = k8s.priority_class
    return pod


def render_pod_spec(name: str, spec: JobSpec) -> dict[str, Any]:
    """The pod of node ``i``: one trainer container, locked down, addressable as ``<job>-<i>.<service>``."""
    k8s = spec.kubernetes
    volumes, volume_mounts = volumes_and_mounts(name, spec)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # required by podFailurePolicy; the operator owns relaunches
        "subdomain": name,  # with the headless Service: <job>-<i>.<service> resolves to pod i
        "serviceAccountName": k8s.service_account,
        "automountServiceAccountToken": False,  # the trainer never calls the Kubernetes API
        "terminationGracePeriodSeconds": termination_grace_period_s(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,  # checkpoints on a PVC are written by uid 1000
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [render_container(name, spec, volume_mounts)],
        "volumes": volumes,
        **_scheduling(name, spec),
    }
    if k8s.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in k8s.image_pull_secrets]
    return pod_spec


def render_pod_template(name: str, spec: JobSpec) -> dict[str, Any]:
    """The Job's pod template: ``render_pod_spec`` with the author's ``pod_template`` merged over it."""
    template = {"metadata": {"labels": dict(group_labels(name))}, "spec": render_pod_spec(name, spec)}
    if spec.kubernetes.pod_template:
        template = merge_pod_template(template, spec.kubernetes.pod_template)
        _lock_down(template["spec"])
    return template


def _lock_down(pod_spec: dict[str, Any]) -> None:
    """Every container and init container a pod template added (or changed) gets the pod's locked-down
    securityContext and requests and limits, where it does not set them itself. What it does set wins:
    a privileged setting there is refused unless the platform admin's policy allows it (``policy``)."""
    for kind in ("containers", "initContainers"):
        for container in pod_spec.get(kind) or ():
            own = container.get("securityContext") or {}
            capabilities = dict(own.get("capabilities") or {})
            capabilities["drop"] = list(dict.fromkeys(["ALL", *(capabilities.get("drop") or ())]))
            container["securityContext"] = {**copy.deepcopy(_CONTAINER_SECURITY), **own,
                                            "capabilities": capabilities}  # fmt: skip
            resources = container.setdefault("resources", {})
            requests, limits = resources.setdefault("requests", {}), resources.setdefault("limits", {})
            for key, default in _EXTRA_CONTAINER_RESOURCES.items():
                requests.setdefault(key, limits.get(key, default))
                limits.setdefault(key, requests[key])


def merge_pod_template(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: mappings merge, named lists merge by name, other lists append."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = merge_pod_template(current, value)
        elif key in _MERGE_BY_NAME and isinstance(current, list) and isinstance(value, list):
            by_name = {item.get("name"): i for i, item in enumerate(current)}
            for item in value:
                if item.get("name") in by_name:
                    current[by_name[item["name"]]] = merge_pod_template(current[by_name[item["name"]]], item)
                else:
                    current.append(copy.deepcopy(item))
        elif isinstance(current, list) and isinstance(value, list):
            merged[key] = current + copy.deepcopy(value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
