"""The Kubernetes objects of one pod group, rendered from a ``JobSpec`` as plain dicts.

A group is a ConfigMap (the trainer's config, no secrets), a headless Service and
an Indexed Job with ``parallelism = completions = num_nodes``. Pod ``i`` is node
``i``: its hostname is ``<job>-<i>``, the Service gives it the stable DNS name
``<job>-<i>.<service>``, and every node rendezvous with pod 0 there. torch's c10d
rendezvous makes the pod whose address the endpoint resolves to the store host, so
no pod needs to know whether it is node 0.

Pure functions, no kubernetes client: ``python -m airflow_dtrain render`` prints
exactly what the launcher creates.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from airflow_dtrain.launchers import torchrun
from airflow_dtrain.launchers.base import budget_deadline
from airflow_dtrain.launchers.torchrun import NodeCommand
from airflow_dtrain.spec import INSTANCE_TYPE_LABEL, ZONE_LABEL, JobSpec
from trainer.config import PREEMPTED_EXIT_CODE

LABEL_GROUP = "airflow-dtrain/group"
"""The group's name: selects its Job, Service, ConfigMap and pods."""
LABEL_TASK = "airflow-dtrain/task"
"""The group's name without the relaunch suffix: every group of one task instance."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "airflow-dtrain"
ANNOTATION_PENDING_TIMEOUT = "airflow-dtrain/pending-timeout-s"
ANNOTATION_OUTCOME = "airflow-dtrain/outcome"
"""Set by the launcher when it ends a group itself (preempted node, no capacity)."""
ANNOTATION_CHECKPOINT_DELIVERY = "airflow-dtrain/checkpoint-now"
"""On the Job: how checkpoint-now reaches its pods, "annotation" (default) or "exec"."""
# Kept equal to trainer/launch.py's names (which imports torch: not importable here); a test checks it.
CHECKPOINT_NOW_ANNOTATION = "dtrain.io/checkpoint-now"
REQUESTS_FILE_ENV = "DTRAIN_REQUESTS_FILE"
PODINFO_DIR = "/etc/dtrain/podinfo"

ANNOTATION_DEADLINE = "airflow-dtrain/deadline"
"""How the Job's activeDeadlineSeconds was derived from the budget (JSON; see ``launchers.base.budget_deadline``)."""
ANNOTATION_PLACEMENT = "airflow-dtrain/placement"
"""Where the group's pods ran: node, zone, instance type and capacity per node index (JSON, by the launcher)."""
ANNOTATION_EARLIER = "airflow-dtrain/earlier-groups"
"""The outcomes of the task's earlier groups (JSON), so they are known after their Jobs' TTL deleted them."""

CONTAINER = "trainer"
CONFIG_DIR = "/etc/dtrain"
CONFIG_FILE = "train_config.json"
# Leave torchrun's agent time after the workers' save to exit on its own, before SIGKILL.
_GRACE_MARGIN_S = 15
DEFAULT_CPU_PER_GPU = 4
"""CPUs per GPU when ``node_resources`` gives no ``cpu``."""
DEFAULT_MEMORY_GI_PER_GPU = 32
"""GiB of memory per GPU when ``node_resources`` gives no ``memory``."""
# A container a pod template adds (a sidecar, an init container) without resources of its own gets these.
_EXTRA_CONTAINER_RESOURCES = {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"}
# Every container of the pod starts from this context (Pod Security "restricted"); a container's own wins.
_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


class EnvRef(str):
    """A container argument the provider writes with a ``$(VAR)`` reference to the container's own env, on
    purpose (``node_command``'s statsd flags): the one kind of provider-built string the kubelet may expand."""


def literal(value: str) -> str:
    """``value`` as the container must receive it, whatever it holds.

    The kubelet expands ``$(VAR)`` in a container's ``command``, ``args`` and ``env[].value`` from the
    container's env, a ``secretKeyRef`` one such as ``HF_TOKEN`` included, and reads ``$$`` as ``$``
    (k8s.io/kubernetes third_party/forked/golang/expansion). A checkpoint URI or an entrypoint argument
    from a trigger holding ``$(HF_TOKEN)`` would hand the secret to the program, its logs and its object
    keys: every ``$`` is doubled, so nothing in it is ever expanded. An ``EnvRef`` stays as it is.
    """
    return str(value) if isinstance(value, EnvRef) else value.replace("$", "$$")


def task_name(group: str) -> str:
    """``<base>-r3`` -> ``<base>``: what every relaunch of one task instance shares."""
    stem, sep, suffix = group.rpartition("-r")
    return stem if sep and suffix.isdigit() else group


def group_labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "airflow-dtrain",
        "app.kubernetes.io/component": "trainer",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_GROUP: name,
        LABEL_TASK: task_name(name),
    }


