"""What the platform admin allows on a cluster: the top of the three levels of pod settings.

1. The **platform admin** sets a policy in the Kubernetes connection's extra, under
   ``dtrain_policy`` (``KubernetesPolicy``): which images, namespaces and service accounts any DAG
   may use, the most GPUs per node, and whether a pod may be privileged at all.
2. The **DAG author** sets the pods in ``FSDPTrainOperator(kubernetes=...)`` (``KubernetesSpec``,
   not templated): image, namespace, service account, pod template, volumes, secrets,
   tolerations, priority class, Kueue queue, and what a run may choose (``allowed_images``,
   ``allowed_namespaces``), within the admin's policy.
3. **Whoever presses Trigger** chooses ``KubernetesSpec.TRIGGER_KEYS`` (image, namespace) within what
   the DAG author allowed (``KubernetesSpec.choose``), and nothing else.

The launcher checks the finished spec against the policy before its first API call. A privileged
setting (``privileged_settings``) in a pod template is refused unless the admin's policy has
``allow_privileged``; then each one is logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_dtrain.errors import SpecError
from airflow_dtrain.kubernetes.spec import _image_patterns, _k8s_name, image_allowed

POLICY_EXTRA = "dtrain_policy"
"""The key of the Kubernetes connection's extra that holds the admin's policy."""

# Linux capabilities the Pod Security "restricted" profile lets a container add.
_ALLOWED_CAPABILITIES = {"NET_BIND_SERVICE"}


@dataclass(frozen=True, kw_only=True)
class KubernetesPolicy:
    """The platform admin's bounds on every group launched through one Kubernetes connection."""

    allowed_images: tuple[str, ...] = ()
    """Images any DAG may run: exact references or prefixes ending in ``/``, ``:`` or ``@``; empty: any."""
    allowed_namespaces: tuple[str, ...] = ()
    """Namespaces groups may be created in; empty: any."""
    allowed_service_accounts: tuple[str, ...] = ()
    """Service accounts the pods may run as; empty: any."""
    max_gpus_per_node: int | None = None
    """Most ``nvidia.com/gpu`` a pod may request."""
    allow_privileged: bool = False
    """Whether a DAG's pod template may carry privileged settings (each is logged when used)."""
    compile_cache_claim: str | None = None
    """A PersistentVolumeClaim (in each namespace groups run in, ReadWriteMany) that keeps each job's
    torch.compile cache across its pods and relaunches, one directory per job (``mount_compile_cache``);
    None: each pod compiles into its own /tmp."""

    _KEYS = ("allowed_images", "allowed_namespaces", "allowed_service_accounts", "max_gpus_per_node",
             "allow_privileged", "compile_cache_claim")  # fmt: skip

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> KubernetesPolicy:
        """The policy in a connection's extra (``{"dtrain_policy": {...}}``); none there: the defaults."""
        value = (extra or {}).get(POLICY_EXTRA)
        if value is None:
            return cls()
        where = f"connection extra {POLICY_EXTRA}"
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - set(cls._KEYS))
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(cls._KEYS)})")
        for key in ("allowed_namespaces", "allowed_service_accounts"):
            for name in value.get(key) or ():
                _k8s_name(f"{where}.{key}", name, optional=False)
        gpus = value.get("max_gpus_per_node")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
            raise SpecError(f"{where}.max_gpus_per_node: expected an integer >= 0, got {gpus!r}")
        claim = value.get("compile_cache_claim")
        if claim is not None:
            _k8s_name(f"{where}.compile_cache_claim", claim, optional=False)
        privileged = value.get("allow_privileged", False)
        if not isinstance(privileged, bool):
            raise SpecError(f"{where}.allow_privileged: expected true or false, got {privileged!r}")
        return cls(
            allowed_images=_image_patterns(f"{where}.allowed_images", value.get("allowed_images")),
            allowed_namespaces=tuple(value.get("allowed_namespaces") or ()),
            allowed_service_accounts=tuple(value.get("allowed_service_accounts") or ()),
            max_gpus_per_node=gpus,
            allow_privileged=privileged,
            compile_cache_claim=claim,
        )

    def check(self, spec: Any, *, namespace: str, log: Any = None) -> None:
        """Raise SpecError if the group ``spec`` (a JobSpec) in ``namespace`` is outside this policy,
        naming the field, the value and the policy key; log each privileged setting it allows."""
        k8s = spec.kubernetes
        # What the DAG may let a run choose must be within the policy too, not only what it chose now.
        for field, images in (
            ("kubernetes.image", (k8s.image,)),
            ("kubernetes.allowed_images", k8s.allowed_images),
        ):
            for image in images:
                if image and self.allowed_images and not _within(image, self.allowed_images):
                    raise SpecError(
                        f"{field}: {image!r} is not allowed on this cluster "
                        f"(the admin's {POLICY_EXTRA}.allowed_images: {', '.join(self.allowed_images)})"
                    )
        self.check_namespaces(namespace, k8s.allowed_namespaces)
        if self.allowed_service_accounts and k8s.service_account not in self.allowed_service_accounts:
            raise SpecError(
                f"kubernetes.service_account: {k8s.service_account!r} is not allowed on this cluster "
                f"(the admin's {POLICY_EXTRA}.allowed_service_accounts: "
                f"{', '.join(self.allowed_service_accounts)})"
            )
        gpus = spec.resources.gpus_per_node
        if self.max_gpus_per_node is not None and gpus > self.max_gpus_per_node:
            raise SpecError(
                f"node_resources.gpus_per_node: {gpus} is above this cluster's limit of "
                f"{self.max_gpus_per_node} (the admin's {POLICY_EXTRA}.max_gpus_per_node)"
            )
        for i, volume in enumerate(k8s.volumes):
            if self.compile_cache_claim and volume["claim"] == self.compile_cache_claim:
                raise SpecError(
                    f"kubernetes.volumes[{i}].claim: {volume['claim']!r} is this cluster's compile cache "
                    f"(the admin's {POLICY_EXTRA}.compile_cache_claim), which only the provider mounts, one "
                    "job's directory to each pod"
                )
        found = privileged_settings(k8s.pod_template)
        if found and not self.allow_privileged:
            raise SpecError(
                f"{found[0]}: a privileged setting, which only the platform admin can allow "
                f"({POLICY_EXTRA}.allow_privileged in the Kubernetes connection's extra)"
            )
        for setting in found:
            if log is not None:
                log.warning("Privileged pod setting allowed by the admin's policy: %s", setting)

    def check_namespaces(self, namespace: str, allowed_namespaces: tuple[str, ...] = ()) -> None:
        """Raise SpecError if ``namespace``, or one the DAG lets a run choose (``allowed_namespaces``), is
        outside this policy: the launcher's check, and the interruption sensor's before it watches a group."""
        for field, names in (("kubernetes.namespace", (namespace,)),
                             ("kubernetes.allowed_namespaces", allowed_namespaces)):  # fmt: skip
            for name in names:
                if self.allowed_namespaces and name not in self.allowed_namespaces:
                    allowed = ", ".join(self.allowed_namespaces)
                    raise SpecError(
                        f"{field}: {name!r} is not allowed on this cluster "
                        f"(the admin's {POLICY_EXTRA}.allowed_namespaces: {allowed})"
                    )


