"""Test session set-up: a throwaway Airflow home with sqlite, created before Airflow is imported."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.statsd_listener import StatsdListener

REPO = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="dtrain-airflow-home-"))
# Each pytest process (each xdist worker) has its own home, about 120 MB with its database and corpus: gone
# when the process exits, or every `make test` would leave one behind in the temporary directory.
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_HOME / 'airflow.db'}"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_HOME / 'airflow.db'}"
# One CPU thread per process: the test processes run side by side on few cores (make test: 2 workers on 2),
# and OpenMP threads beyond the cores spin; torch runs several times slower, and the local launcher gives
# every group's processes this value instead of a share of all the cores (airflow_dtrain/launchers/local.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The platform's storage roots of the test session: the temporary directory (every test's tmp_path) and every
# moto bucket. A deployment names its own (the default is $AIRFLOW_HOME/dtrain alone);
# tests/unit/test_trust.py sets narrower ones where refusals are what it checks.
os.environ.setdefault("AIRFLOW__DTRAIN__STORAGE_ROOTS", f"{os.path.realpath(tempfile.gettempdir())},s3://")
# One copy of the built-in corpus for the whole session.
os.environ.setdefault("DTRAIN_DATA_DIR", str(_HOME / "data"))


# Started first: the tests that run longest (a real Airflow, whole DAG runs). make test runs two xdist
# workers in collection order; the browser test, collected last, used to run alone for its last minute with a
# core idle.
_LONGEST_FIRST = (
    "tests/integration/test_scheduler.py",
    "tests/ui/",
    "tests/pipeline/",
    "tests/unit/test_extra_link.py",
)


# `make test-repeat` runs the fast half of the suite three times in a row: every test not marked ``slow``.
# A test is slow when it has one of _SLOW_MARKERS (it starts torchrun, a real Airflow, a browser, or is a
# fault trial) or its module is in _SLOW_MODULES: those whose tests took 0.5 s or more each on average in a
# `--durations=0` run (27 November 2026). The rest, about half of the tests (430 of 864 outside the fault
# trials), took about 35 s in all. A new module is in the fast half until it is listed; see docs/testing.md.
_SLOW_MARKERS = ("torchrun", "scheduler", "browser", "fault_trial")
_SLOW_MODULES = (
    "tests/kubernetes/test_budget_deadline_kubernetes.py",
    "tests/kubernetes/test_checkpoint_now_kubernetes.py",
    "tests/kubernetes/test_elastic_kubernetes.py",
    "tests/kubernetes/test_fsdp_train_kubernetes.py",
    "tests/kubernetes/test_group_nodes_kubernetes.py",
    "tests/kubernetes/test_launcher.py",
    "tests/kubernetes/test_no_var_expansion.py",
    "tests/kubernetes/test_placement_kubernetes.py",
    "tests/kubernetes/test_rbac.py",
    "tests/kubernetes/test_render_cli.py",
    "tests/kubernetes/test_train_on_demand_kubernetes.py",
    "tests/pipeline/test_check_conf.py",
    "tests/pipeline/test_fresh_runs.py",
    "tests/pipeline/test_trust_between_jobs.py",
    "tests/spot/test_imports.py",
    "tests/spot/test_price_list_api.py",
    "tests/spot/test_queue_allowlist.py",
    "tests/spot/test_spot_billing.py",
    "tests/spot/test_spot_cost_benchmark.py",
    "tests/spot/test_spot_interruption_kubernetes.py",
    "tests/spot/test_spot_price_sensor.py",
    "tests/spot/test_spot_studies_benchmark.py",
    "tests/trainer/test_async_checkpoints.py",
    "tests/trainer/test_benchmark_scripts.py",
    "tests/trainer/test_checkpoint_dir.py",
    "tests/trainer/test_checkpoint_durability.py",
    "tests/trainer/test_checkpoint_s3.py",
    "tests/trainer/test_checkpoint_storage.py",
    "tests/trainer/test_chunked_loss.py",
    "tests/trainer/test_events_concurrency.py",
    "tests/trainer/test_export_source.py",
    "tests/trainer/test_forged_checkpoint.py",
    "tests/trainer/test_hf_round_trip.py",
    "tests/trainer/test_init_from.py",
    "tests/trainer/test_prepare_data_task.py",
    "tests/trainer/test_prepare_rows.py",
    "tests/trainer/test_report_nodes.py",
    "tests/trainer/test_single_writer.py",
    "tests/trainer/test_token_store.py",
    "tests/trainer/test_trainer_auto_batch.py",
    "tests/trainer/test_trainer_parallelize.py",
    "tests/trainer/test_trainer_progress.py",
    "tests/trainer/test_trainer_stop_resume.py",
    "tests/trainer/test_trainer_train.py",
    "tests/trainer/test_verified_resume.py",
    "tests/unit/test_architecture.py",
    "tests/unit/test_dag_parse.py",
    "tests/unit/test_deployed_interruption_rate.py",
    "tests/unit/test_lineage.py",
    "tests/unit/test_provider_info.py",
    "tests/unit/test_readme.py",
    "tests/unit/test_readme_examples.py",
    "tests/unit/test_unit_sizes.py",
)


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: not in the fast half that `make test-repeat` repeats (tests/conftest.py, _SLOW_MODULES)",
    )


def is_slow(item) -> bool:
    """Whether ``item`` is in the slow half of the suite (see _SLOW_MODULES)."""
    path = item.nodeid.split("::", 1)[0]
    return path in _SLOW_MODULES or any(item.get_closest_marker(name) for name in _SLOW_MARKERS)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
    items.sort(
        key=lambda item: not item.nodeid.startswith(_LONGEST_FIRST)
    )  # stable: the rest keep their order


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


@pytest.fixture(scope="session")
def moto_endpoint():
    """A moto server (EC2, SQS, S3, ...) in a thread on 127.0.0.1 for the session: its URL. The tests'
    credentials and connection point at it one test at a time (tests/spot/conftest.py ``moto_server``)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


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


@pytest.fixture
def statsd_listener(monkeypatch):
    """A StatsdListener that the provider's orchestration metrics are sent to."""
    from airflow_dtrain import metrics

    listener = StatsdListener()
    monkeypatch.setenv("AIRFLOW__DTRAIN__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__DTRAIN__STATSD_PORT", str(listener.port))
    metrics.reset()
    yield listener
    listener.close()
    metrics.reset()


STEP_SLEEP_ENV = "DTRAIN_TEST_STEP_SLEEP"
"""trainer.testing.faults: seconds that every step of the bundled trainer also sleeps."""
SLOW_STEP_S = "0.3"
TEST_FAULTS = {"DTRAIN_FAULTS": "trainer.testing.faults:from_env"}
"""The environment that switches trainer/testing/faults.py's faults on (its ``activate``)."""


def slow_steps_env(env, seconds: str = SLOW_STEP_S) -> None:
    """Every step of the bundled trainer also sleeps ``seconds``: set through ``env`` (a MonkeyPatch)."""
    for name, value in {STEP_SLEEP_ENV: seconds, **TEST_FAULTS}.items():
        env.setenv(name, value)


@pytest.fixture
def slow_steps(monkeypatch):
    """Every step of the bundled trainer also sleeps 0.3 s, as on a slower machine: for groups that train
    until they are stopped or reach their dollar cap, which would otherwise take every core they can get from
    the tests running beside them for as long as they run."""
    slow_steps_env(monkeypatch)
