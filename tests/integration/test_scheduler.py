"""End to end: a real Airflow (scheduler, dag-processor, triggerer, api-server) runs train_llama.

``airflow standalone`` is started in a fresh Airflow home of its own (sqlite, LocalExecutor),
``airflow dags trigger train_llama`` creates a run with a small configuration, and the test
waits for that run to succeed. With ``[operators] default_deferrable`` on, the train task
launches the pod group (2 nodes x 1 process, a real c10d rendezvous), defers, and the real
triggerer watches the group until it ends; the task then resumes on a worker and returns the
summary.

Slow (one to two minutes on 2 CPU cores); deselect with ``-m "not scheduler"``.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "train_llama"
TASK_ID = "train_spot"  # the budget branch chooses spot at the local backend's default prices
PUBLISH_DAG_ID = "publish_llama"  # scheduled on the asset a promotion updates
STEPS = 20
RUN_CONF = {
    "num_nodes": 2,  # two torchrun agents: a real rendezvous
    "procs_per_node": 1,
    "steps": STEPS,
    "checkpoint_every": 10,
    "simulate_preemption_at_step": 0,
}

STARTUP_TIMEOUT_S = 180
DAG_PARSE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 420
CLI_TIMEOUT_S = 120

pytestmark = pytest.mark.scheduler


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _json_output(stdout: str) -> Any:
    """The JSON document an ``airflow ... -o json`` command printed (log lines may come first)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(("[", "{")):
            return json.loads(line)
    raise AssertionError(f"no JSON in the output:\n{stdout[-4000:]}")


def _tail(path: Path, lines: int = 80) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        return f"<cannot read {path}: {err}>"
    return "\n".join(text.splitlines()[-lines:])


class Airflow:
    """A running ``airflow standalone`` in its own Airflow home, and ways to talk to it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.home = tmp_path / "airflow"
        self.home.mkdir()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "standalone.log"
        self.proc: subprocess.Popen | None = None
        self.env = self._environment()
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def _environment(self) -> dict[str, str]:
        # Nothing of the test session's own Airflow set-up (tests/conftest.py) leaks in.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DTRAIN_"))}
        venv_bin = str(Path(sys.executable).parent)
        env.update(
            {
                # standalone starts its components as `airflow ...`: the venv's, from PATH
                "PATH": os.pathsep.join([venv_bin, env.get("PATH", "")]),
                "PYTHONUNBUFFERED": "1",
                "NO_COLOR": "1",
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                # LocalExecutor (standalone's choice) runs on sqlite; keep it and the parser small
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "2",
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                # the train task defers: the real triggerer watches the pod group
                "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
                # the DAG shows up (and is re-parsed) within seconds
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
                # api-server on a free port; workers reach its execution API there
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__BASE_URL": self.url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                # the scheduler's and triggerer's log servers, off their fixed default ports
                # (8793, 8794) so a developer's own Airflow does not get in the way
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
                # one secret for every component that signs or checks task tokens
                "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
                # no login: the REST API answers this test without a token
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "DTRAIN_LOCAL_STATE_DIR": str(self.tmp_path / "dtrain" / "groups"),
                "DTRAIN_DATA_DIR": str(self.tmp_path / "data"),
            }
        )
        return env

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "airflow", "standalone"],
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
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            # standalone's components are in its process group, whether or not it exited first
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Whatever else carries this Airflow home: LocalExecutor workers, the pod group's
        # detached supervisor and its torchrun agents and ranks.
        for _ in range(3):
            leftovers = self.leftover_processes()
            if not leftovers:
                break
            for proc in leftovers:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(leftovers, timeout=10)

    def leftover_processes(self) -> list[psutil.Process]:
        found = []
        me = os.getpid()
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                if proc.environ().get("AIRFLOW_HOME") == str(self.home):
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    # -- talking to it --------------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            cwd=self.tmp_path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"`airflow {' '.join(args)}` exited {result.returncode}\n"
                f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}\n{self.diagnostics()}"
            )
        return result

    def get(self, path: str) -> httpx.Response | None:
        try:
            return self.http.get(path)
        except httpx.HTTPError:
            return None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"airflow standalone exited with {self.proc.returncode}\n{self.diagnostics()}"
            )

    def diagnostics(self) -> str:
        parts = [f"--- last lines of {self.log_path} ---", _tail(self.log_path, 150)]
        logs = self.home / "logs"
        task_logs = sorted(logs.glob(f"dag_id={DAG_ID}/**/*.log")) if logs.is_dir() else []
        for path in task_logs:
            parts += [f"--- task log {path.relative_to(self.home)} ---", _tail(path, 120)]
        for path in sorted((self.tmp_path / "dtrain" / "groups").glob("*/group.log")):
            parts += [f"--- pod group log {path} ---", _tail(path, 60)]
        for path in sorted((self.tmp_path / "dtrain" / "groups").glob("*/supervisor.log")):
            parts += [f"--- pod group supervisor log {path} ---", _tail(path, 30)]
        return "\n".join(parts)


def _wait_for(what: str, airflow: Airflow, timeout: float, probe, interval: float = 2.0) -> Any:
    """Call ``probe`` until it returns something truthy; fail with the diagnostics after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        airflow.check_alive()
        if result := probe():
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{airflow.diagnostics()}")


