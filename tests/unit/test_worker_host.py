"""An elastic group's worker and its host (trainer/elastic/worker_host.py), over their real Unix socket, in
real
processes: the host trains each round the worker hands it while rounds end resumable, the worker forwards
its signals and exits with the host's code, and dies as a killed worker would when its host dies. (A real
resize through torchrun, with the same training process across worlds:
tests/integration/test_elastic_local.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from trainer.elastic import worker_host

ROOT = Path(__file__).resolve().parents[2]

# A host whose rounds "train" by exiting with the code their first argument names (nothing of torch).
HOST = textwrap.dedent(
    """
    import socket, sys
    from trainer.elastic import worker_host
    worker_host._train = lambda argv: int(argv[0])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(worker_host.socket_path(sys.argv[1], 0))
    listener.listen(1)
    worker_host.serve(listener, 0)
    """
)
# A worker (the proxy its agent forks): hands its round to the host, exits with its code.
WORKER = (
    "import sys; from trainer.elastic.worker_host import run_in_host; sys.exit(run_in_host(0, sys.argv[1:]))"
)


def _python(code: str, *args: str, env: dict | None = None, pass_fds: tuple = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, env={**os.environ, **(env or {})}, pass_fds=pass_fds
    )


def _wait_for(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _round(directory: Path, argv: list[str]) -> int:
    """Be the worker by hand: one round in the host, its exit code."""
    with Client(worker_host.socket_path(str(directory), 0), family="AF_UNIX") as conn:
        json.loads(conn.recv_bytes())
        conn.send_bytes(json.dumps({"argv": argv, "env": {"RANK": "0"}, "started_at": time.time()}).encode())
        return json.loads(conn.recv_bytes())["code"]


def test_a_host_trains_again_after_a_resumable_stop_and_ends_after_anything_else(tmp_path):
    host = _python(HOST, str(tmp_path))
    try:
        _wait_for(tmp_path / "0.sock")
        assert _round(tmp_path, ["75"]) == 75  # preempted, saved: the next world trains here
        assert _round(tmp_path, ["75"]) == 75
        assert _round(tmp_path, ["1"]) == 1  # a crash: this process is not trusted with another world
        assert host.wait(timeout=30) == 0
    finally:
        host.kill()
    with pytest.raises(OSError):  # nobody listens any more: the next worker trains in its own process
        _round(tmp_path, ["75"])


def test_a_worker_forwards_its_signals_to_the_host_and_exits_with_the_hosts_code(tmp_path):
    """The agent signals the worker it forked (SIGTERM: save and stop; "checkpoint now": SIGUSR1); the host
    trains, so the signals must reach it, and its exit code must reach the agent."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(worker_host.socket_path(str(tmp_path), 0))
    listener.listen(1)
    seen = tmp_path / "signals"
    # The host's side by hand, in a process that records the signals it gets and answers 75 after SIGTERM.
    host = _python(
        textwrap.dedent(
            """
            import json, os, signal, socket, sys, time
            from multiprocessing.connection import Connection
            listener = socket.socket(fileno=int(sys.argv[1]))
            conn = Connection(listener.accept()[0].detach())
            conn.send_bytes(json.dumps({"pid": os.getpid()}).encode())
            request = json.loads(conn.recv_bytes())  # the worker forwards its signals from here on
            open(sys.argv[2] + ".ready", "w").close()
            got = []
            def note(signum, frame):
                got.append(signal.Signals(signum).name)
                open(sys.argv[2], "w").write(" ".join(got))
            signal.signal(signal.SIGUSR1, note)
            signal.signal(signal.SIGTERM, note)
            while "SIGTERM" not in got:
                time.sleep(0.02)
            conn.send_bytes(json.dumps({"code": 75, "argv": request["argv"]}).encode())
            """
        ),
        str(listener.fileno()),
        str(seen),
        pass_fds=(listener.fileno(),),
    )
    worker = _python(WORKER, "--steps", "3", env={worker_host.HOSTS_ENV: str(tmp_path), "RANK": "0"})
    try:
        _wait_for(Path(f"{seen}.ready"))  # the worker has handed its round over
        worker.send_signal(signal.SIGUSR1)
        _wait_for(seen)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 75
        assert seen.read_text() == "SIGUSR1 SIGTERM"
    finally:
        worker.kill()
        host.kill()
        listener.close()


def test_a_worker_whose_host_dies_mid_round_dies_as_a_killed_worker(tmp_path):
    """Its agent must see what it sees of a worker the OOM killer took (-9: resumable, a lost worker)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(worker_host.socket_path(str(tmp_path), 0))
    listener.listen(1)
    worker = _python(WORKER, "--steps", "3", env={worker_host.HOSTS_ENV: str(tmp_path), "RANK": "2"})
    try:
        listener.settimeout(30)
        accepted, _ = listener.accept()
        from multiprocessing.connection import Connection

        conn = Connection(accepted.detach())
        conn.send_bytes(json.dumps({"pid": os.getpid()}).encode())
        request = json.loads(conn.recv_bytes())
        assert request["argv"] == ["--steps", "3"] and request["env"]["RANK"] == "2"
        assert request["started_at"] <= time.time()
        conn.close()  # the host is gone
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        worker.kill()
        listener.close()


def test_without_a_host_the_worker_trains_in_its_own_process(tmp_path, monkeypatch):
    monkeypatch.delenv(worker_host.HOSTS_ENV, raising=False)
    assert worker_host.run_in_host(0, ["--steps", "1"]) is None  # not an elastic group
    monkeypatch.setenv(worker_host.HOSTS_ENV, str(tmp_path))
    assert worker_host.run_in_host(0, ["--steps", "1"]) is None  # its host has ended
