"""Test session set-up: a throwaway Airflow home with sqlite, created before Airflow is imported."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="dtrain-airflow-home-"))
os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_HOME / 'airflow.db'}"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_HOME / 'airflow.db'}"
# One copy of the built-in corpus for the whole session.
os.environ.setdefault("DTRAIN_DATA_DIR", str(_HOME / "data"))


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home, its sqlite database migrated."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
    )
    return _HOME


class RecordingTI:
    """Stand-in for the task instance in operator tests: ids and the XComs pushed."""

    def __init__(self, dag_id: str = "dag", run_id: str = "run", task_id: str = "train", map_index: int = -1):
        self.dag_id, self.run_id, self.task_id, self.map_index = dag_id, run_id, task_id, map_index
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def run_trigger(trigger, timeout: float = 300.0) -> dict[str, Any]:
    """Run a trigger the way the triggerer does and return its first event's payload."""

    async def first_event():
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first_event(), timeout))
