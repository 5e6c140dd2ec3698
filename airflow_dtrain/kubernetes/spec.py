"""Where and how the pods of a ``kubernetes`` group run: the Kubernetes half of a ``JobSpec``.

Plain data, validated when built (``KubernetesSpec.from_value``), so a bad setting fails in
the DAG file or before any API call. Which capacity the pods select (spot, on-demand) is
not here: it is the group's ``JobSpec.capacity``, shared with the budget and the ledger.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from trainer.capacity import Capacity

from airflow_dtrain.errors import SpecError, positive_int as _positive_int

DEFAULT_TTL_S = 86_400
"""How long a finished group's Job is kept by default (``ttlSecondsAfterFinished``): a day."""

TRIGGER_KEYS = ("image", "namespace")
"""What a run (the trigger form, ``dag_run.conf``) may choose of the pods, within what the DAG allows."""

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


def _image_patterns(name: str, value: Any) -> tuple[str, ...]:
    patterns = tuple(value or ())
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern.strip() or any(c.isspace() for c in pattern):
            raise SpecError(f"{name}: not an image reference or prefix, got {pattern!r}")
    return patterns


def image_allowed(image: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """``image`` is one of ``patterns`` or starts with one that ends in ``/``, ``:`` or ``@`` (a registry
    or repository prefix: ``"ghcr.io/acme/"``, ``"ghcr.io/acme/dtrain:"``, ``"ghcr.io/acme/dtrain@"``).
    A prefix without that separator matches exactly only, so ``ghcr.io/acme`` never admits
    ``ghcr.io/acme-evil/x``."""
    if not image or any(c.isspace() for c in image) or ".." in image:
        return False
    return any(
        image == p or (p.endswith(("/", ":", "@")) and image.startswith(p) and len(image) > len(p))
        for p in patterns
    )


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
    ttl_seconds_after_finished: int | None = DEFAULT_TTL_S
    """Delete a finished Job (and its pods, Service, ConfigMap) this long after it ended; None keeps it. The
    operator reads a group's outcome right after it ends, and each Job carries its task's earlier outcomes,
    so counting preemptions survives the deletion of the earlier Jobs."""
    checkpoint_now: str = "annotation"
    """How "checkpoint now" reaches the pods: ``annotation`` (a pod annotation the kubelet writes into a
    downward-API file the node agent follows: no ``pods/exec``, but the kubelet refreshes it on its sync,
    up to about a minute) or ``exec`` (SIGUSR1 through ``pods/exec`` at once; the Role needs pods/exec)."""
    allowed_images: tuple[str, ...] = ()
    """Images a run may choose instead of ``image`` (``TRIGGER_KEYS``): exact references, or prefixes
    ending in ``/``, ``:`` or ``@`` (``"ghcr.io/acme/dtrain:"``: any tag of that repository)."""
    allowed_namespaces: tuple[str, ...] = ()
    """Namespaces a run may choose instead of ``namespace``."""

    _FIELDS = (
        "image", "image_pull_policy", "image_pull_secrets", "namespace", "service_account",
        "node_selector", "tolerations", "topology_spread", "kueue_queue", "priority_class", "pod_template",
        "env", "secret_env", "volumes", "shm_size", "pending_timeout_s", "statsd_host", "statsd_port",
        "rdzv_port", "ttl_seconds_after_finished", "checkpoint_now", "allowed_images", "allowed_namespaces",
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
                    f"kubernetes.volumes[{i}]: expected {{'claim': PVC, 'mount_path': '/abs/path'}}, got "
                    f"{volume!r}"
                )
            _k8s_name(f"kubernetes.volumes[{i}].claim", volume["claim"], optional=False)
            if not str(volume["mount_path"]).startswith("/"):
                raise SpecError(
                    f"kubernetes.volumes[{i}].mount_path: must be absolute, got {volume['mount_path']!r}"
                )
        pod_template = v.get("pod_template") or {}
        if not isinstance(pod_template, dict) or set(pod_template) - {"metadata", "spec"}:
            raise SpecError(
                f"kubernetes.pod_template: expected a PodTemplateSpec ({{'metadata', 'spec'}}), got "
                f"{pod_template!r}"
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
        ttl = v.get("ttl_seconds_after_finished", DEFAULT_TTL_S)
        spread = v.get("topology_spread")
        if spread is not None and (not isinstance(spread, str) or not spread):
            raise SpecError(
                "kubernetes.topology_spread: expected a topology key such as 'kubernetes.io/hostname', got "
                f"{spread!r}"
            )
        statsd_host = v.get("statsd_host", "")
        if not isinstance(statsd_host, str):
            raise SpecError(f"kubernetes.statsd_host: expected a string, got {statsd_host!r}")
        for key in ("image_pull_secrets", "allowed_namespaces"):
            for name in v.get(key) or ():
                _k8s_name(f"kubernetes.{key}", name, optional=False)
        allowed_images = _image_patterns("kubernetes.allowed_images", v.get("allowed_images"))
        delivery = v.get("checkpoint_now", "annotation")
        if delivery not in ("annotation", "exec"):
            raise SpecError(f"kubernetes.checkpoint_now: choose annotation or exec, got {delivery!r}")
        return cls(
            image=image,
            image_pull_policy=pull_policy,
            image_pull_secrets=tuple(v.get("image_pull_secrets") or ()),
            namespace=_k8s_name("kubernetes.namespace", v.get("namespace")),
            service_account=_k8s_name(
                "kubernetes.service_account", v.get("service_account", "dtrain-trainer"), optional=False
            ),
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
            checkpoint_now=delivery,
            allowed_images=allowed_images,
            allowed_namespaces=tuple(v.get("allowed_namespaces") or ()),
        )

    def choose(self, choice: Any) -> KubernetesSpec:
        """This spec with what a run chose (``FSDPTrainOperator(kubernetes_overrides=...)``, the trigger
        form's ``kubernetes`` field): only ``TRIGGER_KEYS``, each within what this spec allows.

        Raises SpecError naming the key and the value: a key a run may not set at all (pod template,
        volumes, service account, ...: the DAG's author sets those), or an image or namespace
        outside ``allowed_images`` / ``allowed_namespaces``.
        """
        if choice is None or choice == {}:
            return self
        if not isinstance(choice, dict):
            raise SpecError(f"kubernetes: expected a mapping of {', '.join(TRIGGER_KEYS)}, got {choice!r}")
        for key in sorted(choice):
            if key not in TRIGGER_KEYS:
                raise SpecError(
                    f"kubernetes.{key}: a run may not set this (got {choice[key]!r}); the DAG's author sets "
                    "it in "
                    f"FSDPTrainOperator(kubernetes=...). A run may choose: {', '.join(TRIGGER_KEYS)}"
                )
        changes: dict[str, Any] = {}
        image = choice.get("image")
        if image not in (None, "", self.image):
            if not isinstance(image, str) or not image_allowed(image, self.allowed_images):
                raise SpecError(
                    f"kubernetes.image: {image!r} is not allowed by this DAG (allowed: "
                    f"{', '.join(repr(p) for p in (self.image, *self.allowed_images) if p) or 'none'}; "
                    "kubernetes.allowed_images)"
                )
            changes["image"] = image
        namespace = choice.get("namespace")
        if namespace not in (None, "", self.namespace):
            if namespace not in self.allowed_namespaces:
                raise SpecError(
                    f"kubernetes.namespace: {namespace!r} is not allowed by this DAG (allowed: "
                    f"{', '.join(repr(n) for n in (self.namespace, *self.allowed_namespaces) if n) or 'none'}"
                    "; "
                    "kubernetes.allowed_namespaces)"
                )
            changes["namespace"] = namespace
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self._FIELDS}
        for key in ("image_pull_secrets", "tolerations", "volumes", "allowed_images", "allowed_namespaces"):
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
            "of a PersistentVolumeClaim declared in kubernetes.volumes (mounted at the same path on the "
            "Airflow worker)"
        )


