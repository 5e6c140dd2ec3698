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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow_server import Airflow, json_output as _json_output, wait_for as _wait_for

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
    "seq_len": 32,  # a quarter of the default step: this test is about the scheduler, not the model
}

STARTUP_TIMEOUT_S = 180
DAG_PARSE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 420

pytestmark = pytest.mark.scheduler


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


def _wait_until_healthy(airflow: Airflow) -> None:
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


def _wait_until_parsed(airflow: Airflow) -> dict:
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
    return dag


def _trigger_and_unpause(airflow: Airflow, dag: dict) -> str:
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
    return run_id


def _wait_for_success(airflow: Airflow, run_id: str) -> None:
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


def _assert_the_summary(airflow: Airflow, run_id: str) -> dict:
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
    return summary


def _wait_for_the_publish_run(airflow: Airflow) -> None:
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

    publish_run = _wait_for(
        f"{PUBLISH_DAG_ID} to run on the promoted model", airflow, 180, published, interval=3.0
    )
    assert publish_run["run_type"] == "asset_triggered", publish_run
    # the registry's entry of the job and its evaluation set: <registry>/<job>/<evaluation
    # set>/published/latest, below owners/<owner>/ when the triggering user is not the DAG's owner
    cards = list(
        (airflow.home / "dtrain" / "models" / "train_llama").glob("**/eval-*/published/latest/MODEL_CARD.md")
    )
    assert len(cards) == 1, f"model cards: {cards}\n{airflow.diagnostics()}"


@pytest.mark.timeout(1000)  # above the sum of its own waits, so a slow run fails with its diagnostics
def test_standalone_airflow_runs_train_llama_to_success(airflow: Airflow) -> None:
    started = time.monotonic()
    _wait_until_healthy(airflow)
    dag = _wait_until_parsed(airflow)
    run_id = _trigger_and_unpause(airflow, dag)
    _wait_for_success(airflow, run_id)
    summary = _assert_the_summary(airflow, run_id)
    _wait_for_the_publish_run(airflow)

    print(f"train_llama run {run_id} succeeded in {time.monotonic() - started:.0f}s: {summary}")
