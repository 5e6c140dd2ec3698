"""A group fenced off by a newer writer lease (exit 78) fails the task with a clear message; it is
never relaunched (the newer group is the writer now)."""

from __future__ import annotations

import logging

import pytest

from airflow_dtrain.launchers._local_outcome import classify
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.session.group import GroupFailed, GroupSession
from airflow_dtrain.job.spec import JobSpec
from trainer.config.job_config import FENCED_EXIT_CODE, PREEMPTED_EXIT_CODE


def test_a_node_that_exits_78_ends_its_group_failed_saying_why():
    state, message = classify({0: PREEMPTED_EXIT_CODE, 1: FENCED_EXIT_CODE}, set(), stopped=False)

    assert state == GroupState.FAILED
    assert "another group took over the checkpoint directory" in message and "node 1 exited 78" in message


def test_the_session_fails_a_fenced_group_instead_of_relaunching_it(tmp_path):
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
        "message": "node 0 exited 78: ...",
        "node_exit_codes": {"0": FENCED_EXIT_CODE},
        "log_tail": ["[trainer] fenced off, exit 78: ..."],
    }

    with pytest.raises(GroupFailed, match="another group took over the checkpoint directory") as err:
        session.on_end(event)

    assert str(tmp_path / "ckpt") in str(err.value) and "not relaunching" in str(err.value)
    assert launcher.find("dag-train-abc") == [], "nothing was launched"