def config_map_name(name: str) -> str:
    return f"{name}-config"


def rendezvous_endpoint(name: str, port: int) -> str:
    """Pod 0's stable DNS name: the Job names it ``<job>-0``, the headless Service adds ``.<service>``."""
    return f"{name}-0.{name}:{port}"


def render_group(name: str, spec: JobSpec, *, namespace: str, spent_usd: float = 0.0) -> list[dict[str, Any]]:
    """The ConfigMap, headless Service and Indexed Job of group ``name``, in creation order.

    :param spent_usd: what the job has spent before this group, for the Job's deadline (``launchers.base.budget_deadline``).
    """
    if len(name) > 52:  # "<name>-<index>" is the pods' hostname, a 63-character DNS label
        raise ValueError(f"name: group names must be at most 52 characters, got {name!r}")
    return [
        render_config_map(name, spec, namespace=namespace),
        render_service(name, spec, namespace=namespace),
        render_job(name, spec, namespace=namespace, spent_usd=spent_usd),
    ]


def render_config_map(name: str, spec: JobSpec, *, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(name), "namespace": namespace, "labels": group_labels(name)},
        # The trainer's own config: hyperparameters and the checkpoint URI, never credentials
        # (those reach the pod through secretKeyRef or the service account).
        "data": {CONFIG_FILE: json.dumps(spec.train.to_dict(), indent=1, sort_keys=True)},
    }


def render_service(name: str, spec: JobSpec, *, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": group_labels(name)},
        "spec": {
            "clusterIP": "None",
            # DNS records as soon as a pod has an IP: pod 0 must be resolvable while it starts
            # its rendezvous store, long before anything could call it ready.
            "publishNotReadyAddresses": True,
            "selector": {LABEL_GROUP: name},
            "ports": [
                {"name": "rdzv", "port": spec.kubernetes.rdzv_port, "targetPort": spec.kubernetes.rdzv_port}
            ],
        },
    }


def node_command(name: str, spec: JobSpec) -> NodeCommand:
    """The torchrun agent of every pod: rendezvous with pod 0 through the headless Service.

    No ``is_host``: c10d makes the pod whose address the endpoint resolves to the store host. The
    arguments as the program receives them: the container's ``args`` are ``literal`` of each.
    """
    trainer_args: list[str] = []
    if spec.kubernetes.statsd_host:
        # $(VAR) is expanded by the kubelet from the container's env, not by a shell: the provider's own
        # references, kept apart from every other argument (EnvRef), which ``literal`` escapes
        trainer_args = ["--set", EnvRef("metrics.statsd_host=$(DTRAIN_STATSD_HOST)"),
                        "--set", EnvRef("metrics.statsd_port=$(DTRAIN_STATSD_PORT)")]  # fmt: skip
    return torchrun.node_command(
        name, spec,
        rdzv_endpoint=rendezvous_endpoint(name, spec.kubernetes.rdzv_port),
        config_path=f"{CONFIG_DIR}/{CONFIG_FILE}",
        trainer_args=trainer_args,
    )  # fmt: skip


