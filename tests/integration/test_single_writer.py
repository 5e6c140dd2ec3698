"""One writer per checkpoint directory on the local backend: kill -9 a group's supervisor, let
Airflow retry the task, and the orphans of the dead group never train beside the new one."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.launchers.local_processes import GROUP_DIR_ENV
from airflow_dtrain.operators.fsdp_train import TrainingFailed
from tests.conftest import RecordingTI
from tests.integration.helpers import SMALL, group_events, progress, wait_for_step
from trainer.checkpoint.directory import CheckpointDir

pytestmark = pytest.mark.torchrun

STEPS = 40


def _operator(tmp_path) -> FSDPTrainOperator:
    return FSDPTrainOperator(
        **{
            **SMALL,
            "task_id": "train",
            "num_nodes": 1,
            "procs_per_node": 2,
            "steps": STEPS,
            "checkpoint_every": 4,
            "checkpoint_keep": 100,  # every manifest stays, to be checked
            "checkpoint_uri": str(tmp_path / "ckpt"),
            "local_state_dir": str(tmp_path / "groups"),
            "poll_interval": 0.5,
            "deferrable": False,
            "job": "one-writer",
        }
    )


class GroupsAlive:
    """Samples, every 0.2 s, which groups (DTRAIN_GROUP_NAME) of state directory ``groups`` have live
    processes on this machine (another test's group may have the same name, in a directory of its own)."""

    def __init__(self, prefix: str, groups: Path):
        self.prefix, self.groups, self.samples = prefix, str(groups.resolve()), []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            alive = set()
            for proc in psutil.process_iter(["pid"]):
                try:
                    env = proc.environ()
                    group = env.get("DTRAIN_GROUP_NAME", "")
                    mine = os.path.dirname(env.get(GROUP_DIR_ENV, "")) == self.groups
                    if group.startswith(self.prefix) and mine and proc.status() != psutil.STATUS_ZOMBIE:
                        alive.add(group)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    continue
            self.samples.append((time.time(), alive))
            time.sleep(0.2)

    def stop(self) -> list[tuple[float, set[str]]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


def _start_the_first_try(tmp_path, ti) -> tuple[threading.Thread, dict]:
    """The task's first try, on a thread: its error (it fails once its supervisor is killed) in the dict."""
    outcome: dict = {}

    def first_try():
        try:
            _operator(tmp_path).execute({"ti": ti})
        except Exception as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    worker = threading.Thread(target=first_try)
    worker.start()
    return worker, outcome


def _assert_the_orphans_saved_and_exited_before_the_retry_started(caplog, samples, first, second, killed_at):
    """No SIGKILL was needed, the retry started soon, and no two groups of the task ever ran at once."""
    # The orphans were told (the kernel's SIGTERM when their supervisor died), saved and exited on their own:
    # nothing had to be SIGKILLed, and the retry started long before the launch's wait would have run out.
    waited = [r.getMessage() for r in caplog.records if "earlier group" in r.getMessage()]
    assert not any("SIGKILL" in m for m in waited), waited
    started_second = min(t for t, alive in samples if second in alive)
    assert started_second - killed_at < 90, waited
    # At no time did two groups of the task have live processes.
    assert all(len(alive) <= 1 for _, alive in samples), [s for s in samples if len(s[1]) > 1][:3]
    assert not any(first in alive for t, alive in samples if t >= started_second)


def _assert_the_retry_committed_under_its_own_lease(ckpt, lease_first, second, resumed_from: int) -> None:
    """Every manifest committed after the retry's lease was written under it; the orphans' save under
    theirs."""
    # Every manifest committed after the retry's lease was written under it.
    root = CheckpointDir(str(ckpt))
    lease_second = root.newest_lease()
    assert lease_second.token == lease_first.token + 1 and lease_second.info["group"] == second
    manifests = [root.manifest(c.path) for c in root.committed()]
    assert manifests and all(m["job"] == "one-writer" for m in manifests)
    later = [m for m in manifests if m["created_at"] >= lease_second.info["acquired_at"]]
    assert later and {m["lease"] for m in later} == {lease_second.token}
    assert {m["step"] for m in later} >= {STEPS}
    saved_by_orphans = root.manifest(resumed_from)
    assert saved_by_orphans["lease"] == lease_first.token
    assert saved_by_orphans["created_at"] < lease_second.info["acquired_at"]


def test_supervisor_kill_9_then_a_retry_leaves_exactly_one_writer(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="airflow_dtrain.launchers.local")
    ckpt, groups = tmp_path / "ckpt", tmp_path / "groups"
    launcher = LocalLauncher(groups)
    ti = RecordingTI(run_id="manual__one_writer")
    worker, outcome = _start_the_first_try(tmp_path, ti)
    wait_for_step(ckpt, 6)
    first = ti.xcoms["group"]
    sampler = GroupsAlive(first.rsplit("-r", 1)[0], groups)
    orphans = launcher.processes(first)
    assert len(orphans) >= 3, orphans  # the torchrun agent and its two ranks
    lease_first = CheckpointDir(str(ckpt)).newest_lease()
    assert lease_first.info["group"] == first

    supervisor = json.loads((groups / first / "supervisor.json").read_text())["pid"]
    at_kill = progress(ckpt)["step"]
    os.kill(supervisor, signal.SIGKILL)
    killed_at = time.time()
    worker.join(timeout=60)
    # The try that watched it fails (Airflow would retry it): the group ended without a result.
    assert isinstance(outcome.get("error"), TrainingFailed), outcome
    assert launcher.status(first).state == GroupState.FAILED

    # The retry, at once: the orphans are still saving; the launch waits for them, then starts r1.
    summary = _operator(tmp_path).execute({"ti": RecordingTI(run_id="manual__one_writer")})
    samples = sampler.stop()

    second = summary["group"]
    assert second == first[: -len("-r0")] + "-r1"
    _assert_the_orphans_saved_and_exited_before_the_retry_started(caplog, samples, first, second, killed_at)

    # The orphans' preemption save was the last checkpoint of the first group: the retry resumed there,
    # losing no step, and finished at the requested step.
    resume = group_events(groups, second, "resume")[0]
    # (left alone, the orphans would have trained on to step 40 while the retry's launch waited for them)
    assert at_kill <= resume["from_step"] <= at_kill + 4, (at_kill, resume)
    assert summary["final_step"] == STEPS and summary["steps_lost"] == 0
    assert progress(ckpt)["status"] == "completed"

    _assert_the_retry_committed_under_its_own_lease(ckpt, lease_first, second, resume["from_step"])
    assert launcher.processes(first) == [] and launcher.processes(second) == []
