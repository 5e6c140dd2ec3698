"""The local backend runs real torchrun agents, one per node, over a c10d rendezvous on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.job.spec import JobSpec
from trainer.events import EVENTS_DIR_ENV, read_events
from tests.integration.helpers import SMALL, node_pids, progress, wait_for, wait_for_step, wait_terminal

pytestmark = pytest.mark.torchrun


def _spec(tmp_path, **overrides) -> JobSpec:
    arguments = {
        **SMALL,
        "num_nodes": 2,
        "procs_per_node": 1,
        "checkpoint_uri": str(tmp_path / "ckpt"),
        **overrides,
    }
    return JobSpec.from_arguments(**arguments)


def test_two_node_group_trains_and_every_node_reaches_the_log(tmp_path):
    launcher = LocalLauncher(tmp_path / "groups")
    launcher.launch("two-nodes-r0", _spec(tmp_path, steps=6))
    # the worker's OMP_NUM_THREADS (tests/conftest.py sets 1) is what every process of the group gets
    group = json.loads((tmp_path / "groups" / "two-nodes-r0" / "group.json").read_text())
    assert group["env"]["OMP_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"] == "1"
    # torch.compile's cache: the job's own, not /tmp/torchinductor_<user>, which every job would share
    assert group["env"]["TORCHINDUCTOR_CACHE_DIR"].startswith(str((tmp_path / "groups").resolve()) + "/")
    with pytest.raises(ValueError, match="already exists"):
        launcher.launch("two-nodes-r0", _spec(tmp_path, steps=6))

    status = wait_terminal(launcher, "two-nodes-r0")
    assert status.state == GroupState.SUCCEEDED, status
    assert status.node_exit_codes == {0: 0, 1: 0}
    lines = launcher.logs("two-nodes-r0").lines
    assert any(line.startswith("[node0][rank0]:") for line in lines), lines[-20:]
    assert any(line.startswith("[node1][rank1]:") for line in lines), lines[-20:]
    assert progress(tmp_path / "ckpt")["status"] == "completed"
    # the log cursor hands out each line once
    chunk = launcher.logs("two-nodes-r0")
    assert launcher.logs("two-nodes-r0", chunk.cursor).lines == []
    assert launcher.find("two-nodes") == ["two-nodes-r0"]
    assert launcher.status("nope-r0").state == GroupState.NOT_FOUND
    # the trainer's events come from its ranks' events files (rank 0 reports), not from group.log
    assert group["env"][EVENTS_DIR_ENV] == str(launcher.events_dir("two-nodes-r0").resolve())
    events, cursor = launcher.events("two-nodes-r0")
    assert [e["step"] for e in events if e["event"] == "train"] == [2, 4, 6]  # log_every 2
    assert events[-1]["event"] == "done" and events == read_events(launcher.events_dir("two-nodes-r0"))
    assert launcher.events("two-nodes-r0", cursor) == ([], cursor)  # each event once


def test_stop_checkpoints_and_leaves_no_process_behind(tmp_path, slow_steps):
    launcher = LocalLauncher(tmp_path / "groups")
    launcher.launch("stopme-r0", _spec(tmp_path, steps=100_000))
    wait_for_step(tmp_path / "ckpt", 2)
    assert launcher.processes("stopme-r0"), "the group's processes should be visible while it runs"

    status = launcher.stop("stopme-r0", grace_period_s=30)

    assert status.state == GroupState.STOPPED
    assert launcher.processes("stopme-r0") == []
    state_dir = str(tmp_path / "groups")
    leftovers = [
        p for p in psutil.process_iter(["cmdline"]) if state_dir in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []
    # SIGTERM let every rank save the step it was on
    assert progress(tmp_path / "ckpt")["status"] == "preempted"
    assert progress(tmp_path / "ckpt")["latest_checkpoint"]


def test_a_lost_node_ends_the_group_as_preempted_and_its_peers_are_stopped(tmp_path, slow_steps):
    launcher = LocalLauncher(tmp_path / "groups", peer_exit_grace_s=3)
    launcher.launch("lost-r0", _spec(tmp_path, steps=100_000))
    wait_for_step(tmp_path / "ckpt", 2)

    os.kill(node_pids(tmp_path / "groups", "lost-r0")[1], signal.SIGKILL)  # the node vanishes, no save

    status = wait_terminal(launcher, "lost-r0", timeout=120)
    assert status.state == GroupState.PREEMPTED, status
    assert status.node_exit_codes[1] == -signal.SIGKILL, status
    # The lost node's workers die with their agent (parent-death SIGTERM): they save the step and exit 75,
    # so its peer may end "preempted" by itself before the supervisor sees the SIGKILL; either way resumable.
    assert ("node 1" in status.message and "SIGKILL" in status.message) or "exited 75" in status.message, (
        status
    )
    wait_for(lambda: launcher.processes("lost-r0") == [], 30, "no process left")


def test_a_group_of_the_same_name_in_another_state_directory_is_left_alone(tmp_path, slow_steps):
    """Group names repeat across state directories (two deployments, or two test runs, on one machine). A
    launch waits for what is left of its task's earlier group, then kills it: never another directory's group
    of that name."""
    other = LocalLauncher(tmp_path / "other-groups")
    other.launch("same-r0", _spec(tmp_path / "other", steps=100_000, num_nodes=1))
    try:
        wait_for_step(tmp_path / "other" / "ckpt", 2)
        mine = LocalLauncher(tmp_path / "groups")
        quick = {"steps": 2, "num_nodes": 1, "config": {"checkpoint": {"grace_period_s": 5}}}
        mine.launch("same-r0", _spec(tmp_path, **quick))
        assert wait_terminal(mine, "same-r0").state == GroupState.SUCCEEDED
        assert other.processes("same-r0") and mine.processes("same-r0") == []

        mine.launch(
            "same-r1", _spec(tmp_path, **quick)
        )  # waits for its own same-r0's processes: there are none
        assert wait_terminal(mine, "same-r1").state == GroupState.SUCCEEDED
        assert other.status("same-r0").state == GroupState.RUNNING, "another directory's group was killed"
    finally:
        stopped = other.stop("same-r0", grace_period_s=30)  # a failed check leaves no training behind
    assert stopped.state == GroupState.STOPPED


def test_checkpoint_now_saves_at_the_next_step_and_training_goes_on(tmp_path, slow_steps):
    launcher = LocalLauncher(tmp_path / "groups")
    launcher.launch("ckptnow-r0", _spec(tmp_path, steps=100_000))
    wait_for_step(tmp_path / "ckpt", 2)

    assert launcher.checkpoint_now("ckptnow-r0") == 2  # both ranks, not the agents

    saved = wait_for(lambda: progress(tmp_path / "ckpt").get("latest_checkpoint"), 60, "a checkpoint")
    step_at_save = int(saved.rstrip("/").rsplit("-", 1)[1])
    wait_for_step(tmp_path / "ckpt", step_at_save + 3)
    assert launcher.status("ckptnow-r0").state == GroupState.RUNNING
    launcher.stop("ckptnow-r0")
    assert launcher.processes("ckptnow-r0") == []


def test_each_process_gets_its_share_of_the_cores_unless_the_worker_sets_omp_num_threads(
    tmp_path, monkeypatch
):
    launcher = LocalLauncher(tmp_path / "groups")
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS: a whole number of threads, at least 1, got 'two'"):
        launcher.launch("threads-r0", _spec(tmp_path, steps=1))
    assert not (tmp_path / "groups" / "threads-r0").exists(), "nothing launched"

    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    launcher.launch("threads-r0", _spec(tmp_path, steps=1))  # 2 nodes x 1 process on 4 cores
    group = json.loads((tmp_path / "groups" / "threads-r0" / "group.json").read_text())
    assert group["env"]["OMP_NUM_THREADS"] == "2"
    assert wait_terminal(launcher, "threads-r0").state == GroupState.SUCCEEDED
