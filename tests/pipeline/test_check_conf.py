"""``airflow_dtrain.params.check_conf``: the first task a DAG of your own gets from the provider, as the
bundled DAGs do. A run whose conf has a key the DAG does not take, or asks past the author's limits, fails
there by name and nothing after it runs (a real Airflow: ``dag.test()`` on sqlite)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from airflow.sdk import DAG, Param, task
from airflow.utils.state import DagRunState, TaskInstanceState

from airflow_dtrain.params import check_conf


def _own_dag(marker):
    """A DAG of a user's: check_conf with the author's limits, then a task that leaves ``marker``."""
    with DAG(
        dag_id=f"own_{uuid.uuid4().hex[:8]}",
        schedule=None,
        start_date=datetime(2026, 5, 1, tzinfo=timezone.utc),
        params={"steps": Param(10, type="integer"), "num_nodes": Param(1, type="integer")},
    ) as dag:

        @task
        def train() -> None:
            marker.write_text("trained")

        check_conf({"max_steps": 100, "max_nodes": 2}) >> train()
    return dag


def _run(dag, conf: dict, tmp_path):
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    bag = DagBag(dag_folder=str(tmp_path / "no-dags"))
    bag.bag_dag(dag)
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)  # dag.test() runs serialised DAGs only
    run = dag.test(run_conf=conf)
    return run, {ti.task_id: ti.state for ti in run.get_task_instances()}


@pytest.mark.parametrize(
    "conf, named",
    [({"stepz": 10}, "'stepz'"), ({"steps": 500}, "max_steps"), ({"num_nodes": 3}, "max_nodes")],
)
def test_your_dag_refuses_an_unknown_key_or_a_run_past_your_limits_before_it_trains(
    airflow_home, tmp_path, capfd, conf, named
):
    marker = tmp_path / "trained"
    run, states = _run(_own_dag(marker), conf, tmp_path)
    assert run.state == DagRunState.FAILED, states
    assert states["check_conf"] == TaskInstanceState.FAILED
    assert not marker.exists(), "a refused run must train nothing"
    out, err = capfd.readouterr()
    assert named in out + err  # the task's error, in its log, names the key or the limit


def test_your_dag_trains_a_run_within_your_limits(airflow_home, tmp_path):
    marker = tmp_path / "trained"
    run, states = _run(_own_dag(marker), {"steps": 100, "num_nodes": 2}, tmp_path)
    assert run.state == DagRunState.SUCCESS, states
    assert marker.read_text() == "trained"
