"""Where and how the pods of a ``kubernetes`` group run: the Kubernetes half of a ``JobSpec``.

Plain data, validated when built (``KubernetesSpec.from_value``), so a bad setting fails in
the DAG file or before any API call. Which capacity the pods select (spot, on-demand) is
not here: it is the group's ``JobSpec.capacity``, shared with the budget and the ledger.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from trainer.money.capacity import Capacity
from trainer.config.fields import check_field, check_value, declared, setting

from airflow_dtrain.errors import SpecError, checked

DEFAULT_TTL_S = 86_400
"""How long a finished group's Job is kept by default (``ttlSecondsAfterFinished``): a day."""

TRIGGER_KEYS = ("image", "namespace")
"""What a run (the trigger form, ``dag_run.conf``) may choose of the pods, within what the DAG allows."""

_K8S_NAME = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
"""A Kubernetes object name (DNS subdomain: at most 253 characters)."""
_NAME_RULE = "not a Kubernetes object name (lowercase letters, digits, '-', '.')"
_DOMAIN = (
    r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
)
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = rf"(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*"
_IMAGE = (
    rf"{_REPOSITORY}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
"""An image reference as registries parse it (the distribution/reference grammar): [registry[:port]/]path
[:tag][@digest]; nothing a shell or a template would read."""
_IMAGE_OR_PREFIX = rf"{_IMAGE}|(?:{_DOMAIN}/)(?:{_PATH}/)*|{_REPOSITORY}[:@]"
"""An image, or a prefix of allowed images: a registry or repository ending in '/', ':' or '@'."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Plain env values are visible to anyone who can read the Job: these names belong in secret_env.
_SECRET_LOOKING = re.compile(r"SECRET|PASSWORD|TOKEN|PRIVATE_KEY|ACCESS_KEY|API_KEY|CREDENTIAL", re.I)


def image_allowed(image: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """``image`` is one of ``patterns`` or starts with one that ends in ``/``, ``:`` or ``@`` (a registry
    or repository prefix: ``"ghcr.io/acme/"``, ``"ghcr.io/acme/dtrain:"``, ``"ghcr.io/acme/dtrain@"``).
    A prefix without that separator matches exactly only, so ``ghcr.io/acme`` never admits
    ``ghcr.io/acme-evil/x``."""
    if not image or not re.fullmatch(_IMAGE, image):
        return False
    return any(
        image == p or (p.endswith(("/", ":", "@")) and image.startswith(p) and len(image) > len(p))
        for p in patterns
    )


def _name(help: str, default: Any = None) -> Any:
    """A field that holds a Kubernetes object name (or, for a tuple, a list of them)."""
    return setting(default, help=help, pattern=_K8S_NAME, rule=_NAME_RULE)


@dataclass(frozen=True, kw_only=True)
class KubernetesSpec:
    """Where and how the pods of a ``kubernetes`` group run (ignored by the other backends).

    Each field is declared once, with ``setting()``: its help, and the rule (pattern, bounds) its
    values obey; ``from_value`` validates a ``kubernetes={...}`` mapping by those declarations."""

    image: str | None = setting(
        None, help="Trainer image (docker/Dockerfile); required for the kubernetes backend.",
        pattern=_IMAGE, rule="not an image reference ([registry[:port]/]path[:tag][@digest], path lowercase)",
    )  # fmt: skip
    image_pull_policy: str = setting(
        "IfNotPresent", help="Always, IfNotPresent or Never.",
        pattern="Always|IfNotPresent|Never", rule="choose Always, IfNotPresent or Never",
    )  # fmt: skip
    image_pull_secrets: tuple[str, ...] = _name(
        "Names of docker-registry Secrets for a private registry.", ()
    )
    namespace: str | None = _name(
        "Namespace of the group; default: the connection's namespace, else ``default``."
    )
    service_account: str = _name(
        "Service account of the trainer pods (e.g. bound to an IAM role for S3 through IRSA).",
        "dtrain-trainer",
    )
    node_selector: dict[str, str] = setting(
        factory=dict,
        help='Extra node labels the pods require, e.g. {"node.kubernetes.io/instance-type": "p5.48xlarge"}.',
    )
    tolerations: tuple[dict[str, Any], ...] = setting(
        (), help="Extra tolerations (Kubernetes Toleration objects)."
    )
    topology_spread: str | None = setting(
        None, help="A topology key (kubernetes.io/hostname) to spread the group's pods over, max skew 1.",
        pattern=".+", rule="expected a topology key such as 'kubernetes.io/hostname'",
    )  # fmt: skip
    kueue_queue: str | None = _name(
        "Kueue LocalQueue: the Job is created suspended and admitted as a whole (gang admission)."
    )
    priority_class: str | None = _name("PriorityClass of the pods.")
    pod_template: dict[str, Any] = setting(
        factory=dict,
        help="A partial PodTemplateSpec merged over the rendered one (containers, volumes, env by name).",
    )
    env: dict[str, str] = setting(
        factory=dict,
        help="Plain environment variables of the trainer container (no secrets: use secret_env).",
    )
    secret_env: dict[str, dict[str, str]] = setting(
        factory=dict,
        help='Environment variables from Secrets: {"HF_TOKEN": {"secret": "hf", "key": "token"}}.',
    )
    volumes: tuple[dict[str, Any], ...] = setting(
        (), help='PersistentVolumeClaims to mount: [{"claim": "ckpt", "mount_path": "/mnt/ckpt"}].'
    )
    shm_size: str = setting(
        "8Gi", help="Size limit of the memory-backed /dev/shm (NCCL and data loader workers use it).",
        pattern=r"[0-9]+(\.[0-9]+)?([kMGTPE]i?)?", rule="not a Kubernetes quantity",
    )  # fmt: skip
    pending_timeout_s: float = setting(
        1800.0, ge=0, rule="must be a number >= 0 (0: no timeout)",
        help='A group with a pod not yet running after this long fails with "no capacity"; 0: wait forever.',
    )  # fmt: skip
    statsd_host: str = setting(
        "", help="statsd host of the trainer; ``node`` means the IP of the pod's node (a statsd DaemonSet)."
    )
    statsd_port: int = setting(8125, ge=1, rule="must be an integer >= 1", help="statsd UDP port.")
    rdzv_port: int = setting(
        29400, ge=1, rule="must be an integer >= 1", help="Port of the c10d rendezvous store on pod 0."
    )
    ttl_seconds_after_finished: int | None = setting(
        DEFAULT_TTL_S, ge=0, rule="must be an integer >= 0",
        help="Delete a finished Job (and its pods, Service, ConfigMap) this long after it ended; None keeps "
        "it. The operator reads a group's outcome right after it ends, and each Job carries its task's "
        "earlier outcomes, so counting preemptions survives the deletion of the earlier Jobs.",
    )  # fmt: skip
    checkpoint_now: str = setting(
        "annotation", pattern="annotation|exec", rule="choose annotation or exec",
        help='How "checkpoint now" reaches the pods: annotation (a pod annotation the kubelet writes into a '
        "downward-API file the node agent follows: no pods/exec, but the kubelet refreshes it on its sync, "
        "up to about a minute) or exec (SIGUSR1 through pods/exec at once; the Role needs pods/exec).",
    )  # fmt: skip
    allowed_images: tuple[str, ...] = setting(
        (), pattern=_IMAGE_OR_PREFIX, rule="not an image reference or prefix",
        help="Images a run may choose instead of image (TRIGGER_KEYS): exact references, or prefixes ending "
        'in /, : or @ ("ghcr.io/acme/dtrain:": any tag of that repository).',
    )  # fmt: skip
    allowed_namespaces: tuple[str, ...] = _name("Namespaces a run may choose instead of namespace.", ())

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The fields, in declaration order (the keys ``kubernetes={...}`` takes)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_value(cls, value: Any) -> KubernetesSpec:
        """A ``kubernetes={...}`` mapping (None: the defaults) as a KubernetesSpec, each key validated by
        its declaration; a SpecError names the key (``kubernetes.env.HF_TOKEN``) and the value."""
        if value is None:
            return cls()
        if isinstance(value, KubernetesSpec):
            return value
        if not isinstance(value, dict):
            raise SpecError(f"kubernetes: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - set(cls.names()))
        if unknown:
            raise SpecError(f"kubernetes: unknown key {unknown[0]!r} (allowed: {', '.join(cls.names())})")
        return checked(_parse, value)

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
        out = {name: getattr(self, name) for name in self.names()}
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


_SCALARS = (
    "image", "image_pull_policy", "namespace", "service_account", "topology_spread", "kueue_queue",
    "priority_class", "shm_size", "pending_timeout_s", "statsd_host", "statsd_port", "rdzv_port",
    "ttl_seconds_after_finished", "checkpoint_now",
)  # fmt: skip
"""The fields ``check_value`` validates whole, by their declarations; the others are collections, checked
item by item (``_parse``)."""


def _parse(value: dict[str, Any]) -> KubernetesSpec:
    """``KubernetesSpec.from_value``'s mapping, known keys only, validated: a ConfigError names the key."""
    v = dict(value)
    if isinstance(v.get("shm_size"), (int, float)) and not isinstance(v["shm_size"], bool):
        v["shm_size"] = str(v["shm_size"])  # 8 is the quantity "8"
    fields = {n: check_value(KubernetesSpec, n, v[n], f"kubernetes.{n}") for n in _SCALARS if n in v}
    for key in ("image_pull_secrets", "allowed_images", "allowed_namespaces"):
        if key in v:
            fields[key] = _each(key, v[key])
    for key, parse in (
        ("node_selector", _str_map), ("tolerations", _dict_list), ("pod_template", _pod_template),
        ("env", _env), ("secret_env", _secret_env), ("volumes", _volumes),
    ):  # fmt: skip
        if key in v:
            fields[key] = parse(f"kubernetes.{key}", v[key])
    return KubernetesSpec(**fields)


def _each(key: str, values: Any) -> tuple[str, ...]:
    """A list of strings, each by the pattern declared on field ``key`` (a name, an image)."""
    where = f"kubernetes.{key}"
    if isinstance(values, str):
        raise SpecError(f"{where}: expected a list, got {values!r}")
    f = declared(KubernetesSpec, key)
    return tuple(check_field(f, str, item, where) for item in values or ())


def _object_name(where: str, value: Any) -> str:
    """A Kubernetes object name (a Secret, a claim), by the rule of the declared names."""
    return check_field(declared(KubernetesSpec, "service_account"), str, value, where)


def _k8s_name(name: str, value: Any, *, optional: bool = True) -> str | None:
    """A Kubernetes object name (None allowed when ``optional``), as ``kubernetes.policy`` checks them."""
    if value is None and optional:
        return None
    return checked(_object_name, name, value)


def _image_patterns(name: str, value: Any) -> tuple[str, ...]:
    """Image references or prefixes, by ``allowed_images``' declaration (``kubernetes.policy``'s too)."""
    f = declared(KubernetesSpec, "allowed_images")
    return tuple(checked(check_field, f, str, pattern, name) for pattern in value or ())


def _str_map(where: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError(f"{where}: expected a mapping of strings to strings, got {value!r}")
    return dict(value)


def _dict_list(where: str, value: Any) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, dict) for v in value):
        raise SpecError(f"{where}: expected a list of mappings, got {value!r}")
    return tuple(dict(v) for v in value)