def _env(name: str, spec: JobSpec) -> list[dict[str, Any]]:
    """The trainer container's env. Every value the provider builds from the spec is ``literal``; the DAG
    author's own ``kubernetes.env`` is not (see below)."""
    k8s = spec.kubernetes
    env: list[dict[str, Any]] = [
        # c10d assigns node ranks at the rendezvous; the completion index is the pod's node
        # index for its logs and tools
        {
            "name": "DTRAIN_NODE_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
        {"name": "DTRAIN_GROUP_NAME", "value": name},
        # DTRAIN_CHECKPOINT_URI, DTRAIN_STEPS, ...: the contract with a program of your own (trainer/contract.py)
        *({"name": key, "value": value} for key, value in torchrun.agent_env(spec).items()),
        # the root filesystem is read-only: caches and the built-in corpus go to the /tmp emptyDir
        {"name": "HOME", "value": "/tmp/home"},
        {"name": "DTRAIN_DATA_DIR", "value": "/tmp/dtrain-data"},
        # the pod's annotations, kept current by the kubelet: checkpoint-now arrives there (trainer/launch.py)
        {"name": REQUESTS_FILE_ENV, "value": f"{PODINFO_DIR}/annotations"},
    ]
    if spec.resources.gpus_per_node == 0:
        env.append({"name": "OMP_NUM_THREADS", "value": "1"})
    if k8s.statsd_host == "node":
        env.append({"name": "DTRAIN_STATSD_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}})
    elif k8s.statsd_host:
        env.append({"name": "DTRAIN_STATSD_HOST", "value": k8s.statsd_host})
    if k8s.statsd_host:  # for the trainer's --set flags, and for a program of your own that reports there too
        env.append({"name": "DTRAIN_STATSD_PORT", "value": str(k8s.statsd_port)})
    # Each value built from the spec (the checkpoint URI, the job and group names, ...) arrives as it is.
    env = [{**var, "value": literal(var["value"])} if "value" in var else var for var in env]
    # The DAG author's own variables, read as Kubernetes reads any env: a value may refer to a variable above it
    # ("$(DTRAIN_NODE_RANK)") and "$$" is a "$"; so may the containers of the author's pod_template. Only the
    # author sets either (a run may not: KubernetesSpec.choose), so neither is escaped.
    env += [{"name": key, "value": value} for key, value in sorted(k8s.env.items())]
    env += [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": ref["secret"], "key": ref["key"]}}}
        for key, ref in sorted(k8s.secret_env.items())
    ]
    return env


def node_resources(spec: JobSpec) -> dict[str, str]:
    """What the trainer container of each pod requests and is limited to (the same: Guaranteed QoS).

    ``node_resources`` where it says, else a default (see ``Resources``). A CPU limit equal to the
    request does not throttle a rank that uses what it asked for; with requests equal to limits the
    pod is Guaranteed, so the kubelet's static CPU manager gives it whole cores, and a namespace with
    a ResourceQuota admits it. Ask for (nearly) the node's allocatable CPUs on a dedicated GPU node.
    """
    res, gpus = spec.resources, spec.resources.gpus_per_node
    procs = spec.procs_per_node
    out = {
        "cpu": res.cpu or str(DEFAULT_CPU_PER_GPU * gpus if gpus else procs),
        "memory": res.memory or (f"{DEFAULT_MEMORY_GI_PER_GPU * gpus}Gi" if gpus else f"{4 * procs}Gi"),
        "ephemeral-storage": res.ephemeral_storage or ("100Gi" if gpus else "20Gi"),
    }
    if gpus:
        out["nvidia.com/gpu"] = str(gpus)
    return out


def _resources(spec: JobSpec) -> dict[str, Any]:
    sizes = node_resources(spec)
    return {"requests": dict(sizes), "limits": dict(sizes)}


def _scheduling(name: str, spec: JobSpec) -> dict[str, Any]:
    k8s = spec.kubernetes
    pod: dict[str, Any] = {}
    if k8s.node_selector:
        pod["nodeSelector"] = dict(k8s.node_selector)
    tolerations: list[dict[str, Any]] = []
    capacity_labels = spec.capacity.node_labels
    # Where the price was chosen: the zone and instance type of the budget decision's offer.
    chosen = [
        {"key": key, "operator": "In", "values": [value]}
        for key, value in ((ZONE_LABEL, spec.zone), (INSTANCE_TYPE_LABEL, spec.instance_type))
        if value
    ]
    if capacity_labels or chosen:
        # Node selector terms are ORed (a Karpenter node or an EKS managed node group node), the
        # expressions of one term ANDed: the capacity, and the chosen zone and type, in every term.
        terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}, *copy.deepcopy(chosen)]}
                 for key, value in capacity_labels] or [{"matchExpressions": chosen}]  # fmt: skip
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}  # fmt: skip
        tolerations += [
            {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}
            for key, value in capacity_labels
        ]
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


