"""The trainer container of a group's pods: its command, env, volumes and resources.

Everything the provider builds from the spec reaches the container as it is (``literal``): the kubelet
would otherwise expand ``$(VAR)`` in it. Pure functions, no kubernetes client.
"""

from __future__ import annotations

import copy
from typing import Any

from airflow_dtrain.kubernetes.names import (
    CONFIG_DIR,
    CONFIG_FILE,
    CONTAINER,
    PODINFO_DIR,
    REQUESTS_FILE_ENV,
    config_map_name,
    rendezvous_endpoint,
    store_endpoint,
)
from airflow_dtrain.errors import SpecError
from airflow_dtrain.launchers import torchrun
from airflow_dtrain.launchers.state_dir import compile_cache_key
from airflow_dtrain.launchers.torchrun import NodeCommand
from airflow_dtrain.job.spec import JobSpec

DEFAULT_CPU_PER_GPU = 4
"""CPUs per GPU when ``node_resources`` gives no ``cpu``."""
DEFAULT_MEMORY_GI_PER_GPU = 32
"""GiB of memory per GPU when ``node_resources`` gives no ``memory``."""
COMPILE_CACHE_VOLUME = "compile-cache"
"""The pod volume of the admin's compile cache claim (``KubernetesPolicy.compile_cache_claim``)."""
COMPILE_CACHE_MOUNT = "/var/cache/dtrain-compile"
"""Where the trainer container mounts its job's directory of it."""
# Every container of the pod starts from this context (Pod Security "restricted"); a container's own wins.
_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


class EnvRef(str):
    """A container argument the provider writes with a ``$(VAR)`` reference to the container's own env,
    on purpose (``node_command``'s statsd flags): the one kind of provider-built string the kubelet may
    expand."""


def literal(value: str) -> str:
    """``value`` as the container must receive it, whatever it holds.

    The kubelet expands ``$(VAR)`` in a container's ``command``, ``args`` and ``env[].value`` from the
    container's env, a ``secretKeyRef`` one such as ``HF_TOKEN`` included, and reads ``$$`` as ``$``
    (k8s.io/kubernetes third_party/forked/golang/expansion). A checkpoint URI or an entrypoint argument
    from a trigger holding ``$(HF_TOKEN)`` would hand the secret to the program, its logs and its object
    keys: every ``$`` is doubled, so nothing in it is ever expanded. An ``EnvRef`` stays as it is.
    """
    return str(value) if isinstance(value, EnvRef) else value.replace("$", "$$")


def node_command(name: str, spec: JobSpec) -> NodeCommand:
    """The torchrun agent of every pod: rendezvous with pod 0 through the headless Service (an elastic
    group: with its store pod, ``is_host=0``).

    All or nothing, no ``is_host``: c10d makes the pod whose address the endpoint resolves to the store
    host. The arguments as the program receives them: the container's ``args`` are ``literal`` of each.
    """
    trainer_args: list[str] = []
    if spec.kubernetes.statsd_host:
        # $(VAR) is expanded by the kubelet from the container's env, not by a shell: the provider's own
        # references, kept apart from every other argument (EnvRef), which ``literal`` escapes
        trainer_args = ["--set", EnvRef("metrics.statsd_host=$(DTRAIN_STATSD_HOST)"),
                        "--set", EnvRef("metrics.statsd_port=$(DTRAIN_STATSD_PORT)")]  # fmt: skip
    port = spec.kubernetes.rdzv_port
    return torchrun.node_command(
        name, spec,
        # an elastic group's store is a pod of its own (kubernetes.store), which outlives any node's loss
        rdzv_endpoint=store_endpoint(name, port) if spec.elastic else rendezvous_endpoint(name, port),
        is_host=False if spec.elastic else None,
        config_path=f"{CONFIG_DIR}/{CONFIG_FILE}",
        trainer_args=trainer_args,
    )  # fmt: skip


