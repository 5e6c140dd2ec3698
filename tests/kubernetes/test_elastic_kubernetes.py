"""Elastic pod groups (``min_nodes`` < ``num_nodes``) on Kubernetes, against the fake API server.

The Job re-creates only the index it lost (``backoffLimitPerIndex``, ``podFailurePolicy``), the survivors keep
their pods, and the group trains while at least ``min_nodes`` pods run; below that it waits
``min_nodes_timeout_s`` and then ends as preempted, and the operator decides again. Each test drives the fake
cluster as a spot cluster would behave and asserts what the user sees: the pods, the Job, the task's result.
"""

from __future__ import annotations

import time
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes.client.exceptions import ApiException

from airflow_dtrain.kubernetes.elastic_status import node_timeline, pod_times
from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.kubernetes.names import ANNOTATION_OUTCOME, LABEL_GROUP, LABEL_STORE
from airflow_dtrain.kubernetes.objects import render_group
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import RecordingTI
from tests.kubernetes.conftest import Background
from tests.kubernetes.test_fsdp_train_kubernetes import _operator, _train, _wait
from tests.kubernetes.test_kubernetes_objects import K8S_VERSIONS

STEPS = 20  # as test_fsdp_train_kubernetes's _operator and _train


def _spec(tmp_path: Path, *, nodes: int = 3, min_nodes: int = 2, batch: int = 6, **overrides) -> JobSpec:
    return JobSpec.from_arguments(
        flavor="debug", steps=STEPS, global_batch_size=batch, micro_batch_size=1, num_nodes=nodes,
        min_nodes=min_nodes, procs_per_node=1, backend="kubernetes", checkpoint_uri=str(tmp_path / "ckpt"),
        kubernetes={"image": "ghcr.io/acme/dtrain:test",
                    "volumes": [{"claim": "ckpt", "mount_path": str(tmp_path)}]},
        **overrides,
    )  # fmt: skip


def _elastic_operator(tmp_path: Path, **overrides):
    """FSDPTrainOperator for 3 nodes that trains on 2 (a global batch of 6 divides both)."""
    return _operator(tmp_path, deferrable=False, num_nodes=3, min_nodes=2, global_batch_size=6,
                     micro_batch_size=1, **overrides)  # fmt: skip


def _uids(fake, name: str, indexes) -> dict[int, str]:
    return {i: fake.pod(name, i)["metadata"]["uid"] for i in indexes}


def test_a_preempted_pod_index_is_replaced_without_deleting_the_job_and_the_others_keep_their_pods(
    fake, tmp_path
):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path))
    job_uid = fake.get("jobs", "el-r0")["metadata"]["uid"]
    fake.run("el-r0")
    survivors = _uids(fake, "el-r0", (0, 2))
    lost = fake.pod("el-r0", 1)["metadata"]["name"]
    time.sleep(1.1)  # pod times have whole seconds, as the API's: keep the node count's changes apart

    fake.exit("el-r0", 1, 75)  # node 1 was told to stop: it saved its step and exited "preempted"
    seen = launcher.status("el-r0")
    assert seen.state == GroupState.RUNNING, seen
    assert "2/3 node(s) running" in seen.message and "node(s) 1 lost, being replaced" in seen.message
    fake.advance(10)  # the Job controller's pod failure backoff, then it re-creates index 1
    replacement = fake.pod("el-r0", 1)
    assert replacement["metadata"]["name"] != lost and replacement["status"]["phase"] == "Pending"
    assert replacement["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "1"
    time.sleep(1.1)
    fake.run("el-r0", [1])

    assert launcher.status("el-r0").state == GroupState.RUNNING
    job = fake.get("jobs", "el-r0")
    assert job["metadata"]["uid"] == job_uid and ANNOTATION_OUTCOME not in job["metadata"]["annotations"]
    assert _uids(fake, "el-r0", (0, 2)) == survivors, "the surviving pods were neither deleted nor replaced"
    assert [fake.pod("el-r0", i)["status"]["phase"] for i in (0, 1, 2)] == ["Running"] * 3
    assert [count for _, count in launcher.node_changes("el-r0")] == [3, 2, 3]


def test_a_disrupted_pod_is_replaced_at_once_without_counting_against_max_preemptions(fake, tmp_path):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path, max_preemptions=0))  # a counted failure would end index 2
    fake.run("el-r0")
    survivors = _uids(fake, "el-r0", (0, 1))
    fake.exit("el-r0", 2, 143, disruption="TerminationByKubelet")  # spot reclaim: DisruptionTarget

    replacement = fake.pod("el-r0", 2)
    assert replacement["status"]["phase"] == "Pending", "Ignore: re-created at once, no backoff"
    assert replacement["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "0"
    assert launcher.status("el-r0").state == GroupState.RUNNING
    assert _uids(fake, "el-r0", (0, 1)) == survivors


def test_below_min_nodes_the_group_waits_and_goes_on_when_a_replacement_runs(fake, tmp_path):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path))  # min_nodes_timeout_s: 600
    fake.run("el-r0")
    for index in (1, 2):
        fake.exit("el-r0", index, 143, disruption="TerminationByKubelet")

    waiting = launcher.status("el-r0")
    assert waiting.state == GroupState.PENDING, waiting
    assert "1/3 node(s) running, fewer than min_nodes=2" in waiting.message
    assert "waits up to min_nodes_timeout_s=600" in waiting.message
    fake.run("el-r0", [2])
    assert launcher.status("el-r0").state == GroupState.RUNNING
    assert fake.jobs() == ["el-r0"]


