"""A warm restart on Kubernetes: with the admin's compile cache claim (``dtrain_policy.compile_cache_claim``),
every pod of a job, its relaunches and its replacements on other nodes included, mounts that job's own
directory of it (a subPath), so that they find the job's compiled code instead of compiling from nothing;
no pod sees another job's, and no DAG author can mount the claim. Without the claim, nothing changes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import kubernetes_validate
import pytest

from airflow_dtrain.errors import SpecError
from airflow_dtrain.kubernetes.container import COMPILE_CACHE_MOUNT, COMPILE_CACHE_VOLUME
from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.kubernetes.objects import render_group
from airflow_dtrain.job.spec import JobSpec
from tests.kubernetes.test_kubernetes_objects import K8S_VERSIONS

CLAIM = "dtrain-compile-cache"
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def _spec(tmp_path: Path, job: str, owner: str = "team-a", **kubernetes) -> JobSpec:
    spec = JobSpec.from_arguments(
        flavor="debug", steps=10, global_batch_size=2, micro_batch_size=1, num_nodes=2, job=job,
        backend="kubernetes", checkpoint_uri=str(tmp_path / job),
        kubernetes={"image": "ghcr.io/acme/dtrain:test",
                    "volumes": [{"claim": "ckpt", "mount_path": str(tmp_path)}], **kubernetes},
    )  # fmt: skip
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, owner=owner))


def _set_policy(monkeypatch, fake, tmp_path: Path, policy: dict) -> None:
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig-admin")
    extra = {"kube_config_path": str(kubeconfig), "dtrain_policy": policy}
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": extra})
    )


def _cache(fake, group: str) -> tuple[dict | None, list[dict], dict[str, str]]:
    """The pod template's compile cache volume, the trainer's mounts of it, and its cache variables."""
    pod = fake.get("jobs", group)["spec"]["template"]["spec"]
    volume = next((v for v in pod["volumes"] if v["name"] == COMPILE_CACHE_VOLUME), None)
    (trainer,) = [c for c in pod["containers"] if c["name"] == "trainer"]
    mounts = [m for m in trainer["volumeMounts"] if m["name"] == COMPILE_CACHE_VOLUME]
    env = {e["name"]: e.get("value") for e in trainer["env"] if e["name"].endswith("_CACHE_DIR")}
    return volume, mounts, env


def test_every_group_of_a_job_mounts_its_own_directory_of_the_admins_compile_cache(
    fake, tmp_path, monkeypatch
):
    _set_policy(monkeypatch, fake, tmp_path, {"compile_cache_claim": CLAIM})
    launcher = KubernetesLauncher()
    launcher.launch("a-r0", _spec(tmp_path, "llama"))
    launcher.launch("a2-r0", _spec(tmp_path, "llama"))  # the job's next run: new pods, perhaps on new nodes
    launcher.launch("b-r0", _spec(tmp_path, "other"))  # another job of the same owner
    launcher.launch("c-r0", _spec(tmp_path, "llama", owner="team-b"))  # a job of the same name, another owner

    volume, mounts, env = _cache(fake, "a-r0")
    assert volume == {"name": COMPILE_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": CLAIM}}
    assert env == {
        "TORCHINDUCTOR_CACHE_DIR": COMPILE_CACHE_MOUNT,
        "TRITON_CACHE_DIR": f"{COMPILE_CACHE_MOUNT}/triton",
    }
    (mount,) = mounts
    assert mount["mountPath"] == COMPILE_CACHE_MOUNT and mount["subPath"].startswith("llama-")
    assert _cache(fake, "a2-r0")[1] == mounts  # it finds what the first group compiled
    subpaths = {group: _cache(fake, group)[1][0]["subPath"] for group in ("a-r0", "b-r0", "c-r0")}
    assert len(set(subpaths.values())) == 3, subpaths  # never another job's, nor another owner's
    assert fake.pod("a-r0", 1)["spec"]["containers"][0]["volumeMounts"][-1]["subPath"] == mount["subPath"]


def test_without_the_admins_claim_pods_compile_into_their_own_tmp(fake, tmp_path):
    KubernetesLauncher().launch("a-r0", _spec(tmp_path, "llama"))
    assert _cache(fake, "a-r0") == (None, [], {})


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_job_with_its_compile_cache_validates_against_the_kubernetes_schema(tmp_path, version):
    for obj in render_group("a-r0", _spec(tmp_path, "llama"), namespace="ml", compile_cache_claim=CLAIM):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    "kubernetes, refused",
    [
        ({"volumes": [{"claim": CLAIM, "mount_path": "/cache"}]}, r"kubernetes.volumes\[1\].claim: "),
        ({"pod_template": {"spec": {"volumes": [{"name": "all",
                                                 "persistentVolumeClaim": {"claimName": CLAIM}}]}}},
         r"volumes\[\d+\] \('all'\) is the platform's compile cache"),
        ({"pod_template": {"spec": {"containers": [{"name": "peek", "image": "busybox",
                                                    "volumeMounts": [{"name": COMPILE_CACHE_VOLUME,
                                                                      "mountPath": "/all"}]}]}}},
         r"container 'peek' mounts 'compile-cache'"),
    ],
)  # fmt: skip
def test_no_dag_author_mounts_the_compile_cache_claim(fake, tmp_path, monkeypatch, kubernetes, refused):
    """Compiled code is run by whoever loads it: a pod that could see every job's directory could plant code
    in another team's job. Refused before any API call."""
    _set_policy(monkeypatch, fake, tmp_path, {"compile_cache_claim": CLAIM})
    spec = _spec(tmp_path, "llama")
    if "volumes" in kubernetes:
        kubernetes = {"volumes": [*spec.kubernetes.volumes, *kubernetes["volumes"]]}
    with pytest.raises(SpecError, match=refused):
        KubernetesLauncher().launch("a-r0", _spec(tmp_path, "llama", **kubernetes))
    assert [r for r in fake.requests if r[0] in WRITES] == []


def test_the_admins_claim_is_a_kubernetes_name():
    from airflow_dtrain.kubernetes.policy import KubernetesPolicy

    with pytest.raises(SpecError, match=r"dtrain_policy.compile_cache_claim"):
        KubernetesPolicy.from_extra({"dtrain_policy": {"compile_cache_claim": "../all"}})
