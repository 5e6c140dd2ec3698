"""A real Airflow, started as subprocesses in a throwaway Airflow home of its own.

Shared by the tests that talk to a running Airflow: tests/integration/test_scheduler.py starts
``airflow standalone`` (every component), tests/ui/test_trigger_form.py only the api-server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
CLI_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def json_output(stdout: str) -> Any:
    """The JSON document an ``airflow ... -o json`` command printed (log lines may come first)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(("[", "{")):
            return json.loads(line)
    raise AssertionError(f"no JSON in the output:\n{stdout[-4000:]}")


def tail(path: Path, lines: int = 80) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        return f"<cannot read {path}: {err}>"
    return "\n".join(text.splitlines()[-lines:])


def airflow_environment(
    home: Path,
    port: int,
    *,
    state_dir: Path,
    data_dir: Path,
    dags: Path = REPO / "dags",
    db_url: str | None = None,
    parallelism: int = 2,
) -> dict[str, str]:
    """The environment of every component of a real Airflow in ``home`` (api-server on ``port``): nothing of
    the caller's own Airflow set-up (tests/conftest.py's session home) leaks in. benchmarks/loadlab/cluster.py
    starts its Airflow with it too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DTRAIN_"))}
    url = f"http://127.0.0.1:{port}"
    env.update(
        {
            # standalone starts its components as `airflow ...`: the venv's, from PATH
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            "PYTHONUNBUFFERED": "1",
            "NO_COLOR": "1",
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url or f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # LocalExecutor (standalone's choice) runs on sqlite; keep it and the parser small
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            # the train task defers: the real triggerer watches the pod group
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            # the DAGs show up within seconds, and are parsed once: a re-parse every 10 s cost the
            # training ranks beside it on a small machine several seconds of CPU each time (a DAG file
            # does not change during a test)
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            # api-server on a free port; workers reach its execution API there
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
            # the scheduler's and triggerer's log servers, off their fixed default ports
            # (8793, 8794) so a developer's own Airflow does not get in the way
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            # one secret for every component that signs or checks task tokens
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            # no login: the REST API answers the tests without a token, the UI opens logged in
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "DTRAIN_LOCAL_STATE_DIR": str(state_dir),
            "DTRAIN_DATA_DIR": str(data_dir),
        }
    )
    return env


def stop_process_group(proc: subprocess.Popen, grace_s: float, *, leader_first: bool = False) -> int | None:
    """SIGTERM to ``proc``'s process group (``leader_first``: to ``proc`` alone, as systemd or a pod's stop
    would, so that it shuts its executor down itself), SIGKILL to the group after ``grace_s``, and to what
    is left in it either way: ``proc``'s exit status."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        try:
            os.kill(proc.pid, sig) if leader_first and sig == signal.SIGTERM else os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # what it started in its group (a LocalExecutor worker, standalone's components) goes with it
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.poll()


def processes_of(home: Path) -> list[psutil.Process]:
    """Every live process (but this one) with ``home`` as its ``AIRFLOW_HOME``."""
    found, me = [], os.getpid()
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != me and proc.environ().get("AIRFLOW_HOME") == str(home):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_all(find: Callable[[], list[psutil.Process]], rounds: int = 3) -> None:
    """SIGKILL what ``find()`` returns until it returns nothing (a killed supervisor's children may appear
    after it), ``rounds`` times at the most."""
    for _ in range(rounds):
        leftovers = find()
        if not leftovers:
            return
        for proc in leftovers:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=10)


class Airflow:
    """A running ``airflow <command>`` (``standalone`` unless told) in its own Airflow home.

    ``dag_id`` only chooses whose task logs :meth:`diagnostics` shows. benchmarks/loadlab/cluster.py's
    ``Cluster`` is one too, whose components run as processes of their own.
    """

    failure: type[Exception] = AssertionError
    """What :meth:`cli`, :meth:`check_alive` and :func:`wait_for` raise (a test fails on it)."""

    def __init__(
        self, tmp_path: Path, command: Sequence[str] = ("standalone",), dag_id: str = "train_llama"
    ) -> None:
        self.tmp_path = tmp_path
        self.command = tuple(command)
        self.dag_id = dag_id
        self.home = tmp_path / "airflow"
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"{'-'.join(self.command)}.log"
        self.proc: subprocess.Popen | None = None
        self.env = self._environment()
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def _environment(self) -> dict[str, str]:
        return airflow_environment(
            self.home,
            self.port,
            state_dir=self.tmp_path / "dtrain" / "groups",
            data_dir=self.tmp_path / "data",
        )

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.proc = self.popen(self.command, self.log_path)

    def popen(self, command: Sequence[str], log_path: Path, mode: str = "wb") -> subprocess.Popen:
        """``airflow <command>`` started in a process group of its own, its output written to ``log_path``
        (``mode`` "ab": after what is there)."""
        with open(log_path, mode) as log:
            return subprocess.Popen(
                [sys.executable, "-m", "airflow", *command],
                cwd=self.tmp_path,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        self.http.close()
        if self.proc is not None:
            stop_process_group(self.proc, grace_s=15)
        # Whatever else carries this Airflow home: LocalExecutor workers, the pod group's
        # detached supervisor and its torchrun agents and ranks.
        kill_all(self.leftover_processes)

    def leftover_processes(self) -> list[psutil.Process]:
        return processes_of(self.home)

    # -- talking to it --------------------------------------------------------------------------
    def cli(
        self, *args: str, check: bool = True, timeout: float = CLI_TIMEOUT_S
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            cwd=self.tmp_path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise self.failure(
                f"`airflow {' '.join(args)}` exited {result.returncode}\n"
                f"stderr:\n{result.stderr[-4000:]}\nstdout:\n{result.stdout[-4000:]}\n{self.diagnostics()}"
            )
        return result

    def get(self, path: str, **params: Any) -> httpx.Response | None:
        try:
            return self.http.get(path, params=params or None)
        except httpx.HTTPError:
            return None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise self.failure(
                f"airflow {' '.join(self.command)} exited with {self.proc.returncode}\n{self.diagnostics()}"
            )

    def diagnostics(self) -> str:
        parts = [f"--- last lines of {self.log_path} ---", tail(self.log_path, 150)]
        logs = self.home / "logs"
        task_logs = sorted(logs.glob(f"dag_id={self.dag_id}/**/*.log")) if logs.is_dir() else []
        for path in task_logs:
            parts += [f"--- task log {path.relative_to(self.home)} ---", tail(path, 120)]
        for path in sorted((self.tmp_path / "dtrain" / "groups").glob("*/group.log")):
            parts += [f"--- pod group log {path} ---", tail(path, 60)]
        for path in sorted((self.tmp_path / "dtrain" / "groups").glob("*/supervisor.log")):
            parts += [f"--- pod group supervisor log {path} ---", tail(path, 30)]
        return "\n".join(parts)


def wait_for(what: str, airflow: Airflow, timeout: float, probe, interval: float = 2.0) -> Any:
    """Call ``probe`` until it returns something truthy; fail with the diagnostics after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        airflow.check_alive()
        if result := probe():
            return result
        time.sleep(interval)
    raise airflow.failure(f"timed out after {timeout:.0f}s waiting for {what}\n{airflow.diagnostics()}")