@pytest.fixture
def airflow(tmp_path: Path) -> Iterator[Airflow]:
    instance = Airflow(tmp_path)
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()
        leftovers = instance.leftover_processes()
        assert not leftovers, f"processes outlived the test: {leftovers}"


@pytest.mark.timeout(1000)  # above the sum of its own waits, so a slow run fails with its diagnostics
def test_standalone_airflow_runs_train_llama_to_success(airflow: Airflow) -> None:
    started = time.monotonic()

    # 1. All components up: the api-server answers, and reports the scheduler and the
    #    triggerer (and the dag-processor) heartbeating.
    def healthy() -> dict | None:
        response = airflow.get("/api/v2/monitor/health")
        if response is None or response.status_code != 200:
            return None
        health = response.json()
        components = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return health if all((health.get(c) or {}).get("status") == "healthy" for c in components) else None

    _wait_for("the api-server to report every component healthy", airflow, STARTUP_TIMEOUT_S, healthy)

    # 2. The dag-processor has parsed train_llama (paused, as new DAGs are by default).
    def dag_known() -> dict | None:
        response = airflow.get(f"/api/v2/dags/{DAG_ID}")
        if response is None or response.status_code != 200:
            errors = airflow.get("/api/v2/importErrors")
            if errors is not None and errors.status_code == 200 and errors.json().get("import_errors"):
                raise AssertionError(f"DAG import errors: {errors.json()}\n{airflow.diagnostics()}")
            return None
        dag = response.json()
        return dag if dag.get("next_dagrun_logical_date") else None

    dag = _wait_for(f"the dag-processor to parse {DAG_ID}", airflow, DAG_PARSE_TIMEOUT_S, dag_known)
    listed = _json_output(airflow.cli("dags", "list", "-o", "json").stdout)
    assert DAG_ID in {d["dag_id"] for d in listed}, listed

    # 3. Trigger it, then unpause it.
    #
    # train_llama is @daily with catchup=False and max_active_runs=1, and its start_date is in the
    # past: unpausing it makes the scheduler create a scheduled run for the latest @daily tick
    # (today 00:00 UTC, the DAG's next_dagrun_logical_date) straight away. That run, with the DAG's
    # default params (60 steps and a simulated preemption), would be queued ahead of ours --
    # it has the earlier run_after -- and hold the only active-run slot for minutes. So the run
    # is triggered, while the DAG is still paused, *at that logical date*: the scheduler then
    # finds the interval's run already there, creates no scheduled run, and moves next_dagrun
    # on to the next (future) tick. (Checked: triggered without --logical-date, the run stays
    # queued while scheduled__<today> runs.) The run also gets a run id of our own, so everything
    # below looks at exactly this run whatever else might exist.
    run_id = f"scheduler_test__{uuid.uuid4().hex[:12]}"
    logical_date = dag["next_dagrun_logical_date"]
    airflow.cli("dags", "trigger", DAG_ID, "--run-id", run_id, "--logical-date", logical_date,
                "--conf", json.dumps(RUN_CONF), "-o", "json")  # fmt: skip
    airflow.cli("dags", "unpause", DAG_ID, "--yes")
    airflow.cli("dags", "unpause", PUBLISH_DAG_ID, "--yes")

    # 4. Wait for the run to end. Polled through the REST API, which costs the api-server a
    #    query; an `airflow` CLI call costs seconds of CPU that the training ranks need on a
    #    small machine. The final state is then read back with `airflow dags list-runs`.
    def run_finished() -> str | None:
        response = airflow.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")
        if response is None or response.status_code != 200:
            return None
        state = response.json().get("state")
        return state if state in ("success", "failed") else None

    _wait_for(f"run {run_id} to finish", airflow, RUN_TIMEOUT_S, run_finished, interval=3.0)
    runs = _json_output(airflow.cli("dags", "list-runs", DAG_ID, "-o", "json").stdout)
    ours = [r for r in runs if r["run_id"] == run_id]
    assert ours, f"run {run_id} not in `airflow dags list-runs`: {runs}"
    assert ours[0]["state"] == "success", (
        f"run {run_id} ended {ours[0]['state']}; all runs: {runs}\n{airflow.diagnostics()}"
    )

    # 5. The train task's summary: its XCom and the summary.json next to the checkpoints.
    response = airflow.get(
        f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/xcomEntries/return_value"
    )
    assert response is not None and response.status_code == 200, (
        f"no return_value XCom for {TASK_ID}: {response and response.text}\n{airflow.diagnostics()}"
    )
    summary = response.json()["value"]
    if isinstance(summary, str):  # the raw serialized value
        summary = json.loads(summary)
    assert summary["final_step"] == STEPS, f"{summary}\n{airflow.diagnostics()}"
    assert summary["preemptions"] == 0, summary

    # checkpoint_uri is empty: checkpoints go to $AIRFLOW_HOME/dtrain/checkpoints/train_llama/<run id>/
    summaries = sorted((airflow.home / "dtrain" / "checkpoints").rglob("summary.json"))
    assert len(summaries) == 1, f"summary.json files: {summaries}\n{airflow.diagnostics()}"
    assert json.loads(summaries[0].read_text()) == summary
    assert Path(summary["latest_checkpoint"]).parent == summaries[0].parent, summary

    # 6. The evaluation promoted the checkpoint (the first is always the best so far), which
    #    updated the asset; the scheduler then ran publish_llama on its own.
    def published() -> dict | None:
        response = airflow.get(f"/api/v2/dags/{PUBLISH_DAG_ID}/dagRuns")
        if response is None or response.status_code != 200:
            return None
        runs = response.json().get("dag_runs", [])
        failed = [r for r in runs if r.get("state") == "failed"]
        assert not failed, f"{PUBLISH_DAG_ID} failed: {failed}\n{airflow.diagnostics()}"
        done = [r for r in runs if r.get("state") == "success"]
        return done[0] if done else None

    publish_run = _wait_for(f"{PUBLISH_DAG_ID} to run on the promoted model", airflow, 180, published, interval=3.0)
    assert publish_run["run_type"] == "asset_triggered", publish_run
    card = airflow.home / "dtrain" / "models" / "train_llama" / "published" / "latest" / "MODEL_CARD.md"
    assert card.is_file(), f"no model card at {card}\n{airflow.diagnostics()}"

    print(f"train_llama run {run_id} succeeded in {time.monotonic() - started:.0f}s: {summary}")