def _within(image: str, patterns: tuple[str, ...]) -> bool:
    """An image, or a DAG's image prefix, inside the admin's patterns."""
    if image_allowed(image, patterns):
        return True
    # a DAG's prefix ("ghcr.io/acme/dtrain:") is within an admin prefix that it starts with ("ghcr.io/acme/")
    return image.endswith(("/", ":", "@")) and any(
        p.endswith(("/", ":", "@")) and image.startswith(p) for p in patterns
    )


def privileged_settings(pod_template: dict[str, Any]) -> list[str]:
    """Every setting of a partial PodTemplateSpec that the Pod Security "baseline" or "restricted"
    profiles forbid, as ``"kubernetes.pod_template.spec.<path>: <value>"``."""
    found: list[str] = []
    spec = (pod_template or {}).get("spec") or {}
    where = "kubernetes.pod_template.spec"
    for key in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"):
        value = spec.get(key)
        if (key != "hostUsers" and value) or (key == "hostUsers" and value is True):
            found.append(f"{where}.{key}: {value!r}")
    for i, volume in enumerate(spec.get("volumes") or ()):
        if isinstance(volume, dict) and "hostPath" in volume:
            found.append(f"{where}.volumes[{i}].hostPath: {volume['hostPath']!r}")
    found += _security_context(spec.get("securityContext"), f"{where}.securityContext", pod=True)
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(spec.get(kind) or ()):
            if not isinstance(container, dict):
                continue
            path = f"{where}.{kind}[{i}]"
            found += _security_context(container.get("securityContext"), f"{path}.securityContext", pod=False)
            for j, port in enumerate(container.get("ports") or ()):
                if isinstance(port, dict) and port.get("hostPort"):
                    found.append(f"{path}.ports[{j}].hostPort: {port['hostPort']!r}")
    return found


def _security_context(ctx: Any, where: str, *, pod: bool) -> list[str]:
    if not isinstance(ctx, dict):
        return []
    found = []
    if ctx.get("runAsUser") == 0:
        found.append(f"{where}.runAsUser: 0")
    if ctx.get("runAsGroup") == 0:
        found.append(f"{where}.runAsGroup: 0")
    if ctx.get("runAsNonRoot") is False:
        found.append(f"{where}.runAsNonRoot: False")
    if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}.seccompProfile.type: 'Unconfined'")
    if (ctx.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}.windowsOptions.hostProcess: True")
    if pod and ctx.get("sysctls"):
        found.append(f"{where}.sysctls: {ctx['sysctls']!r}")
    if not pod:
        if ctx.get("privileged"):
            found.append(f"{where}.privileged: {ctx['privileged']!r}")
        if ctx.get("allowPrivilegeEscalation") is True:
            found.append(f"{where}.allowPrivilegeEscalation: True")
        added = set((ctx.get("capabilities") or {}).get("add") or ()) - _ALLOWED_CAPABILITIES
        if added:
            found.append(f"{where}.capabilities.add: {sorted(added)!r}")
        if ctx.get("procMount") not in (None, "Default"):
            found.append(f"{where}.procMount: {ctx['procMount']!r}")
    return found