def termination_grace_period_s(spec: JobSpec) -> int:
    """Long enough for every rank to finish its step and save before the kubelet's SIGKILL."""
    return math.ceil(spec.train.checkpoint.grace_period_s) + _GRACE_MARGIN_S


def pod_failure_policy() -> dict[str, Any]:
    """How a failed pod ends (or does not end) the group; rules apply in order, the first match wins."""
    return {
        "rules": [
            # A node saved a checkpoint and exited "preempted, resumable". The other nodes cannot
            # go on without it (the world size is fixed): fail the whole Job now. The Job's Failed
            # condition names this exit code, so the launcher reports "preempted" even after the
            # pods are gone, and the operator relaunches the group from the checkpoint.
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [PREEMPTED_EXIT_CODE],
                },
            },
            # Evicted, drained, spot node reclaimed: not the trainer's fault, never counted against
            # backoffLimit. The launcher sees the DisruptionTarget condition and ends the group as
            # preempted itself.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # Anything else is a bug or bad input: retrying would fail again.
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "NotIn",
                    "values": [0, PREEMPTED_EXIT_CODE],
                },
            },
        ]
    }


def render_job(name: str, spec: JobSpec, *, namespace: str, spent_usd: float = 0.0) -> dict[str, Any]:
    k8s = spec.kubernetes
    command = node_command(name, spec)
    labels = group_labels(name)
    volume_mounts = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map_name(name)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}},
        {"name": "tmp", "emptyDir": {}},
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
            },
        },
    ]
    for i, volume in enumerate(k8s.volumes):
        volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": volume["claim"]}})
        volume_mounts.append(
            {
                "name": f"pvc-{i}",
                "mountPath": volume["mount_path"],
                "readOnly": bool(volume.get("read_only", False)),
            }
        )
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": k8s.image,
        "imagePullPolicy": k8s.image_pull_policy,
        # the kubelet would expand $(VAR) in these from the env, secrets included: each arrives as it is
        "command": [literal(arg) for arg in command.executable],
        "args": [literal(arg) for arg in command.args],
        "env": _env(name, spec),
        "ports": [{"name": "rdzv", "containerPort": k8s.rdzv_port, "protocol": "TCP"}],
        "volumeMounts": volume_mounts,
        # Pod Security "restricted"; the trainer writes only to its emptyDirs (/tmp, /dev/shm)
        "securityContext": {**copy.deepcopy(_CONTAINER_SECURITY), "readOnlyRootFilesystem": True},
        # the last lines of a crashed trainer are the pod's termination message
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    container["resources"] = _resources(spec)
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
        "containers": [container],
        "volumes": volumes,
        **_scheduling(name, spec),
    }
    if k8s.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in k8s.image_pull_secrets]
    template = {"metadata": {"labels": dict(labels)}, "spec": pod_spec}
    if k8s.pod_template:
        template = merge_pod_template(template, k8s.pod_template)
        _lock_down(template["spec"])

    job_labels = dict(labels)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.num_nodes,
        "parallelism": spec.num_nodes,
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(),
        # A replacement pod starts only once the old one is gone: two pods never share a hostname.
        "podReplacementPolicy": "Failed",
        "template": template,
    }
    if k8s.kueue_queue:
        job_labels["kueue.x-k8s.io/queue-name"] = k8s.kueue_queue
        # Kueue admits the whole group at once (gang admission) by unsuspending the Job.
        job_spec["suspend"] = True
    annotations = {ANNOTATION_PENDING_TIMEOUT: str(k8s.pending_timeout_s)}
    deadline = budget_deadline(spec, spent_usd)
    if deadline is not None:
        # The cluster stops the group at the budget even with nobody watching (status: "at_budget").
        job_spec["activeDeadlineSeconds"] = deadline["seconds"]
        annotations[ANNOTATION_DEADLINE] = json.dumps(deadline, sort_keys=True)
    if k8s.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = k8s.ttl_seconds_after_finished
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": job_labels,
            "annotations": {**annotations, ANNOTATION_CHECKPOINT_DELIVERY: k8s.checkpoint_now},
        },
        "spec": job_spec,
    }


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
