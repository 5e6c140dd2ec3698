"""docker/rbac.yaml grants every API call the launcher makes, and nothing it does not make."""

from __future__ import annotations

import re

import yaml

from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import REPO

_VERB = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}


def _granted(kind: str = "Role") -> set[tuple[str, str, str]]:
    docs = list(yaml.safe_load_all((REPO / "docker" / "rbac.yaml").read_text()))
    return {
        (group, resource, verb)
        for role in docs
        if role and role["kind"] == kind
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _needed(requests: list[tuple[str, str]]) -> set[tuple[str, str, str]]:
    needed = set()
    for method, path in requests:
        match = re.match(
            r"^/(?:api/v1|apis/(?P<group>[^/]+)/v1)(?:/namespaces/[^/]+)?/(?P<res>[^/]+)(?P<name>/[^/]+)?(?P<sub>/\w+)?$",
            path,
        )
        assert match, path
        resource = match["res"] + (match["sub"] or "")
        verb = _VERB.get(method) or ("get" if match["name"] else "list")
        needed.add((match["group"] or "", resource, verb))
    return needed


def test_the_role_grants_exactly_what_a_group_lifecycle_uses(fake):
    launcher = KubernetesLauncher()
    spec = JobSpec.from_arguments(backend="kubernetes", num_nodes=2, checkpoint_uri="s3://bucket/run",
                                  kubernetes={"image": "img:1"})  # fmt: skip
    launcher.launch("life-r0", spec)
    fake.run("life-r0")
    fake.log("life-r0", 0, "[rank0]: step 1")
    launcher.logs("life-r0")
    launcher.find("life")
    fake.exit("life-r0", 1, 1)
    assert "exited 1" in launcher.status("life-r0").message  # reads the failed pod's log, settles the verdict
    launcher.launch("life-r1", spec)
    fake.run("life-r1", [0])
    assert launcher.checkpoint_now("life-r1") == 1  # the pod annotation: no pods/exec
    fake.exit("life-r1", 1, 137, disruption="EvictionByEvictionAPI")
    launcher.status("life-r1")  # suspends the Job
    launcher.stop("life-r1")
    elastic = JobSpec.from_arguments(
        backend="kubernetes", num_nodes=2, min_nodes=1, global_batch_size=2,
        checkpoint_uri="s3://bucket/run", kubernetes={"image": "img:1"},
    )  # fmt: skip
    launcher.launch("life-r2", elastic)  # its rendezvous store: a pod and a Service of its own
    fake.run("life-r2")
    launcher.status("life-r2")  # reads the store pod
    launcher.stop("life-r2")  # deletes it

    needed = _needed([r for r in fake.requests if "/nodes/" not in r[1]])
    granted = _granted()
    assert needed <= granted, f"calls the Role does not allow: {sorted(needed - granted)}"
    assert granted == needed, f"the Role grants what the launcher never calls: {sorted(granted - needed)}"
    assert not any(resource == "pods/exec" for _, resource, _ in granted)  # an opt-in, commented out
    # Cluster-scoped reads (the nodes' zone and instance type, for the summary's placement) are the
    # optional ClusterRole's: every such call is granted there, and nothing else is.
    node_calls = _needed([r for r in fake.requests if "/nodes/" in r[1]])
    assert node_calls <= _granted("ClusterRole"), sorted(node_calls - _granted("ClusterRole"))
