"""The pods pass Pod Security "restricted" and carry requests and limits, as rendered by
``python -m airflow_dtrain render`` and by the launcher; the checker of the profile can fail;
docker/namespace.yaml enforces the profile."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
import yaml

from airflow_dtrain.kubernetes.objects import render_group
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import REPO
from tests.kubernetes.pod_security import baseline, pod_spec_of, restricted
from tests.kubernetes.test_kubernetes_objects import K8S_VERSIONS

SIZES = ("cpu", "memory", "ephemeral-storage")


def _render_cli(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_dtrain",
            "render",
            "--backend",
            "kubernetes",
            "--image",
            "img:1",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ.copy(),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _spec(**arguments: Any) -> JobSpec:
    kubernetes = arguments.pop("kubernetes", {})
    return JobSpec.from_arguments(backend="kubernetes", checkpoint_uri="s3://bucket/run",
                                  kubernetes={"image": "img:1", **kubernetes}, **arguments)  # fmt: skip


def _job(spec: JobSpec) -> dict[str, Any]:
    return render_group("g-r0", spec, namespace="dtrain")[2]


def _every_container(pod: dict[str, Any]):
    for kind in ("initContainers", "containers"):
        yield from pod.get(kind) or ()


# What a DAG author may set without the admin's leave: none of it may loosen the pods.
AUTHOR_CONFIGS = {
    "defaults": {},
    "gpus, spot, zone and instance type": dict(
        num_nodes=2,
        procs_per_node=8,
        global_batch_size=32,
        resources={"gpus_per_node": 8},
        capacity="spot",
        zone="us-east-1a",
        instance_type="p5.48xlarge",
    ),
    "everything an author sets": dict(
        num_nodes=2,
        global_batch_size=4,
        budget_usd=100,
        price_per_node_hour=10,
        kubernetes={
            "kueue_queue": "gpu",
            "priority_class": "training",
            "topology_spread": "kubernetes.io/hostname",
            "statsd_host": "node",
            "secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
            "volumes": [{"claim": "data", "mount_path": "/data", "read_only": True}],
            "image_pull_secrets": ["regcred"],
            "tolerations": [{"key": "team", "operator": "Exists"}],
        },
    ),
    "a pod template with a sidecar and an init container": dict(
        kubernetes={
            "pod_template": {
                "metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}},
                "spec": {
                    "initContainers": [{"name": "warm-cache", "image": "busybox", "command": ["true"]}],
                    "containers": [
                        {"name": "trainer", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
                        {
                            "name": "log-shipper",
                            "image": "fluent-bit:3",
                            "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}},
                        },
                    ],
                },
            }
        }
    ),
}


def test_every_manifest_render_prints_for_the_defaults_passes_restricted_with_requests_and_limits():
    for docs in (_render_cli(), _render_cli("--nodes", "2", "--gpus-per-node", "8")):
        [job] = [d for d in docs if d["kind"] == "Job"]
        for doc in docs:
            kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)
        assert restricted(job) == []
        pod = job["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == 1000
        trainer = pod["containers"][0]
        assert trainer["securityContext"]["readOnlyRootFilesystem"] is True
        resources = trainer["resources"]
        assert resources["requests"] == resources["limits"], "Guaranteed: requests equal limits"
        assert set(SIZES) <= set(resources["limits"])
    assert resources["limits"]["nvidia.com/gpu"] == "8"


@pytest.mark.parametrize("config", AUTHOR_CONFIGS, ids=list(AUTHOR_CONFIGS))
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_whatever_the_author_sets_the_pods_stay_restricted_and_sized(config, version):
    objects = render_group("g-r0", _spec(**copy.deepcopy(AUTHOR_CONFIGS[config])), namespace="dtrain")
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    job = objects[2]
    assert restricted(job) == []
    pod = job["spec"]["template"]["spec"]
    for container in _every_container(pod):
        resources = container["resources"]
        for size in SIZES:
            assert resources["requests"][size] and resources["limits"][size], (container["name"], size)
    # the writable places the trainer needs under a read-only root: /tmp (HOME, caches, data) and /dev/shm
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert (
        "emptyDir" in volumes[mounts["/tmp"]]
        and volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    )
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["HOME"].startswith("/tmp/") and env["DTRAIN_DATA_DIR"].startswith("/tmp/")


def test_an_added_container_keeps_its_own_resources_and_gets_limits_for_the_rest():
    pod = _job(_spec(**copy.deepcopy(AUTHOR_CONFIGS["a pod template with a sidecar and an init container"])))
    pod = pod["spec"]["template"]["spec"]
    shipper = next(c for c in pod["containers"] if c["name"] == "log-shipper")
    assert shipper["resources"]["requests"] == {"cpu": "250m", "memory": "128Mi", "ephemeral-storage": "1Gi"}
    assert shipper["resources"]["limits"] == shipper["resources"]["requests"]
    [init] = pod["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_privileged_setting_the_admin_allowed_reaches_the_pod_and_the_checker_names_it():
    """An admin-widened config (dtrain_policy.allow_privileged): the manifest still validates, and the
    one privileged setting is what the restricted checker reports (a restricted namespace refuses it)."""
    spec = _spec(kubernetes={"pod_template": {"spec": {"containers": [
        {"name": "trainer", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}}})  # fmt: skip
    job = _job(spec)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    assert restricted(job) == [
        "Capabilities: spec.containers[0].securityContext.capabilities.add: 'IPC_LOCK'",  # baseline's
        "Capabilities: spec.containers[0].securityContext.capabilities.add: 'IPC_LOCK'",  # restricted's
    ]


def _set(path: str, value: Any):
    def change(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for part in parents:
            if part.endswith("]"):
                name, index = part[:-1].split("[")
                node = node[name][int(index)]
            else:
                node = node.setdefault(part, {})
        node[last] = value

    return change


def _drop(path: str):
    def change(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for part in parents:
            name, _, index = part.partition("[")
            node = node[name][int(index[:-1])] if index else node[name]
        node.pop(last)

    return change


def _append(key: str, item: dict[str, Any]):
    return lambda pod: pod.setdefault(key, []).append(item)


C = "containers[0].securityContext"
# (a change to the rendered default pod, the control that must catch it)
VIOLATIONS = {
    "hostProcess": (_set("securityContext.windowsOptions", {"hostProcess": True}), "HostProcess"),
    "hostNetwork": (_set("hostNetwork", True), "Host Namespaces"),
    "hostPID": (_set("hostPID", True), "Host Namespaces"),
    "hostIPC": (_set("hostIPC", True), "Host Namespaces"),
    "privileged": (_set(f"{C}.privileged", True), "Privileged Containers"),
    "added SYS_ADMIN": (_set(f"{C}.capabilities.add", ["SYS_ADMIN"]), "Capabilities"),
    "added CHOWN (baseline's, not restricted's)": (_set(f"{C}.capabilities.add", ["CHOWN"]), "Capabilities"),
    "not dropping ALL": (_set(f"{C}.capabilities.drop", ["NET_RAW"]), "Capabilities"),
    "hostPath": (_append("volumes", {"name": "root", "hostPath": {"path": "/"}}), "HostPath Volumes"),
    "hostPort": (_set("containers[0].ports", [{"containerPort": 29400, "hostPort": 29400}]), "Host Ports"),
    "AppArmor unconfined": (_set(f"{C}.appArmorProfile", {"type": "Unconfined"}), "AppArmor"),
    "SELinux user": (_set("securityContext.seLinuxOptions", {"user": "system_u"}), "SELinux"),
    "SELinux type": (_set(f"{C}.seLinuxOptions", {"type": "spc_t"}), "SELinux"),
    "/proc unmasked": (_set(f"{C}.procMount", "Unmasked"), "/proc Mount Type"),
    "seccomp unconfined": (_set("securityContext.seccompProfile", {"type": "Unconfined"}), "Seccomp"),
    "seccomp unset everywhere": (
        lambda pod: (_drop("securityContext.seccompProfile")(pod), _drop(f"{C}.seccompProfile")(pod)),
        "Seccomp",
    ),
    "unsafe sysctl": (
        _set("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "65536"}]),
        "Sysctls",
    ),
    "nfs volume": (_append("volumes", {"name": "n", "nfs": {"server": "nfs", "path": "/"}}), "Volume Types"),
    "privilege escalation": (_set(f"{C}.allowPrivilegeEscalation", True), "Privilege Escalation"),
    "privilege escalation unset": (_drop(f"{C}.allowPrivilegeEscalation"), "Privilege Escalation"),
    "runAsNonRoot false": (_set(f"{C}.runAsNonRoot", False), "Running as Non-root"),
    "runAsNonRoot unset everywhere": (
        lambda pod: (_drop("securityContext.runAsNonRoot")(pod), _drop(f"{C}.runAsNonRoot")(pod)),
        "Running as Non-root",
    ),
    "runAsUser 0": (_set(f"{C}.runAsUser", 0), "Running as Non-root user"),
    "an init container as the image left it": (
        _append("initContainers", {"name": "init", "image": "busybox"}),
        "Privilege Escalation",
    ),
}


@pytest.mark.parametrize("name", VIOLATIONS, ids=list(VIOLATIONS))
def test_the_checker_fails_a_pod_with_each_violation(name):
    change, control = VIOLATIONS[name]
    job = _job(_spec())
    assert restricted(job) == [], "the unchanged pod passes"
    change(job["spec"]["template"]["spec"])
    found = restricted(job)
    assert any(line.startswith(f"{control}: ") for line in found), found


def test_the_checker_reads_apparmor_annotations_and_tells_baseline_from_restricted():
    job = _job(_spec())
    job["spec"]["template"]["metadata"]["annotations"] = {
        "container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"
    }
    assert (
        baseline(job)
        == restricted(job)
        == [
            "AppArmor: metadata.annotations['container.apparmor.security.beta.kubernetes.io/trainer']: "
            "'unconfined'"
        ]
    )
    job = _job(_spec())
    pod_spec_of(job)[1]["containers"][0]["securityContext"]["capabilities"]["add"] = ["CHOWN"]
    assert baseline(job) == [] and restricted(job) != []


def test_the_namespace_manifest_enforces_restricted():
    [namespace] = list(yaml.safe_load_all((REPO / "docker" / "namespace.yaml").read_text()))
    kubernetes_validate.validate(namespace, K8S_VERSIONS[0], strict=True)
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "warn", "audit"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    rbac = list(yaml.safe_load_all((REPO / "docker" / "rbac.yaml").read_text()))
    assert {
        d["metadata"].get("namespace") for d in rbac if d["kind"] in ("Role", "RoleBinding", "ServiceAccount")
    } == {namespace["metadata"]["name"]}, "the same namespace as docker/rbac.yaml"


def test_the_image_runs_as_the_user_the_pods_ask_for():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    pod = _job(_spec())["spec"]["template"]["spec"]["securityContext"]
    uid, gid = pod["runAsUser"], pod["runAsGroup"]
    assert f"USER {uid}:{gid}" in dockerfile and f"--uid {uid}" in dockerfile and f"--gid {gid}" in dockerfile


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_an_elastic_groups_store_pod_is_restricted_sized_and_asks_for_no_gpu(version):
    spec = _spec(
        num_nodes=4, min_nodes=2, global_batch_size=64, procs_per_node=8, resources={"gpus_per_node": 8}
    )
    [store] = [o for o in render_group("g-r0", spec, namespace="dtrain") if o["kind"] == "Pod"]
    kubernetes_validate.validate(store, version, strict=True)
    assert restricted(store) == []
    [container] = store["spec"]["containers"]
    resources = container["resources"]
    assert resources["requests"] == resources["limits"] and set(SIZES) <= set(resources["limits"])
    assert "nvidia.com/gpu" not in resources["limits"]
    affinity = store["spec"]["affinity"]  # not bound to the group's spot capacity, zone or instance type
    assert set(affinity) == {"nodeAffinity"} and set(affinity["nodeAffinity"]) == {
        "preferredDuringSchedulingIgnoredDuringExecution"
    }, "on-demand nodes preferred, nothing required"
