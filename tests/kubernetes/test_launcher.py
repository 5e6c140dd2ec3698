"""KubernetesLauncher against a busy or refusing API server: what is retried, what is not.

The launcher's API calls carry the cncf.kubernetes provider's ``generic_api_retry``; the
fake answers the next matching requests with an injected status (``fail_next``).
"""

from __future__ import annotations

import time

import pytest
from kubernetes.client.exceptions import ApiException

from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.launchers.base import GroupState
from tests.kubernetes.conftest import launch_debug_group

JOBS = "/apis/batch/v1/namespaces/default/jobs"


def test_a_429_and_a_503_are_retried_and_the_group_is_created_once(fake, tmp_path):
    fake.fail_next("GET", f"{JOBS}/busy-r0", 429)  # no Retry-After: the provider's backoff
    fake.fail_next("POST", JOBS, 503)

    launcher = launch_debug_group("busy-r0", tmp_path)

    assert fake.jobs() == ["busy-r0"]
    assert fake.requests.count(("POST", JOBS)) == 2, "the 503 was asked again, once"
    assert launcher.status("busy-r0").state == GroupState.PENDING
    # nothing half-made was cleaned up by mistake: the Job's ConfigMap and Service are there
    assert fake.names("configmaps") == ["busy-r0-config"] and fake.names("services") == ["busy-r0"]


def test_a_429_is_retried_after_its_retry_after(fake, tmp_path):
    # (urllib3 under the kubernetes client honours Retry-After on its own too; either way the
    # user's call waits as the server asked and then succeeds)
    launch_debug_group("throttled-r0", tmp_path)
    fake.fail_next("GET", f"{JOBS}/throttled-r0", 429, retry_after=2)
    launcher = KubernetesLauncher()
    before = len(fake.requests)

    started = time.monotonic()
    status = launcher.status("throttled-r0")

    assert status.state == GroupState.PENDING
    assert fake.requests[before:].count(("GET", f"{JOBS}/throttled-r0")) == 2
    # the provider's own backoff starts at 1 s: waiting 2 s is the server's Retry-After
    assert time.monotonic() - started >= 2


def test_a_403_is_not_retried(fake):
    fake.fail_next("GET", f"{JOBS}/forbidden-r0", 403)
    before = len(fake.requests)

    with pytest.raises(ApiException) as err:
        KubernetesLauncher().status("forbidden-r0")

    assert err.value.status == 403
    assert fake.requests[before:] == [("GET", f"{JOBS}/forbidden-r0")]


def test_an_existing_object_is_not_retried_and_leaves_nothing_behind(fake, tmp_path):
    # someone else's ConfigMap under the group's name: the provider counts 409 as transient,
    # but "already exists" never changes by asking again
    KubernetesLauncher().hook.core_v1_client.create_namespaced_config_map(
        "default", {"metadata": {"name": "taken-r0-config"}, "data": {"owner": "someone else"}}
    )
    before = len(fake.requests)

    with pytest.raises(ValueError, match="already exists"):
        launch_debug_group("taken-r0", tmp_path)

    assert fake.requests[before:].count(("POST", "/api/v1/namespaces/default/configmaps")) == 1
    assert fake.jobs() == [] and fake.names("services") == []
    assert fake.get("configmaps", "taken-r0-config")["data"] == {"owner": "someone else"}


def test_a_launch_fails_naming_an_earlier_group_of_the_task_that_is_still_running(fake, tmp_path):
    from airflow_dtrain.launchers.base import PredecessorStillRunning
    from airflow_dtrain.job.spec import JobSpec

    launch_debug_group("writer-r0", tmp_path)
    fake.run("writer-r0")  # its pods run on: e.g. the task's worker died and Airflow retries it
    spec = JobSpec.from_arguments(
        flavor="debug",
        steps=10,
        global_batch_size=2,
        micro_batch_size=1,
        num_nodes=2,
        procs_per_node=1,
        backend="kubernetes",
        checkpoint_uri=str(tmp_path / "writer"),
        kubernetes={
            "image": "ghcr.io/acme/dtrain:test",
            "volumes": [{"claim": "ckpt", "mount_path": str(tmp_path)}],
        },
    )

    started = time.monotonic()
    with pytest.raises(
        PredecessorStillRunning, match=r"group writer-r1 not launched: group writer-r0 .*still running"
    ):
        KubernetesLauncher(poll_interval=0.2, predecessor_wait_s=1.0).launch("writer-r1", spec)

    assert 1.0 <= time.monotonic() - started < 30
    assert fake.jobs() == ["writer-r0"], "no second writer was created"
