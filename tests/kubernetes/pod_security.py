"""A checker of the Pod Security Standards' "baseline" and "restricted" profiles, for tests.

Written from the profiles' published rules
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, as of Kubernetes 1.31+):
each check below is named after the control of that page it implements. No maintained Python
library implements them (the reference is Go: k8s.io/pod-security-admission; the Python
scanners found -- checkov and the like -- carry their own rule sets, not the profile's), so the
rules are written out here, on the pod spec, the way the admission controller reads it:

* every container means ``containers``, ``initContainers`` and ``ephemeralContainers``;
* a container-level field may be left unset where the pod-level one is set to an allowed
  value (Running as Non-root, Seccomp), except where the page says otherwise.

``violations(obj)`` takes a Pod, a PodTemplateSpec, a Job (its pod template) or a bare PodSpec
and returns one line per violation, ``"<control>: <field path>: <value>"``; empty: it passes.
"""

from __future__ import annotations

from typing import Any

DOCS = "https://kubernetes.io/docs/concepts/security/pod-security-standards/"

# Baseline "Capabilities": what may be added beyond the runtime's default set.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
# Baseline "Sysctls": the safe set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
# Baseline "SELinux": the types a pod or container may ask for.
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Restricted "Volume Types": the only volume sources allowed.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
_CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")


