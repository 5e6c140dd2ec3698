"""Helpers for the trainer tests: real processes (python -m trainer, torchrun via trainer.launch) on
CPU/gloo."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import psutil
import pytest

from trainer.events import EVENTS_DIR_ENV, EventCursor, read_events
from trainer.elastic import workers

REPO = Path(__file__).resolve().parents[2]

# Small and fast on 2 CPU cores; every run in these tests uses it unless it says otherwise.
FAST_DEFAULTS = [
    "--flavor",
    "debug",
    "--set",
    "data.seq_len=32",
    "--set",
    "global_batch_size=8",
    "--set",
    "micro_batch_size=4",
    "--set",
    "metrics.log_every=1",
]
# Async saves are the default on GPU only (sync on a CPU-only node): the trainer tests run the async
# path on CPU so that what a GPU job does is what they test.
FAST = [*FAST_DEFAULTS, "--set", "checkpoint.async_save=true"]


BUCKET = "dtrain-ckpt"
"""The bucket the ``s3`` fixture creates."""


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on a free loopback port; the standard AWS env variables point at it."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import boto3

    boto3.client("s3").create_bucket(Bucket=BUCKET)
    yield env
    server.stop()


@pytest.fixture
def gloo_group():
    """A 1-rank gloo process group in this process (the default group), destroyed after the test."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> str:
    """A DTRAIN_DATA_DIR shared by the session: the built-in corpus is built once."""
    d = tmp_path_factory.mktemp("dtrain-data")
    from trainer.data.loader import ensure_builtin

    ensure_builtin(str(d))
    return str(d)


def trainer_env(data_dir: str) -> dict:
    env = dict(os.environ, DTRAIN_DATA_DIR=data_dir, PYTHONPATH=str(REPO))
    env.pop("RANK", None)
    return env


def trainer_cmd(args: list[str], nproc: int | None, agent_args: tuple = ()) -> list[str]:
    """`python -m trainer ARGS` (nproc None) or
    `python -m trainer.launch --nproc-per-node N AGENT_ARGS -m trainer ARGS`."""
    if nproc is None:
        return [sys.executable, "-m", "trainer", *args]
    # --standalone: a rendezvous on a free local port, so tests never collide on one.
    return [
        sys.executable,
        "-m",
        "trainer.launch",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *agent_args,
        "-m",
        "trainer",
        *args,
    ]


class Run:
    """A finished run: exit code, its events (read from its events files: trainer/events.py), stdout and
    stderr."""

    def __init__(self, returncode: int, stdout: str, stderr: str, events: list[dict] | None = None):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.events = events if events is not None else []

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("train")}

    def __repr__(self) -> str:
        return (
            f"Run(rc={self.returncode})\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-5000:]}"
        )


def _start(args: list[str], data_dir: str, nproc: int | None, timeout: float, env: dict | None = None,
           agent_args: tuple = ()):  # fmt: skip
    """Start a run in a session of its own (so its workers can be reaped with it), with a
    watchdog that kills the whole group after `timeout` seconds. stderr goes to a file:
    a full pipe would block the run while we read its stdout."""
    stderr = tempfile.TemporaryFile(mode="w+")
    # each run's events go to a directory of its own (a test may name one); torchrun starts each worker in a
    # session of its own: a tag in the environment finds them all
    events = tempfile.mkdtemp(prefix="dtrain-events-")
    env = {
        **trainer_env(data_dir),
        EVENTS_DIR_ENV: events,
        **(env or {}),
        "DTRAIN_TEST_RUN": uuid.uuid4().hex,
    }
    proc = subprocess.Popen(
        trainer_cmd(args, nproc, agent_args),
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )
    proc.dtrain_tag, proc.dtrain_events, proc.dtrain_own_events = (
        env["DTRAIN_TEST_RUN"],
        env[EVENTS_DIR_ENV],
        events,
    )
    watchdog = threading.Timer(timeout, _killpg, (proc,))
    watchdog.start()
    return proc, stderr, watchdog


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    tag = getattr(proc, "dtrain_tag", None)
    for leftover in psutil.process_iter():
        try:
            if tag and leftover.environ().get("DTRAIN_TEST_RUN") == tag:
                leftover.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue


def _finish(proc, stderr, watchdog, stdout: str) -> "Run":
    proc.wait()
    timed_out = watchdog.finished.is_set()  # set by the watchdog firing (we have not cancelled it yet)
    watchdog.cancel()
    _killpg(proc)  # workers left behind by a dead agent, if any
    stderr.seek(0)
    try:
        run = Run(proc.returncode, stdout, stderr.read(), read_events(proc.dtrain_events))
    finally:
        stderr.close()
        shutil.rmtree(proc.dtrain_own_events, ignore_errors=True)
    assert not timed_out, f"run timed out and was killed: {run}"
    return run


def run_trainer(
    args: list[str], data_dir: str, nproc: int | None = None, timeout: float = 240, env: dict | None = None
) -> Run:
    proc, stderr, watchdog = _start(args, data_dir, nproc, timeout, env)
    return _finish(proc, stderr, watchdog, proc.stdout.read())


def run_and_signal(
    args: list[str],
    data_dir: str,
    *,
    when_step: int,
    send,
    nproc: int | None = None,
    timeout: float = 240,
    env: dict | None = None,
    agent_args: tuple = (),
) -> Run:
    """Start a run, call send(proc) once a "train" event for step >= when_step is printed, wait for exit."""
    return run_with_signals(
        args,
        data_dir,
        [(lambda e: e["event"] == "train" and e["step"] >= when_step, send)],
        nproc=nproc,
        timeout=timeout,
        env=env,
        agent_args=agent_args,
    )


def run_with_signals(
    args: list[str],
    data_dir: str,
    plan,
    nproc: int | None = None,
    timeout: float = 240,
    env: dict | None = None,
    agent_args: tuple = (),
) -> Run:
    """Start a run; plan is [(predicate(event), send(proc))]: each send fires, in order, on the first
    event (after the previous one fired) that matches its predicate. Waits for the exit. The events are
    read from the run's events files; each line of its stdout (where every event is echoed, after it is
    written there) is the moment to look."""
    proc, stderr, watchdog = _start(args, data_dir, nproc, timeout, env, agent_args)
    lines, pending, cursor = [], list(plan), EventCursor(proc.dtrain_events)
    for line in proc.stdout:
        lines.append(line)
        for event in cursor.read() if pending else []:
            if pending and pending[0][0](event):
                pending.pop(0)[1](proc)
    run = _finish(proc, stderr, watchdog, "".join(lines))
    assert not pending, f"the run ended before all signals were sent: {run}"
    return run


def worker_pids(agent_pid: int) -> dict[int, int]:
    """{rank: pid} of the torchrun workers started by the agent process."""
    ranks = {pid: workers.rank_of(pid) for pid in workers.worker_pids(agent_pid)}
    return {rank: pid for pid, rank in ranks.items() if rank is not None}


def sigterm(proc) -> None:
    proc.send_signal(signal.SIGTERM)


def read_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


def load_checkpoint_tensors(step_dir) -> dict:
    """Every tensor of a DCP checkpoint as full (unsharded) tensors:
    {"model.x": t, "optim.state.x.exp_avg": t, ...}."""
    from trainer.checkpoint.state import checkpoint_tensors

    return checkpoint_tensors(str(step_dir))
