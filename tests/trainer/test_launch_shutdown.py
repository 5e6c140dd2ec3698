"""A preemption save longer than torchrun's default 30 s is not cut short: the node's agent (python -m
trainer.launch, real torchrun) waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT between forwarding SIGTERM and its
SIGKILL, on every supported torch (torch 2.11's agent has no such setting and killed at 30 s:
`make test-torch-min`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.torchrun

SAVE_S = 34  # longer than torchrun's fixed 30 s on torch 2.11

WORKER = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def save_and_exit(*_):
    time.sleep({save_s})  # a preemption save of a large model
    (out / "saved").write_text("1")
    sys.exit(75)
signal.signal(signal.SIGTERM, save_and_exit)
(out / "started").write_text("1")
time.sleep(300)
"""


def _preempt(tmp_path: Path, save_s: float, shutdown_timeout_s: int) -> tuple[subprocess.Popen, str, float]:
    """Start the agent with one worker whose SIGTERM save takes ``save_s``, SIGTERM the agent once the worker
    runs; returns the agent, its stderr and the seconds from the SIGTERM to the agent's exit."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(save_s=save_s))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown_timeout_s)}
    command = ["-m", "trainer.launch", "--standalone", "--nproc-per-node", "1", str(script), str(tmp_path)]
    agent = subprocess.Popen(
        [sys.executable, *command],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()
            time.sleep(0.1)
        sent = time.monotonic()
        agent.send_signal(signal.SIGTERM)  # as the kubelet or the local supervisor does
        _, stderr = agent.communicate(timeout=120)
        waited = time.monotonic() - sent
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    return agent, stderr, waited


@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_the_agent_waits_the_shutdown_timeout_not_30s_for_a_preemption_save(tmp_path):
    agent, stderr, waited = _preempt(tmp_path, SAVE_S, shutdown_timeout_s=60)
    assert (tmp_path / "saved").exists(), (
        f"the worker was killed mid-save after {waited:.0f}s:\n{stderr[-2000:]}"
    )
    assert agent.returncode == 75, stderr[-2000:]
    assert "forcefully exiting via 9" not in stderr, stderr[-2000:]
    assert waited >= SAVE_S
    assert "SIGKILLed" not in stderr.splitlines()[-1], stderr[-2000:]


def test_a_save_cut_short_by_the_shutdown_timeout_is_said_so_in_the_nodes_last_line(tmp_path):
    agent, stderr, _ = _preempt(tmp_path, 60, shutdown_timeout_s=3)
    assert not (tmp_path / "saved").exists()
    assert agent.returncode == 75, stderr[
        -2000:
    ]  # still a preemption: relaunched from the last committed step
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("[trainer.launch] exit 75:") and "local rank(s) [0]" in last, stderr[-2000:]
    assert "SIGKILLed, their save cut short" in last and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in last, last