def pod_spec_of(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod metadata, pod spec) of a Pod, PodTemplateSpec, Job or bare PodSpec."""
    kind = obj.get("kind")
    if kind == "Job":
        template = obj["spec"]["template"]
        return template.get("metadata") or {}, template["spec"]
    if kind == "Pod" or ("spec" in obj and "containers" in (obj.get("spec") or {})):
        return obj.get("metadata") or {}, obj["spec"]
    return {}, obj


def _containers(spec: dict[str, Any]):
    for kind in _CONTAINER_KINDS:
        for i, container in enumerate(spec.get(kind) or ()):
            yield f"spec.{kind}[{i}]", container, container.get("securityContext") or {}


def baseline(obj: dict[str, Any]) -> list[str]:
    """Violations of the "baseline" profile, in the order the Pod Security Standards list the controls."""
    meta, spec = pod_spec_of(obj)
    pod_ctx = spec.get("securityContext") or {}
    return (
        _baseline_host(spec, pod_ctx) + _baseline_containers(spec) + _baseline_profiles(meta, spec, pod_ctx)
    )


def _baseline_host(spec: dict[str, Any], pod_ctx: dict[str, Any]) -> list[str]:
    """Baseline: HostProcess and host namespaces."""
    found: list[str] = []
    # HostProcess: Windows HostProcess containers are not allowed.
    if (pod_ctx.get("windowsOptions") or {}).get("hostProcess"):
        found.append("HostProcess: spec.securityContext.windowsOptions.hostProcess: true")
    for where, _, ctx in _containers(spec):
        if (ctx.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"HostProcess: {where}.securityContext.windowsOptions.hostProcess: true")

    # Host Namespaces: hostNetwork, hostPID, hostIPC must be unset or false.
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"Host Namespaces: spec.{key}: {spec[key]!r}")
    return found


def _baseline_containers(spec: dict[str, Any]) -> list[str]:
    """Baseline: privileged containers, capabilities, host ports, /proc mounts and hostPath volumes."""
    found: list[str] = []
    for where, container, ctx in _containers(spec):
        # Privileged Containers
        if ctx.get("privileged"):
            found.append(f"Privileged Containers: {where}.securityContext.privileged: {ctx['privileged']!r}")
        # Capabilities: nothing added beyond the default set.
        for cap in (ctx.get("capabilities") or {}).get("add") or ():
            if cap not in BASELINE_CAPABILITIES:
                found.append(f"Capabilities: {where}.securityContext.capabilities.add: {cap!r}")
        # Host Ports: unset or 0.
        for j, port in enumerate(container.get("ports") or ()):
            if port.get("hostPort"):
                found.append(f"Host Ports: {where}.ports[{j}].hostPort: {port['hostPort']!r}")
        # /proc Mount Type: unset or Default.
        if ctx.get("procMount") not in (None, "Default"):
            found.append(f"/proc Mount Type: {where}.securityContext.procMount: {ctx['procMount']!r}")

    # HostPath Volumes
    for i, volume in enumerate(spec.get("volumes") or ()):
        if "hostPath" in volume:
            found.append(f"HostPath Volumes: spec.volumes[{i}].hostPath: {volume['hostPath']!r}")
    return found


def _baseline_profiles(meta: dict[str, Any], spec: dict[str, Any], pod_ctx: dict[str, Any]) -> list[str]:
    """Baseline: AppArmor, SELinux, seccomp and sysctls."""
    found: list[str] = []
    # AppArmor: unset, RuntimeDefault or Localhost (field or the older annotation: runtime/default,
    # localhost/*).
    contexts = [("spec.securityContext", pod_ctx)] + [
        (f"{w}.securityContext", c) for w, _, c in _containers(spec)
    ]
    for where, ctx in contexts:
        kind = (ctx.get("appArmorProfile") or {}).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"AppArmor: {where}.appArmorProfile.type: {kind!r}")
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            found.append(f"AppArmor: metadata.annotations[{key!r}]: {value!r}")

    # SELinux: type from the allowed set; user and role unset.
    for where, ctx in contexts:
        options = ctx.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            found.append(f"SELinux: {where}.seLinuxOptions.type: {options['type']!r}")
        for key in ("user", "role"):
            if options.get(key):
                found.append(f"SELinux: {where}.seLinuxOptions.{key}: {options[key]!r}")

    # Seccomp (baseline): never Unconfined.
    for where, ctx in contexts:
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"Seccomp: {where}.seccompProfile.type: 'Unconfined'")

    # Sysctls: only the safe set.
    for i, sysctl in enumerate(pod_ctx.get("sysctls") or ()):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"Sysctls: spec.securityContext.sysctls[{i}].name: {sysctl.get('name')!r}")
    return found


def restricted(obj: dict[str, Any]) -> list[str]:
    """Violations of the "restricted" profile (which includes "baseline")."""
    found = baseline(obj)
    _, spec = pod_spec_of(obj)
    pod_ctx = spec.get("securityContext") or {}

    # Volume Types: only core volume sources and PVCs.
    for i, volume in enumerate(spec.get("volumes") or ()):
        sources = set(volume) - {"name"}
        for source in sorted(sources - RESTRICTED_VOLUMES):
            found.append(f"Volume Types: spec.volumes[{i}].{source}")

    pod_non_root = pod_ctx.get("runAsNonRoot") is True
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    if pod_ctx.get("runAsNonRoot") is False:
        found.append("Running as Non-root: spec.securityContext.runAsNonRoot: false")
    if pod_ctx.get("runAsUser") == 0:
        found.append("Running as Non-root user: spec.securityContext.runAsUser: 0")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"Seccomp: spec.securityContext.seccompProfile.type: {pod_seccomp!r}")

    for where, _, ctx in _containers(spec):
        # Privilege Escalation: allowPrivilegeEscalation must be false.
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"Privilege Escalation: {where}.securityContext.allowPrivilegeEscalation: "
                         f"{ctx.get('allowPrivilegeEscalation')!r}")  # fmt: skip
        # Running as Non-root: true on the pod, or on every container (and never false on one).
        non_root = ctx.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            found.append(f"Running as Non-root: {where}.securityContext.runAsNonRoot: {non_root!r}")
        # Running as Non-root user: runAsUser is never 0.
        if ctx.get("runAsUser") == 0:
            found.append(f"Running as Non-root user: {where}.securityContext.runAsUser: 0")
        # Seccomp: RuntimeDefault or Localhost, on the pod or on every container.
        kind = (ctx.get("seccompProfile") or {}).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost") or (kind is None and pod_seccomp is None):
            found.append(f"Seccomp: {where}.securityContext.seccompProfile.type: {kind!r}")
        # Capabilities: drop ALL; add only NET_BIND_SERVICE.
        capabilities = ctx.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or ()):
            found.append(
                f"Capabilities: {where}.securityContext.capabilities.drop: {capabilities.get('drop')!r}"
            )
        for cap in capabilities.get("add") or ():
            if cap != "NET_BIND_SERVICE":
                found.append(f"Capabilities: {where}.securityContext.capabilities.add: {cap!r}")
    return found


violations = restricted
