"""A group that could not write a checkpoint (exit 74: a full disk, no permission) fails the task with
the trainer's own line first; it is never relaunched (the same storage refuses the same write)."""

from __future__ import annotations

import logging

import pytest

from airflow_dtrain.launchers._local_outcome import classify
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.session.group import GroupFailed, GroupSession
from airflow_dtrain.job.spec import JobSpec
from trainer.checkpoint.errors import storage_cause
from trainer.config.job_config import PREEMPTED_EXIT_CODE, STORAGE_EXIT_CODE

LINE = (
    "checkpoint step 40 could not be written to /x/ckpt/step-00000040 (rank 1): [Errno 28] No space left on "
    "device: '/x/ckpt/step-00000040/__1_0.distcp'; the older checkpoints (step 20, 30) are intact"
)


def test_a_node_that_exits_74_ends_its_group_failed_saying_why():
    state, message = classify({0: STORAGE_EXIT_CODE, 1: PREEMPTED_EXIT_CODE}, set(), stopped=False)

    assert state == GroupState.FAILED
    assert "node 0 exited 74" in message and "could not be written" in message


def test_the_session_fails_the_task_leading_with_the_trainers_line_and_does_not_relaunch(tmp_path):
    spec = JobSpec.from_arguments(
        flavor="debug",
        steps=4,
        global_batch_size=2,
        micro_batch_size=1,
        checkpoint_uri=str(tmp_path / "ckpt"),
    )
    launcher = LocalLauncher(tmp_path / "groups")
    session = GroupSession(launcher, "dag-train-abc", spec, log=logging.getLogger("test"))
    event = {
        "status": "error",
        "name": "dag-train-abc-r0",
        "state": "failed",
        "message": "node 0 exited 74: ...",
        "node_exit_codes": {"0": STORAGE_EXIT_CODE},
        "log_tail": [
            "[node0] step 39 ...",
            f"[node0][trainer] exit 74: {LINE}",
            "[node0][trainer.launch] exit 74",
        ],
    }

    with pytest.raises(GroupFailed) as err:
        session.on_end(event)

    first = str(err.value).splitlines()[0]
    assert "could not write a checkpoint (exit 74)" in first and LINE in first, first
    assert "not relaunching" in first and str(tmp_path / "ckpt") in first
    assert launcher.find("dag-train-abc") == [], "nothing was launched"


def test_storage_cause_finds_refusals_and_only_those():
    import errno

    class ClientError(Exception):  # botocore's shape
        def __init__(self, code):
            super().__init__(code)
            self.response = {"Error": {"Code": code}}

    enospc = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise enospc
        except OSError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as wrapped:
        assert storage_cause(wrapped) is enospc
    assert isinstance(storage_cause(PermissionError(errno.EACCES, "Permission denied")), PermissionError)
    assert storage_cause(ClientError("AccessDenied")) is not None
    assert storage_cause(ClientError("SlowDown")) is None
    assert storage_cause(ConnectionResetError()) is None
    assert storage_cause(RuntimeError("Connection closed by peer")) is None
