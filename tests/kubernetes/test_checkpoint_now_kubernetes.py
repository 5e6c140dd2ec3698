"""KubernetesLauncher.checkpoint_now, both ways.

By default a pod annotation: the fake API server receives the PATCH, a stand-in kubelet writes the pod's
annotations into the file the downward-API volume would hold, and a real ``python -m trainer.launch``
(torchrun) sends its workers SIGUSR1 -- with no ``pods/exec`` in the Role.

Opt-in (``kubernetes={"checkpoint_now": "exec"}``): SIGUSR1 through ``pods/exec``, the real client speaking
the WebSocket exec protocol to the fake API server, which runs the launcher's command on this machine as
the pod's container would (beside stand-ins for a pod's processes)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.kubernetes.conftest import launch_debug_group

GROUP = "ckpt-now-r0"
# A stand-in process: counts the SIGUSR1s it gets in the file named by its last argument, after starting
# the stand-ins its second-to-last argument lists (JSON: [{"argv": [...], "children": [...], "marker":
# path}]).
STANDIN = """
import json, os, pathlib, signal, subprocess, sys, time
marker = pathlib.Path(sys.argv[-1])
def count(*_):
    marker.write_text(str(int(marker.read_text() or 0) + 1))
signal.signal(signal.SIGUSR1, count)
for child in json.loads(sys.argv[-2]):
    subprocess.Popen([sys.executable, "-c", os.environ["STANDIN"], *child["argv"],
                      json.dumps(child["children"]), child["marker"]])
marker.write_text("0")
time.sleep(120)
"""


@pytest.fixture
def pod_processes(tmp_path):
    """A pod's process tree: the group's torchrun agent (`-m trainer.launch`) and its two workers -- one the
    bundled trainer (`-m trainer`), one a program of your own (`/opt/own/train.py`) -- and a data loader
    worker the first started (a grandchild of the agent, which SIGUSR1 would kill); beside it, another group's
    agent
    and worker on the same machine. Only the group's workers may be signalled."""
    markers = {k: tmp_path / k for k in ("agent", "rank0", "rank1", "loader", "other_agent", "other")}

    def standin(argv, marker, children=()):
        return {"argv": argv, "children": list(children), "marker": str(markers[marker])}

    loader = standin(["-c", "data loader worker"], "loader")
    rank0 = standin(["-m", "trainer", "--config", "c.toml"], "rank0", [loader])
    rank1 = standin(["/opt/own/train.py", "--lr", "3e-4"], "rank1")
    trees = {
        GROUP: standin(
            ["-m", "trainer.launch", "--nproc-per-node", "2", "/opt/own/train.py"], "agent", [rank0, rank1]
        ),
        "another-group-r0": standin(
            ["-m", "trainer.launch", "-m", "trainer"],
            "other_agent",
            [standin(["-m", "trainer", "--config", "c.toml"], "other")],
        ),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STANDIN, *top["argv"], json.dumps(top["children"]), top["marker"]],
            env={**os.environ, "DTRAIN_GROUP_NAME": group, "STANDIN": STANDIN},
        )
        for group, top in trees.items()
    ]
    try:
        deadline = time.monotonic() + 30
        while not all(m.exists() for m in markers.values()):
            assert time.monotonic() < deadline, "the stand-in processes did not start"
            time.sleep(0.05)
        yield markers
    finally:
        for p in procs:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait()


def _signals(markers: dict[str, Path], want: dict[str, int]) -> dict[str, int]:
    deadline = time.monotonic() + 60
    while True:
        got = {k: int(m.read_text() or 0) for k, m in markers.items()}
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_checkpoint_now_signals_the_training_processes_of_running_pods_only(fake, tmp_path, pod_processes):
    """Every worker of the agent, the bundled trainer and a program of your own alike; not the agent, not
    what a worker started, not another group's."""
    launcher = launch_debug_group(GROUP, tmp_path, checkpoint_now="exec")

    def container(namespace, pod, name, command):  # the image's python, on this machine
        assert name == "trainer" and command[0] == "python"
        done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=30)
        return done.stdout, done.stderr, done.returncode

    fake.exec_handler = container
    fake.run(GROUP, [0])  # node 1 is still pending: nothing to signal there
    assert launcher.checkpoint_now(GROUP) == 2
    assert [(ns, pod) for ns, pod, _, _ in fake.execs] == [
        ("default", fake.pod(GROUP, 0)["metadata"]["name"])
    ]
    want = {"agent": 0, "rank0": 1, "rank1": 1, "loader": 0, "other_agent": 0, "other": 0}
    assert _signals(pod_processes, want) == want

    # Node 1 runs too, but its image has no python: that pod is reported, node 0 is still signalled.
    fake.run(GROUP, [1])
    pod1 = fake.pod(GROUP, 1)["metadata"]["name"]
    fake.exec_handler = lambda ns, pod, name, command: (
        ("", 'exec: "python": executable file not found in $PATH', 127)
        if pod == pod1
        else container(ns, pod, name, command)
    )
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
    want = {"agent": 0, "rank0": 2, "rank1": 2, "loader": 0, "other_agent": 0, "other": 0}
    assert _signals(pod_processes, want) == want