def test_below_min_nodes_past_the_timeout_the_group_is_preempted_and_the_operator_relaunches(fake, tmp_path):
    op, ti = _elastic_operator(tmp_path, min_nodes_timeout_s=1), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    first = _wait(lambda: ti.xcoms.get("group"), "the group")
    fake.run(first)
    _wait(lambda: KubernetesLauncher().status(first).state == GroupState.RUNNING, "running")
    _train(tmp_path / "ckpt", 10)
    for index in (1, 2):  # two of three spot nodes reclaimed, and no capacity comes back
        fake.exit(first, index, 143, disruption="TerminationByKubelet")

    second = _wait(lambda: [j for j in fake.jobs() if j != first], "the relaunched group")[0]
    ended = KubernetesLauncher().status(first)
    assert ended.state == GroupState.PREEMPTED
    assert "fewer than min_nodes=2" in ended.message and "min_nodes_timeout_s=1" in ended.message
    assert fake.get("jobs", first)["spec"]["activeDeadlineSeconds"] == 1, "ended by its deadline, not deleted"
    fake.run(second)
    _train(tmp_path / "ckpt", STEPS, "completed")
    for index in (0, 1):
        fake.exit(second, index, 0)
    summary = task.result()
    assert summary["final_step"] == STEPS and summary["preemptions"] == 1 and summary["relaunches"] == 1


def test_at_min_nodes_the_group_trains_to_the_end_without_its_lost_node(fake, tmp_path):
    op, ti = _elastic_operator(tmp_path, max_preemptions=0), RecordingTI()
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group")
    fake.run(name)
    fake.exit(name, 2, 75)  # lost, and no replacement allowed (max_preemptions=0): index 2 fails for good

    _wait(lambda: "lost for good" in KubernetesLauncher().status(name).message, "index 2 failed")
    assert KubernetesLauncher().status(name).state == GroupState.RUNNING
    _train(tmp_path / "ckpt", STEPS, "completed")
    for index in (0, 1):
        fake.exit(name, index, 0)
    summary = task.result()

    assert summary["final_step"] == STEPS and summary["preemptions"] == 0 and summary["relaunches"] == 0
    assert fake.jobs() == [name]
    assert KubernetesLauncher().status(name).state == GroupState.SUCCEEDED


def test_losing_more_nodes_for_good_than_min_nodes_allows_is_a_preemption(fake, tmp_path):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path, max_preemptions=0))
    fake.run("el-r0")
    fake.exit("el-r0", 1, 75)
    fake.exit("el-r0", 2, 75)

    seen = launcher.status("el-r0")
    assert seen.state == GroupState.PREEMPTED, seen
    assert "node(s) 1,2 lost more than max_preemptions=0" in seen.message
    assert fake.get("jobs", "el-r0")["status"]["conditions"][-1]["reason"] == "MaxFailedIndexesExceeded"


def test_a_non_resumable_exit_fails_the_elastic_group(fake, tmp_path):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path))
    fake.run("el-r0")
    fake.log("el-r0", 1, "[rank1]: ValueError: bad dataset row")
    fake.exit("el-r0", 1, 1)

    seen = launcher.status("el-r0")
    assert seen.state == GroupState.FAILED, seen
    assert "node 1" in seen.message and "exited 1" in seen.message and "bad dataset row" in seen.message


