"""A node whose agent restarts its workers (an elastic group's resize: ``--max-restarts`` > 0) trains the next
world in the same training processes (trainer/elastic/worker_host.py), and each world meets under its own
keys in
the agent's store (trainer/elastic/rdzv_round.py, ``name_each_world``). Real torchrun, 2 ranks, gloo on
CPU."""

from __future__ import annotations

import os
import re
import signal

import pytest
from conftest import FAST, run_and_signal, worker_pids

pytestmark = pytest.mark.torchrun


def test_a_resize_trains_on_in_the_same_processes_from_the_step_it_saved(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    run = run_and_signal(
        [*FAST, "--steps", "12", "--checkpoint-uri", str(ckpt)],
        data_dir,
        when_step=3,
        # a worker, not the agent: every rank saves and exits 75, the live agent starts its workers again
        send=lambda proc: os.kill(worker_pids(proc.pid)[1], signal.SIGTERM),
        nproc=2,
        agent_args=("--max-restarts", "3"),
    )
    assert run.returncode == 0, run
    [preempted] = run.of("preempted")
    assert [e["from_step"] for e in run.of("resume")] == [preempted["step"]]  # 0 steps lost
    assert [e["restart"] for e in run.of("world")] == [0, 1]
    # Before the store's keys were each world's own, the second world read the first one's: new processes
    # were refused (exit 76, a restart spent), kept ones hung connecting to their own old group.
    assert "lost a peer" not in run.stderr, run
    pids = {}
    for rank, pid in re.findall(r"\[trainer\] rank (\d)/2 \(local rank \d, pid (\d+)\)", run.stderr):
        pids.setdefault(int(rank), []).append(int(pid))
    assert {rank: len(set(p)) for rank, p in pids.items()} == {0: 1, 1: 1}, pids  # one process a rank
    assert all(len(p) == 2 for p in pids.values()), pids  # ... that joined both worlds