WORKER = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1]) / f"rank{os.environ['RANK']}"
out.write_text("0")
signal.signal(signal.SIGUSR1, lambda *_: out.write_text(str(int(out.read_text()) + 1)))
while not (pathlib.Path(sys.argv[1]) / "done").exists():
    time.sleep(0.05)
"""


def _play_kubelet(fake, pod: str, annotations: Path, stop) -> None:
    """Copy the pod's annotations into ``annotations`` every 0.2 s, as the downward-API volume does."""
    import threading

    def kubelet():
        while not stop.wait(0.2):
            values = (fake.get("pods", pod) or {}).get("metadata", {}).get("annotations") or {}
            tmp = annotations.with_suffix(".tmp")
            tmp.write_text("\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(values.items())))
            os.replace(tmp, annotations)

    threading.Thread(target=kubelet, daemon=True).start()


def _start_agent(tmp_path: Path, requests_file_env: str, annotations: Path) -> subprocess.Popen:
    """trainer.launch with two WORKER processes, following ``annotations`` for checkpoint-now."""
    (tmp_path / "worker.py").write_text(WORKER)
    argv = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2",
            str(tmp_path / "worker.py"), str(tmp_path)]  # fmt: skip
    env = {**os.environ, requests_file_env: str(annotations), "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


def _worker_counts(tmp_path: Path) -> list[str | None]:
    """The SIGUSR1s each WORKER rank has counted (None: not started)."""
    return [(tmp_path / f"rank{r}").read_text() if (tmp_path / f"rank{r}").exists() else None for r in (0, 1)]


def test_checkpoint_now_by_annotation_reaches_a_real_agents_workers_without_exec(fake, tmp_path):
    """The launcher patches the pod; the kubelet (here: a thread copying the pod's annotations into the
    file, as the downward-API volume does) refreshes the file; trainer.launch signals its two workers."""
    import threading

    from airflow_dtrain.kubernetes.names import CHECKPOINT_NOW_ANNOTATION, PODINFO_DIR, REQUESTS_FILE_ENV

    launcher = launch_debug_group(GROUP, tmp_path)
    job = fake.get("jobs", GROUP)
    pod_spec = job["spec"]["template"]["spec"]
    [container] = pod_spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[REQUESTS_FILE_ENV] == f"{PODINFO_DIR}/annotations"
    assert {
        "name": "podinfo",
        "downwardAPI": {
            "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
        },
    } in pod_spec["volumes"]
    fake.run(GROUP, [0])
    pod = fake.pod(GROUP, 0)["metadata"]["name"]
    annotations = tmp_path / "annotations"
    stop = threading.Event()
    _play_kubelet(fake, pod, annotations, stop)
    agent = _start_agent(tmp_path, REQUESTS_FILE_ENV, annotations)
    counts = lambda: _worker_counts(tmp_path)  # noqa: E731
    try:
        deadline = time.monotonic() + 60
        while counts() != ["0", "0"]:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        time.sleep(1.5)  # the agent has read the file as it was
        assert launcher.checkpoint_now(GROUP) == 1  # node 1 is still pending: one pod asked
        deadline = time.monotonic() + 30
        while counts() != ["1", "1"]:
            assert time.monotonic() < deadline, f"the request did not reach both workers: {counts()}"
            time.sleep(0.1)
    finally:
        stop.set()
        (tmp_path / "done").write_text("")
        _, stderr = agent.communicate(timeout=60)
    assert agent.returncode == 0, stderr
    patched = [r for r in fake.requests if r[0] == "PATCH" and "/pods/" in r[1]]
    assert patched and not [r for r in fake.requests if r[0] == "EXEC"]
    assert CHECKPOINT_NOW_ANNOTATION in fake.get("pods", pod)["metadata"]["annotations"]
