"""The job spec: what to train (the trainer's own config) and where (the pod group).

A ``JobSpec`` is plain data: it serialises to JSON for XComs, triggers and the
command line, and it is validated when built, so a bad spec fails in the DAG
file or before anything is launched -- never halfway through a launch. The
training half is the trainer's ``TrainConfig`` itself (``trainer/config.py`` is
stdlib-only, so importing it here costs nothing at parse time).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from trainer.capacity import Capacity
from trainer.config import ConfigError, TrainConfig

BACKENDS = ("local", "kubernetes")
"""Backends this version can launch."""

# Operator keyword arguments that map onto a field of the trainer's config.
TRAIN_FIELDS: dict[str, str] = {
    "flavor": "model.flavor",
    "dataset": "data.dataset",
    "seq_len": "data.seq_len",
    "steps": "steps",
    "global_batch_size": "global_batch_size",
    "micro_batch_size": "micro_batch_size",
    "seed": "seed",
    "lr": "optim.lr",
    "warmup_steps": "optim.warmup_steps",
    "weight_decay": "optim.weight_decay",
    "grad_clip": "optim.grad_clip",
    "checkpoint_uri": "checkpoint.uri",
    "checkpoint_every": "checkpoint.every",
    "checkpoint_keep": "checkpoint.keep",
    "log_every": "metrics.log_every",
    "simulate_preemption_at_step": "simulate_preemption_at_step",
}
_ARGUMENT_OF = {dotted: arg for arg, dotted in TRAIN_FIELDS.items()}

_MAX_NAME = 46  # leaves room for Kubernetes' "-<index>-<5 chars>" pod suffixes within 63


class SpecError(ValueError):
    """A job spec is invalid. The message names the field and the value."""


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_DEFAULTS = _flatten(TrainConfig().to_dict())


def _coerce(field_name: str, dotted: str, value: Any) -> Any:
    """Turn a rendered template string into the field's type ("50" -> 50)."""
    default = _DEFAULTS.get(dotted)
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    text = value.strip()
    try:
        if isinstance(default, bool):
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise SpecError(
            f"{field_name}: expected {type(default).__name__}, got {value!r}"
        ) from None
    return value


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What each node of the group asks for."""

    cpu: str | None = None
    """CPU request per node, Kubernetes quantity ("8", "7500m")."""
    memory: str | None = None
    """Memory request per node, Kubernetes quantity ("64Gi")."""
    gpus_per_node: int = 0
    """GPUs per node; 0 trains on CPU with gloo."""

    @classmethod
    def from_value(cls, value: Any) -> Resources:
        if value is None:
            return cls()
        if isinstance(value, Resources):
            return value
        if not isinstance(value, dict):
            raise SpecError(f"resources: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - {"cpu", "memory", "gpus_per_node"})
        if unknown:
            raise SpecError(
                f"resources: unknown key {unknown[0]!r} (allowed: cpu, memory, gpus_per_node)"
            )
        gpus = _positive_int("resources.gpus_per_node", value.get("gpus_per_node", 0), minimum=0)
        cpu = value.get("cpu")
        memory = value.get("memory")
        for key, quantity in (("cpu", cpu), ("memory", memory)):
            if quantity is not None and not re.fullmatch(r"[0-9]+(\.[0-9]+)?([mkMGTPE]i?)?", str(quantity)):
                raise SpecError(f"resources.{key}: not a Kubernetes quantity: {quantity!r}")
        return cls(
            cpu=None if cpu is None else str(cpu),
            memory=None if memory is None else str(memory),
            gpus_per_node=gpus,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "memory": self.memory, "gpus_per_node": self.gpus_per_node}


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Plain env values are visible to anyone who can read the Job: these names belong in secret_env.
_SECRET_LOOKING = re.compile(r"SECRET|PASSWORD|TOKEN|PRIVATE_KEY|ACCESS_KEY|API_KEY|CREDENTIAL", re.I)


def _k8s_name(name: str, value: Any, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > 253 or not _K8S_NAME.match(value):
        raise SpecError(
            f"{name}: not a Kubernetes object name (lowercase letters, digits, '-', '.'), got {value!r}"
        )
    return value


def _str_map(name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError(f"{name}: expected a mapping of strings to strings, got {value!r}")
    return dict(value)


def _dict_list(name: str, value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, dict) for v in value):
        raise SpecError(f"{name}: expected a list of mappings, got {value!r}")
    return [dict(v) for v in value]


@dataclass(frozen=True, kw_only=True)
class KubernetesSpec:
    """Where and how the pods of a ``kubernetes`` group run (ignored by the other backends)."""

    image: str | None = None
    """Trainer image (``docker/Dockerfile``); required for the kubernetes backend."""
    image_pull_policy: str = "IfNotPresent"
    """``Always``, ``IfNotPresent`` or ``Never``."""
    image_pull_secrets: tuple[str, ...] = ()
    """Names of docker-registry Secrets for a private registry."""
    namespace: str | None = None
    """Namespace of the group; default: the connection's namespace, else ``default``."""
    service_account: str = "dtrain-trainer"
    """Service account of the trainer pods (e.g. bound to an IAM role for S3 through IRSA)."""
    capacity_type: str = "any"
    """``spot``, ``on_demand`` or ``any`` (``on-demand`` is read too): the group's capacity, see
    ``JobSpec.capacity``."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Extra node labels the pods require, e.g. ``{"node.kubernetes.io/instance-type": "p5.48xlarge"}``."""
    tolerations: tuple[dict[str, Any], ...] = ()
    """Extra tolerations (Kubernetes ``Toleration`` objects)."""
    topology_spread: str | None = None
    """A topology key (e.g. ``kubernetes.io/hostname``) to spread the group's pods over, max skew 1."""
    kueue_queue: str | None = None
    """Kueue LocalQueue: the Job is created suspended and admitted as a whole (gang admission)."""
    priority_class: str | None = None
    """PriorityClass of the pods."""
    pod_template: dict[str, Any] = field(default_factory=dict)
    """A partial ``PodTemplateSpec`` merged over the rendered one (containers, volumes, env by name)."""
    env: dict[str, str] = field(default_factory=dict)
    """Plain environment variables of the trainer container (no secrets: use ``secret_env``)."""
    secret_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Environment variables from Secrets: ``{"HF_TOKEN": {"secret": "hf", "key": "token"}}``."""
    volumes: tuple[dict[str, Any], ...] = ()
    """PersistentVolumeClaims to mount: ``[{"claim": "ckpt", "mount_path": "/mnt/ckpt"}]``."""
    shm_size: str = "8Gi"
    """Size limit of the memory-backed ``/dev/shm`` (NCCL and data loader workers use it)."""
    pending_timeout_s: float = 1800.0
    """A group with a pod not yet running after this long fails with "no capacity"; 0: wait forever."""
    statsd_host: str = ""
    """statsd host of the trainer; ``node`` means the IP of the pod's node (a statsd DaemonSet)."""
    statsd_port: int = 8125
    """statsd UDP port."""
    rdzv_port: int = 29400
    """Port of the c10d rendezvous store on pod 0."""
    ttl_seconds_after_finished: int | None = None
    """Delete finished Jobs after this long; None keeps them (the operator counts preemptions from them)."""

    _FIELDS = (
        "image", "image_pull_policy", "image_pull_secrets", "namespace", "service_account", "capacity_type",
        "node_selector", "tolerations", "topology_spread", "kueue_queue", "priority_class", "pod_template",
        "env", "secret_env", "volumes", "shm_size", "pending_timeout_s", "statsd_host", "statsd_port",
        "rdzv_port", "ttl_seconds_after_finished",
    )  # fmt: skip

    @classmethod
    def from_value(cls, value: Any) -> KubernetesSpec:
        if value is None:
            return cls()
        if isinstance(value, KubernetesSpec):
            return value
        if not isinstance(value, dict):
            raise SpecError(f"kubernetes: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - set(cls._FIELDS))
        if unknown:
            raise SpecError(f"kubernetes: unknown key {unknown[0]!r} (allowed: {', '.join(cls._FIELDS)})")
        v = dict(value)
        image = v.get("image")
        if image is not None and (
            not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image)
        ):
            raise SpecError(f"kubernetes.image: not an image reference, got {image!r}")
        pull_policy = v.get("image_pull_policy", "IfNotPresent")
        if pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise SpecError(
                f"kubernetes.image_pull_policy: choose Always, IfNotPresent or Never, got {pull_policy!r}"
            )
        try:
            capacity = Capacity.parse(v.get("capacity_type", "any"), field="kubernetes.capacity_type").value
        except ValueError as err:
            raise SpecError(str(err)) from None
        env = _str_map("kubernetes.env", v.get("env"))
        for key in env:
            if not _ENV_NAME.match(key):
                raise SpecError(f"kubernetes.env: not an environment variable name: {key!r}")
            if _SECRET_LOOKING.search(key):
                raise SpecError(
                    f"kubernetes.env.{key}: looks like a secret; pass it with "
                    f"secret_env={{{key!r}: {{'secret': ..., 'key': ...}}}} so it stays in a Secret"
                )
        secret_env = v.get("secret_env") or {}
        if not isinstance(secret_env, dict):
            raise SpecError(f"kubernetes.secret_env: expected a mapping, got {secret_env!r}")
        for key, ref in secret_env.items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                raise SpecError(f"kubernetes.secret_env: not an environment variable name: {key!r}")
            if not isinstance(ref, dict) or set(ref) != {"secret", "key"}:
                raise SpecError(
                    f"kubernetes.secret_env.{key}: expected {{'secret': NAME, 'key': KEY}}, got {ref!r}"
                )
            _k8s_name(f"kubernetes.secret_env.{key}.secret", ref["secret"], optional=False)
        volumes = _dict_list("kubernetes.volumes", v.get("volumes"))
        for i, volume in enumerate(volumes):
            if (
                set(volume) - {"claim", "mount_path", "read_only"}
                or "claim" not in volume
                or "mount_path" not in volume
            ):
                raise SpecError(
                    f"kubernetes.volumes[{i}]: expected {{'claim': PVC, 'mount_path': '/abs/path'}}, got {volume!r}"
                )
            _k8s_name(f"kubernetes.volumes[{i}].claim", volume["claim"], optional=False)
            if not str(volume["mount_path"]).startswith("/"):
                raise SpecError(
                    f"kubernetes.volumes[{i}].mount_path: must be absolute, got {volume['mount_path']!r}"
                )
        pod_template = v.get("pod_template") or {}
        if not isinstance(pod_template, dict) or set(pod_template) - {"metadata", "spec"}:
            raise SpecError(
                f"kubernetes.pod_template: expected a PodTemplateSpec ({{'metadata', 'spec'}}), got {pod_template!r}"
            )
        shm = str(v.get("shm_size", "8Gi"))
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?([kMGTPE]i?)?", shm):
            raise SpecError(f"kubernetes.shm_size: not a Kubernetes quantity: {shm!r}")
        timeout = v.get("pending_timeout_s", 1800.0)
        if isinstance(timeout, str):
            try:
                timeout = float(timeout)
            except ValueError:
                pass
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise SpecError(
                f"kubernetes.pending_timeout_s: must be a number >= 0 (0: no timeout), got {timeout!r}"
            )
        ttl = v.get("ttl_seconds_after_finished")
        spread = v.get("topology_spread")
        if spread is not None and (not isinstance(spread, str) or not spread):
            raise SpecError(
                f"kubernetes.topology_spread: expected a topology key such as 'kubernetes.io/hostname', got {spread!r}"
            )
        statsd_host = v.get("statsd_host", "")
        if not isinstance(statsd_host, str):
            raise SpecError(f"kubernetes.statsd_host: expected a string, got {statsd_host!r}")
        for key in ("image_pull_secrets",):
            for name in v.get(key) or ():
                _k8s_name(f"kubernetes.{key}", name, optional=False)
        return cls(
            image=image,
            image_pull_policy=pull_policy,
            image_pull_secrets=tuple(v.get("image_pull_secrets") or ()),
            namespace=_k8s_name("kubernetes.namespace", v.get("namespace")),
            service_account=_k8s_name(
                "kubernetes.service_account", v.get("service_account", "dtrain-trainer"), optional=False
            ),
            capacity_type=capacity,
            node_selector=_str_map("kubernetes.node_selector", v.get("node_selector")),
            tolerations=tuple(_dict_list("kubernetes.tolerations", v.get("tolerations"))),
            topology_spread=spread,
            kueue_queue=_k8s_name("kubernetes.kueue_queue", v.get("kueue_queue")),
            priority_class=_k8s_name("kubernetes.priority_class", v.get("priority_class")),
            pod_template=pod_template,
            env=env,
            secret_env={k: dict(r) for k, r in secret_env.items()},
            volumes=tuple(volumes),
            shm_size=shm,
            pending_timeout_s=float(timeout),
            statsd_host=statsd_host,
            statsd_port=_positive_int("kubernetes.statsd_port", v.get("statsd_port", 8125)),
            rdzv_port=_positive_int("kubernetes.rdzv_port", v.get("rdzv_port", 29400)),
            ttl_seconds_after_finished=None
            if ttl is None
            else _positive_int("kubernetes.ttl_seconds_after_finished", ttl, 0),
        )

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self._FIELDS}
        for key in ("image_pull_secrets", "tolerations", "volumes"):
            out[key] = list(out[key])
        return out

    def checkpoint_problem(self, uri: str) -> str | None:
        """Why every pod and the Airflow worker could not share checkpoints at ``uri`` (None: they can)."""
        if uri.startswith("s3://"):
            return None
        path = uri.removeprefix("file://")
        if not uri or "://" in path:
            return "needs an s3:// URI or a path on a PersistentVolumeClaim declared in kubernetes.volumes"
        for volume in self.volumes:
            mount = str(volume["mount_path"]).rstrip("/")
            if path == mount or path.startswith(mount + "/"):
                return None
        return (
            "is a local path that the pods cannot reach: use an s3:// URI or a path under the mount_path "
            "of a PersistentVolumeClaim declared in kubernetes.volumes (mounted at the same path on the Airflow worker)"
        )


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One training job: the trainer's config plus the shape of its pod group."""

    train: TrainConfig = field(default_factory=TrainConfig)
    """What every process trains (``trainer.config.TrainConfig``)."""
    num_nodes: int = 1
    """Nodes in the group; each runs one torchrun agent."""
    procs_per_node: int = 1
    """Training processes per node (one per GPU on GPU nodes)."""
    backend: str = "local"
    """Where the group runs: ``local`` (processes on this machine) or ``kubernetes`` (an Indexed Job)."""
    resources: Resources = field(default_factory=Resources)
    """Per-node resource requests."""
    max_preemptions: int = 3
    """How many times a preempted group is relaunched from its checkpoint."""
    kubernetes: KubernetesSpec = field(default_factory=KubernetesSpec)
    """Pods, scheduling and storage of the ``kubernetes`` backend."""
    entrypoint: tuple[str, ...] = ()
    """What each process runs instead of ``-m trainer --config <the train config>``: a trainer
    module and its arguments, e.g. ``("trainer.evaluate", "--checkpoint-uri", uri)``."""
    capacity: Capacity = Capacity.ANY
    """Capacity the group runs on: ``spot``, ``on_demand`` or ``any``; on Kubernetes it selects the
    nodes (Karpenter and EKS labels). Taken from ``kubernetes.capacity_type`` when only that is given."""

    def __post_init__(self) -> None:
        try:
            capacity = Capacity.parse(self.capacity)
        except ValueError as err:
            raise SpecError(str(err)) from None
        from_kubernetes = Capacity(self.kubernetes.capacity_type)
        if capacity == Capacity.ANY:
            capacity = from_kubernetes
        elif from_kubernetes not in (Capacity.ANY, capacity):
            raise SpecError(f"kubernetes.capacity_type: {from_kubernetes} contradicts capacity {capacity}")
        object.__setattr__(self, "capacity", capacity)
        gpus = self.resources.gpus_per_node
        if gpus and self.train.cost.gpus_per_node != gpus:  # the ledger's gpu_hours count them
            if self.train.cost.gpus_per_node:
                raise SpecError(
                    f"cost.gpus_per_node: {self.train.cost.gpus_per_node}, but resources.gpus_per_node is {gpus}"
                )
            object.__setattr__(self, "train", self.train.with_overrides({"cost.gpus_per_node": gpus}))
        if self.entrypoint:
            module = self.entrypoint[0]
            if not re.fullmatch(r"trainer(\.[a-z_]+)*", str(module)) or not all(
                isinstance(a, str) for a in self.entrypoint
            ):
                raise SpecError(f"entrypoint: must be a trainer module and string arguments, got {self.entrypoint!r}")
        _positive_int("num_nodes", self.num_nodes)
        _positive_int("procs_per_node", self.procs_per_node)
        _positive_int("max_preemptions", self.max_preemptions, minimum=0)
        if self.backend not in BACKENDS:
            raise SpecError(f"backend: unknown backend {self.backend!r} (choose from {', '.join(BACKENDS)})")
        if self.resources.gpus_per_node and self.resources.gpus_per_node != self.procs_per_node:
            raise SpecError(
                f"procs_per_node: {self.procs_per_node} processes per node, but "
                f"resources.gpus_per_node is {self.resources.gpus_per_node}: run one process per GPU"
            )
        try:
            self.train.validate_world_size(self.world_size)
        except ConfigError as err:
            raise SpecError(
                f"{err} (world size = num_nodes {self.num_nodes} × procs_per_node {self.procs_per_node})"
            ) from None
        if self.backend == "kubernetes":
            if not self.kubernetes.image:
                raise SpecError("kubernetes.image: required for backend 'kubernetes' (the trainer image, see docker/)")
            problem = self.kubernetes.checkpoint_problem(self.train.checkpoint.uri)
            if problem:
                raise SpecError(
                    f"checkpoint.uri (argument checkpoint_uri): backend 'kubernetes' {problem}, "
                    f"got {self.train.checkpoint.uri!r}"
                )

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.procs_per_node

    def to_dict(self) -> dict[str, Any]:
        return {
            "train": self.train.to_dict(),
            "num_nodes": self.num_nodes,
            "procs_per_node": self.procs_per_node,
            "backend": self.backend,
            "resources": self.resources.to_dict(),
            "max_preemptions": self.max_preemptions,
            "kubernetes": self.kubernetes.to_dict(),
            "entrypoint": list(self.entrypoint),
            "capacity": self.capacity.value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        data = dict(data)
        try:
            train = TrainConfig.from_dict(data.pop("train", {}))
        except ConfigError as err:
            raise SpecError(str(err)) from None
        resources = Resources.from_value(data.pop("resources", None))
        kubernetes = KubernetesSpec.from_value(data.pop("kubernetes", None))
        entrypoint = tuple(data.pop("entrypoint", None) or ())
        unknown = sorted(set(data) - {"num_nodes", "procs_per_node", "backend", "max_preemptions", "capacity"})
        if unknown:
            raise SpecError(f"{unknown[0]}: unknown job spec field")
        return cls(train=train, resources=resources, kubernetes=kubernetes, entrypoint=entrypoint, **data)

    @classmethod
    def from_arguments(
        cls,
        *,
        config: dict[str, Any] | None = None,
        num_nodes: Any = 1,
        procs_per_node: Any = 1,
        backend: str = "local",
        resources: Any = None,
        max_preemptions: Any = 3,
        kubernetes: Any = None,
        **train_arguments: Any,
    ) -> JobSpec:
        """Build a spec from operator-style arguments (``flavor=``, ``steps=``, ...).

        ``config`` is a full or partial trainer config (nested or dotted keys) for
        everything the flat arguments do not cover; the flat arguments win.
        """
        unknown = sorted(set(train_arguments) - set(TRAIN_FIELDS))
        if unknown:
            raise SpecError(f"{unknown[0]}: unknown argument")
        overrides: dict[str, Any] = {}
        if config:
            if not isinstance(config, dict):
                raise SpecError(f"config: expected a mapping, got {config!r}")
            overrides.update(_flatten(config))
        for name, value in train_arguments.items():
            if value is None:
                continue
            overrides[TRAIN_FIELDS[name]] = _coerce(name, TRAIN_FIELDS[name], value)
        try:
            train = TrainConfig().with_overrides(overrides)
        except ConfigError as err:
            raise SpecError(_name_argument(str(err))) from None
        return cls(
            train=train,
            num_nodes=_positive_int("num_nodes", num_nodes),
            procs_per_node=_positive_int("procs_per_node", procs_per_node),
            backend=str(backend),
            resources=Resources.from_value(resources),
            max_preemptions=_positive_int("max_preemptions", max_preemptions, minimum=0),
            kubernetes=KubernetesSpec.from_value(kubernetes),
        )


def _name_argument(message: str) -> str:
    """Add the operator argument to a trainer error: "checkpoint.uri (argument checkpoint_uri): ..."."""
    dotted, sep, rest = message.partition(":")
    argument = _ARGUMENT_OF.get(dotted.strip())
    if sep and argument and argument != dotted.strip():
        return f"{dotted} (argument {argument}):{rest}"
    return message


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def group_base_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """A deterministic, DNS-1035-safe name for the groups of one task instance.

    The same dag_id/run_id/task_id/map_index always gives the same name, which is
    what lets a restarted task find its group again instead of launching another.
    """
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}\0{map_index}".encode()).hexdigest()[:10]
    stem = _slug(f"{dag_id}-{task_id}")[: _MAX_NAME - len(digest) - 6].strip("-")
    if not stem or not stem[0].isalpha():
        stem = f"g{stem}"[: _MAX_NAME - len(digest) - 6].strip("-")
    return f"{stem}-{digest}"


def group_name(base: str, relaunch: int) -> str:
    """The name of relaunch number ``relaunch`` (0 for the first launch)."""
    return f"{base}-r{relaunch}"


def relaunch_index(base: str, name: str) -> int | None:
    """The relaunch number of ``name`` if it belongs to ``base``, else None."""
    match = re.fullmatch(re.escape(base) + r"-r([0-9]+)", name)
    return int(match.group(1)) if match else None
