"""A failed group's error leads with what its training processes said, not only the log's last lines: a
peer's lost rendezvous store and its stack dump could push the trainer's own complaint out of them (a
missing dataset reported only as "RendezvousConnectionError")."""

from __future__ import annotations

import logging

import pytest

from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.session.group import GroupFailed, GroupSession
from airflow_dtrain.session.watch import LOG_TAIL_LINES, group_event
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.status_line import note_rank_errors

SAID = "config error: data.dataset: '/x/missing' is not \"builtin\", an s3:// store, nor a directory"
# the shape of a real group.log (two nodes, both ranks refuse the dataset; node 1's agent then loses the
# store node 0 hosted and dumps its C++ frames)
LOG = [
    "[node1]W1128 19:31:57.9 torch/distributed/run.py:810] ",
    "[node1][rank1]:Traceback (most recent call last):",
    f"[node1][rank1]:{SAID}",
    "[node0][rank0]:Traceback (most recent call last):",
    f"[node0][rank0]:{SAID}",
    "[node0]E1128 19:31:58.29 api.py:890] failed (exitcode: 2) local_rank: 0 (pid: 11200) of binary",
    *[
        f"[node1]frame #{i}: c10::DistNetworkError::DistNetworkError(...) + 0x72 (0x7f in libc10.so)"
        for i in range(50)
    ],
    "[node1][trainer.launch] exit 1: launcher error: RendezvousConnectionError: The connection to the C10d "
    "store has failed. See inner exception for details.",
]


def test_the_ranks_first_complaints_are_kept_once_each_and_no_stack_frame():
    seen: list[str] = []
    note_rank_errors(seen, LOG[:3])  # one poll's lines...
    note_rank_errors(seen, LOG[3:])  # ...and the next's
    assert seen == [SAID]  # rank 0 and rank 1 said the same: once; Traceback lines and frames are not said
    more: list[str] = []
    note_rank_errors(more, [f"[node0][rank0]:ValueError: bad {i}" for i in range(9)])
    assert more == ["ValueError: bad 0", "ValueError: bad 1", "ValueError: bad 2"]  # the first three


def test_a_failed_group_names_what_its_ranks_said_though_the_last_lines_do_not(tmp_path):
    spec = JobSpec.from_arguments(flavor="debug", steps=4, global_batch_size=2, micro_batch_size=1,
                                  checkpoint_uri=str(tmp_path / "ckpt"))  # fmt: skip
    session = GroupSession(
        LocalLauncher(tmp_path / "groups"), "dag-train-abc", spec, log=logging.getLogger("t")
    )
    errors: list[str] = []
    note_rank_errors(errors, LOG)
    tail = LOG[-LOG_TAIL_LINES:]
    assert not any("missing" in line for line in tail)  # what made the message say only the launcher's error
    event = {"status": "error", "name": "dag-train-abc-r0", "state": "failed", "message": "node 0 exited 1",
             "node_exit_codes": {"0": 1, "1": 1}, "log_tail": tail, "rank_errors": errors}  # fmt: skip

    with pytest.raises(GroupFailed) as err:
        session.on_end(event)

    message = str(err.value)
    assert f"What its training processes said first:\n  {SAID}\n" in message, message
    assert message.index(SAID) < message.index("Last lines of its log")


def test_the_event_carries_the_ranks_complaints():
    from airflow_dtrain.launchers.base import GroupState, GroupStatus

    status = GroupStatus("g-r0", GroupState.FAILED, "node 0 exited 1", {0: 1})
    assert group_event(status, LOG[-3:], None, [SAID])["rank_errors"] == [SAID]
    assert group_event(status, LOG[-3:], None)["rank_errors"] == []
