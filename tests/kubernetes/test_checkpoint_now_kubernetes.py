"""KubernetesLauncher.checkpoint_now: SIGUSR1 through ``pods/exec``, the real client speaking the
WebSocket exec protocol to the fake API server, which runs the launcher's command on this
machine as the pod's container would (beside stand-ins for a pod's processes)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kubernetes.conftest import launch_debug_group

GROUP = "ckpt-now-r0"
# A stand-in process: counts the SIGUSR1s it gets in the file named by its last argument.
COUNTER = """
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[-1])
def count(*_):
    marker.write_text(str(int(marker.read_text() or 0) + 1))
signal.signal(signal.SIGUSR1, count)
marker.write_text("0")
time.sleep(120)
"""


@pytest.fixture
def pod_processes(tmp_path):
    """Two training processes (`... -m trainer ...`) and a torchrun agent (`-m trainer.launch`) of the
    group, and a training process of another group on the same machine (which must not be signalled)."""
    markers = {"rank0": tmp_path / "rank0", "rank1": tmp_path / "rank1", "agent": tmp_path / "agent",
               "other": tmp_path / "other"}
    argv = {"rank0": ["-m", "trainer", "--config", "c.toml"], "rank1": ["-m", "trainer", "--config", "c.toml"],
            "agent": ["-m", "trainer.launch", "--nproc-per-node", "2", "-m", "trainer"],
            "other": ["-m", "trainer", "--config", "c.toml"]}
    group = {k: GROUP for k in markers} | {"other": "another-group-r0"}
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER, *argv[k], str(m)],
                              env={**os.environ, "DTRAIN_GROUP_NAME": group[k]}) for k, m in markers.items()]
    deadline = time.monotonic() + 30
    while not all(m.exists() for m in markers.values()):
        assert time.monotonic() < deadline, "the stand-in processes did not start"
        time.sleep(0.05)
    yield markers
    for p in procs:
        p.kill()
        p.wait()


def _signals(markers: dict[str, Path], want: dict[str, int]) -> dict[str, int]:
    deadline = time.monotonic() + 10
    while True:
        got = {k: int(m.read_text() or 0) for k, m in markers.items()}
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_checkpoint_now_signals_the_training_processes_of_running_pods_only(fake, tmp_path, pod_processes):
    launcher = launch_debug_group(GROUP, tmp_path)

    def container(namespace, pod, name, command):  # the image's python, on this machine
        assert name == "trainer" and command[0] == "python"
        done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=30)
        return done.stdout, done.stderr, done.returncode

    fake.exec_handler = container
    fake.run(GROUP, [0])  # node 1 is still pending: nothing to signal there
    assert launcher.checkpoint_now(GROUP) == 2
    assert [(ns, pod) for ns, pod, _, _ in fake.execs] == [("default", fake.pod(GROUP, 0)["metadata"]["name"])]
    assert _signals(pod_processes, {"rank0": 1, "rank1": 1, "agent": 0, "other": 0}) == {
        "rank0": 1, "rank1": 1, "agent": 0, "other": 0}

    # Node 1 runs too, but its image has no python: that pod is reported, node 0 is still signalled.
    fake.run(GROUP, [1])
    pod1 = fake.pod(GROUP, 1)["metadata"]["name"]
    fake.exec_handler = lambda ns, pod, name, command: (
        ("", 'exec: "python": executable file not found in $PATH', 127) if pod == pod1 else container(ns, pod, name, command))
    warnings = []  # what the task log shows
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    launcher.log.addHandler(handler)
    try:
        assert launcher.checkpoint_now(GROUP) == 2
    finally:
        launcher.log.removeHandler(handler)
    log = "\n".join(warnings)
    assert f"checkpoint-now in pod default/{pod1} failed (exit code 127)" in log
    assert "executable file not found" in log
    assert _signals(pod_processes, {"rank0": 2, "rank1": 2, "agent": 0, "other": 0}) == {
        "rank0": 2, "rank1": 2, "agent": 0, "other": 0}