def _pod_template(where: str, value: Any) -> dict[str, Any]:
    template = value or {}
    if not isinstance(template, dict) or set(template) - {"metadata", "spec"}:
        raise SpecError(f"{where}: expected a PodTemplateSpec ({{'metadata', 'spec'}}), got {template!r}")
    return template


def _env(where: str, value: Any) -> dict[str, str]:
    """Plain variables: valid names, none that looks like a secret (those go in ``secret_env``)."""
    env = _str_map(where, value)
    for key in env:
        if not _ENV_NAME.match(key):
            raise SpecError(f"{where}: not an environment variable name: {key!r}")
        if _SECRET_LOOKING.search(key):
            raise SpecError(
                f"{where}.{key}: looks like a secret; pass it with "
                f"secret_env={{{key!r}: {{'secret': ..., 'key': ...}}}} so it stays in a Secret"
            )
    return env


def _secret_env(where: str, value: Any) -> dict[str, dict[str, str]]:
    """``{NAME: {"secret": SECRET, "key": KEY}}``, each SECRET a Kubernetes object name."""
    secret_env = value or {}
    if not isinstance(secret_env, dict):
        raise SpecError(f"{where}: expected a mapping, got {secret_env!r}")
    for key, ref in secret_env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise SpecError(f"{where}: not an environment variable name: {key!r}")
        if not isinstance(ref, dict) or set(ref) != {"secret", "key"}:
            raise SpecError(f"{where}.{key}: expected {{'secret': NAME, 'key': KEY}}, got {ref!r}")
        _object_name(f"{where}.{key}.secret", ref["secret"])
    return {k: dict(r) for k, r in secret_env.items()}


def _volumes(where: str, value: Any) -> tuple[dict[str, Any], ...]:
    """PersistentVolumeClaims: ``{"claim": PVC, "mount_path": "/abs/path"[, "read_only": bool]}``."""
    volumes = _dict_list(where, value)
    for i, volume in enumerate(volumes):
        if set(volume) - {"claim", "mount_path", "read_only"} or not {"claim", "mount_path"} <= set(volume):
            raise SpecError(
                f"{where}[{i}]: expected {{'claim': PVC, 'mount_path': '/abs/path'}}, got {volume!r}"
            )
        _object_name(f"{where}[{i}].claim", volume["claim"])
        if not str(volume["mount_path"]).startswith("/"):
            raise SpecError(f"{where}[{i}].mount_path: must be absolute, got {volume['mount_path']!r}")
    return volumes


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