def test_losing_node_0_replaces_index_0_only_as_the_store_is_a_pod_of_its_own(fake, tmp_path):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path))
    store = fake.get("pods", "el-r0-rdzv")
    assert store is not None and LABEL_GROUP not in store["metadata"]["labels"], "the store is no node"
    assert store["spec"]["containers"][0]["command"][:3] == ["python", "-m", "trainer.elastic.rdzv_store"]
    # it prefers on-demand nodes, Karpenter's or an EKS node group's, and requires none (the group's spot
    # capacity, whose reclaim it outlives, is never required of it)
    affinity = store["spec"]["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    terms = [
        t["preference"]["matchExpressions"][0]
        for t in affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    ]
    assert {(t["key"], t["operator"], *t["values"]) for t in terms} == {
        ("karpenter.sh/capacity-type", "In", "on-demand"),
        ("eks.amazonaws.com/capacityType", "In", "ON_DEMAND"),
    }
    assert fake.get("services", "el-r0-rdzv")["spec"]["selector"] == {LABEL_STORE: "el-r0"}
    args = fake.get("jobs", "el-r0")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--rdzv-endpoint") + 1] == "el-r0-rdzv:29400"
    assert args[args.index("--rdzv-conf") + 1].startswith("is_host=0,")
    fake.run("el-r0")
    survivors = _uids(fake, "el-r0", (1, 2))

    fake.exit("el-r0", 0, 143, disruption="TerminationByKubelet")  # node 0's spot node is reclaimed

    seen = launcher.status("el-r0")
    assert seen.state == GroupState.RUNNING and "2/3 node(s) running" in seen.message, seen
    assert fake.pod("el-r0", 0)["status"]["phase"] == "Pending", "index 0 is re-created"
    assert _uids(fake, "el-r0", (1, 2)) == survivors, "nodes 1 and 2 keep their pods"
    assert ANNOTATION_OUTCOME not in fake.get("jobs", "el-r0")["metadata"]["annotations"]


def test_losing_the_store_pod_relaunches_the_whole_group_and_ends_its_pods(fake, tmp_path):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path))
    fake.run("el-r0")
    fake.disrupt("el-r0-rdzv")
    fake.exit("el-r0", 1, 1)  # a node that lost the store fails: collateral, not the cause

    seen = launcher.status("el-r0")
    assert seen.state == GroupState.PREEMPTED, seen
    assert "rendezvous store (pod el-r0-rdzv) was disrupted" in seen.message
    fake.tick()
    alive = [
        p for p in fake.names("pods") if fake.get("pods", p)["status"].get("phase") in ("Pending", "Running")
    ]
    assert alive == [], "every pod of the group ends: none waits for a store that is gone"
    assert "el-r0-rdzv" not in fake.names("services")


def test_stopping_an_elastic_group_deletes_its_store(fake, tmp_path):
    launcher = KubernetesLauncher()
    launcher.launch("el-r0", _spec(tmp_path))
    launcher.stop("el-r0", grace_period_s=0)
    assert "el-r0-rdzv" not in fake.names("pods") and "el-r0-rdzv" not in fake.names("services")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_elastic_manifests_validate_against_the_kubernetes_schema(tmp_path, version):
    objects = render_group(
        "el-r0", _spec(tmp_path, nodes=4, min_nodes=2, batch=12, max_preemptions=5), namespace="ml"
    )
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    job = objects[-1]["spec"]
    assert job["backoffLimitPerIndex"] == 5 and job["maxFailedIndexes"] == 2 and "backoffLimit" not in job
    assert job["successPolicy"] == {"rules": [{"succeededCount": 2}]}
    assert [r["action"] for r in job["podFailurePolicy"]["rules"]] == ["Ignore", "FailJob", "Count"]
    job["backoffLimitPerIndx"] = 1  # a typo kubectl would reject
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(objects[-1], version, strict=True)


def test_the_fake_api_server_refuses_per_index_fields_a_real_one_refuses(fake, tmp_path):
    job = render_group("el-r0", _spec(tmp_path), namespace="default")[-1]
    job["spec"]["completionMode"] = "NonIndexed"
    with pytest.raises(ApiException) as refused:
        KubernetesLauncher()._api(KubernetesLauncher()._batch.create_namespaced_job, "default", job)
    assert refused.value.status == 422 and "backoffLimitPerIndex" in refused.value.body


def test_the_node_count_over_time_comes_from_when_each_pod_ran():
    def pod(name: str, start: str, end: str | None = None) -> dict:
        state = {"terminated": {"finishedAt": end}} if end else {"running": {}}
        return {"metadata": {"name": name, "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
                "status": {"phase": "Failed" if end else "Running", "startTime": start,
                           "containerStatuses": [{"name": "trainer", "state": state}]}}  # fmt: skip

    t = "2026-05-01T10:00:{:02d}Z".format
    times = pod_times({}, [pod("a", t(0), t(30)), pod("b", t(0)), pod("c", t(40))], now=0.0)
    assert [n for _, n in node_timeline(times)] == [2, 1, 2]
    gone = pod_times(times, [pod("b", t(0))], now=times["c"][0] + 5)  # pod c vanished (deleted) since
    assert [n for _, n in node_timeline(gone)] == [2, 1, 2, 1]
    assert node_timeline(gone)[-1][0] == times["c"][0] + 5