def kubernetes_and_capacity(value: Any, capacity: Any) -> tuple[KubernetesSpec, Any]:
    """The KubernetesSpec, and the capacity: ``capacity`` if given, else the older
    ``kubernetes={"capacity_type": ...}`` spelling of it."""
    if isinstance(value, dict) and "capacity_type" in value:
        value = dict(value)
        legacy = value.pop("capacity_type")
        if capacity is None:
            try:
                capacity = Capacity.parse(legacy, field="kubernetes.capacity_type")
            except ValueError as err:
                raise SpecError(str(err)) from None
    return KubernetesSpec.from_value(value), capacity


def kubernetes_for_run(kubernetes: Any, overrides: Any) -> Any:
    """The DAG author's pod settings (``kubernetes``) with what a run chose (``overrides``: the trigger
    form's ``kubernetes``, checked by ``KubernetesSpec.choose``), as ``JobSpec.from_arguments`` takes them."""
    if kubernetes is None and overrides in (None, {}):
        return None
    spec, legacy_capacity = kubernetes_and_capacity(kubernetes, None)
    chosen = spec.choose(overrides)
    if (
        legacy_capacity is not None
    ):  # the older kubernetes={"capacity_type": ...}: from_arguments reads it again
        return {**chosen.to_dict(), "capacity_type": kubernetes["capacity_type"]}
    return chosen