def _provider_env(name: str, spec: JobSpec) -> list[dict[str, Any]]:
    """The variables the provider sets, before ``literal``: the node rank, the contract, the paths."""
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
        # DTRAIN_CHECKPOINT_URI, DTRAIN_STEPS, ...: the contract with a program of your own
        # (trainer/contract.py)
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
    return env


def _env(name: str, spec: JobSpec) -> list[dict[str, Any]]:
    """The trainer container's env. Every value the provider builds from the spec is ``literal``; the DAG
    author's own ``kubernetes.env`` is not (see below)."""
    k8s = spec.kubernetes
    # Each value built from the spec (the checkpoint URI, the job and group names, ...) arrives as it is.
    env = [
        {**var, "value": literal(var["value"])} if "value" in var else var
        for var in _provider_env(name, spec)
    ]
    # The DAG author's own variables, read as Kubernetes reads any env: a value may refer to a variable
    # above it ("$(DTRAIN_NODE_RANK)") and "$$" is a "$"; so may the containers of the author's
    # pod_template. Only the author sets either (a run may not: KubernetesSpec.choose), so neither is escaped.
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


def volumes_and_mounts(name: str, spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the trainer's mounts of them: its config, a memory-backed /dev/shm, the /tmp
    its read-only root leaves it, the downward-API annotations (checkpoint-now), and the author's PVCs."""
    k8s = spec.kubernetes
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
    return volumes, volume_mounts


def render_container(name: str, spec: JobSpec, volume_mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer container: the torchrun agent, locked down, with the group's env and resources."""
    k8s = spec.kubernetes
    command = node_command(name, spec)
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
    return container


def mount_compile_cache(pod_spec: dict[str, Any], claim: str, spec: JobSpec) -> None:
    """Give the trainer container of ``pod_spec`` (the pod template, the author's merged in) its job's
    torch.compile cache: the directory ``compile_cache_key`` of the admin's PersistentVolumeClaim ``claim``,
    mounted by subPath, so that a relaunched or replacement pod on another node finds the job's compiled code
    (a warm restart) and no pod sees another job's. Every attempt of the job shares it; the claim must be
    writable by the pods' group (fsGroup 1000). A cache is only a speed-up: a trainer that cannot write it
    compiles into /tmp (``trainer.launch``).

    Compiled code is run by whoever loads it, so no container but the trainer may mount the claim: a pod
    whose author's template mounts it (or uses the volume's name) is refused, naming where."""
    for i, volume in enumerate(pod_spec.get("volumes") or ()):
        if volume.get("name") == COMPILE_CACHE_VOLUME or (
            (volume.get("persistentVolumeClaim") or {}).get("claimName") == claim
        ):
            raise SpecError(
                f"kubernetes: the pod's volumes[{i}] ({volume.get('name')!r}) is the platform's compile "
                f"cache (claim {claim!r}), which only the provider mounts, one job's directory to each pod"
            )
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod_spec.get(kind) or ():
            for mount in container.get("volumeMounts") or ():
                if mount.get("name") == COMPILE_CACHE_VOLUME:
                    raise SpecError(
                        f"kubernetes.pod_template: container {container.get('name')!r} mounts "
                        f"{COMPILE_CACHE_VOLUME!r}, the platform's compile cache, which only the trainer "
                        "mounts"
                    )
    pod_spec.setdefault("volumes", []).append(
        {"name": COMPILE_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
    )
    trainer = next(c for c in pod_spec["containers"] if c["name"] == CONTAINER)
    trainer.setdefault("volumeMounts", []).append({
        "name": COMPILE_CACHE_VOLUME, "mountPath": COMPILE_CACHE_MOUNT,
        "subPath": compile_cache_key(spec.train.owner, spec.train.job),
    })  # fmt: skip
    trainer.setdefault("env", []).extend([
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": COMPILE_CACHE_MOUNT},
        {"name": "TRITON_CACHE_DIR", "value": f"{COMPILE_CACHE_MOUNT}/triton"},
    ])  # fmt: skip
