"""A real Airflow started component by component (api-server, scheduler, dag-processor, triggerer), each a
process group of its own in one throwaway Airflow home, so that one of them can be stopped and started
again while the others (and the pod groups) run on: what ``airflow standalone`` cannot do.

``Cluster`` is tests/airflow_server.py's ``Airflow`` (its environment: LocalExecutor, deferrable operators,
the api-server on a free port with the workers' execution API there; its ``cli``, ``wait_for`` and the way a
process group is stopped), plus the database of ``loadlab.database``, a statsd target and a DAGs folder of
the load test's own. Where a test fails with AssertionError, it raises RuntimeError.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from tests.airflow_server import (
    Airflow,
    airflow_environment,
    kill_all,
    processes_of,
    stop_process_group,
    tail,
    wait_for,
)

from .database import Database

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class Cluster(Airflow):
    """Airflow's components in ``work/airflow``; ``procs`` holds the running ones by name. ``proc`` (the
    tests' one ``airflow standalone``) stays None: ``wait_for`` goes on while a component is down (the load
    test restarts them)."""

    failure = RuntimeError

    def __init__(self, work: Path, db: Database, dags: Path, extra_env: dict | None = None) -> None:
        self.work, self.db, self.dags, self.extra_env = work, db, dags, extra_env or {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts: dict[str, int] = {}
        super().__init__(work, command=COMPONENTS)

    def _environment(self) -> dict[str, str]:
        """Every component's environment: the tests' (nothing of the caller's own Airflow set-up leaks in), on
        the load test's database, with more room for tasks and the repository and the database's driver on
        ``PYTHONPATH``."""
        env = airflow_environment(
            self.home,
            self.port,
            state_dir=self.work / "groups",
            data_dir=self.work / "data",
            dags=self.dags,
            db_url=self.db.url,
            parallelism=4,
        )
        repo = str(Path(__file__).resolve().parents[2])
        pythonpath = (repo, *self.db.pythonpath, os.environ.get("PYTHONPATH", ""))
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p),
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "64",
                **self.extra_env,
            }
        )
        return env

    # -- lifecycle ------------------------------------------------------------------------------
    def migrate(self) -> None:
        """``airflow db migrate``: the components do not create their database themselves."""
        self.cli("db", "migrate", timeout=600)

    def start(self, *names: str) -> None:
        for name in names or COMPONENTS:
            self.procs[name] = self.popen((name,), self.work / f"{name}.log", "ab")

    def stop_component(self, name: str, grace_s: float = 60) -> int | None:
        """SIGTERM to the component (as systemd or a pod's stop would: it shuts its executor down, letting
        running tasks end), SIGKILL to its process group after ``grace_s``; its exit status."""
        proc = self.procs.pop(name, None)
        return None if proc is None else stop_process_group(proc, grace_s, leader_first=True)

    def restart(self, name: str, down_s: float = 0.0) -> int | None:
        """Stop ``name``, wait ``down_s``, start it again: its exit status."""
        rc = self.stop_component(name)
        time.sleep(down_s)
        self.start(name)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        return rc

    def stop(self) -> None:
        self.http.close()
        for name in list(self.procs):
            self.stop_component(name, grace_s=15)
        kill_all(self.processes)  # the groups' supervisors, agents and ranks, LocalExecutor workers

    def processes(self) -> list[psutil.Process]:
        """Every live process of this Airflow home: components, workers and the pod groups they started
        (by ``AIRFLOW_HOME`` in their environment, and the components' trees: the api-server's process
        title overwrites what /proc shows of its environment)."""
        found = {proc.pid: proc for proc in processes_of(self.home)}
        for popen in self.procs.values():
            try:
                root = psutil.Process(popen.pid)
                found.update({p.pid: p for p in [root, *root.children(recursive=True)]})
            except psutil.Error:
                continue
        return list(found.values())

    # -- talking to it --------------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> dict | None:
        """The JSON of a 200 answer, else None (the api-server restarting, a run not there yet)."""
        response = super().get(path, **params)
        return response.json() if response is not None and response.status_code == 200 else None

    def post(self, path: str, body: dict) -> dict:
        response = self.http.post(path, json=body)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:2000]}")
        return response.json()

    def wait_healthy(self, timeout: float = 300) -> None:
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")

        def healthy() -> bool:
            health = self.get("/api/v2/monitor/health") or {}
            return all((health.get(c) or {}).get("status") == "healthy" for c in parts)

        wait_for("every component healthy", self, timeout, healthy)

    def wait_parsed(self, *dag_ids: str, timeout: float = 300) -> dict[str, dict]:
        """Each DAG as the api-server knows it, once the dag-processor has parsed it."""
        return {
            d: wait_for(f"{d} parsed", self, timeout, lambda d=d: self.get(f"/api/v2/dags/{d}"))
            for d in dag_ids
        }

    def diagnostics(self, lines: int = 40) -> str:
        """The last ``lines`` of each component's log."""
        logs = [self.work / f"{name}.log" for name in COMPONENTS]
        return "\n".join(f"--- {path} ---\n{tail(path, lines)}" for path in logs if path.exists())
