"""The ``dags`` fixture: a run's conf does not become the next run's params (tests/pipeline/conftest.py).

Airflow's ``process_params`` writes a run's conf into the task's own ``Param`` objects; without the reset,
a test that runs a DAG twice (or a DAG object shared by two tests) sees the first run's values as the
second run's defaults.
"""

from __future__ import annotations

from airflow.sdk.definitions.param import process_params


def _resolved(dag, conf):
    """The params that the ``train_spot`` task of a run with ``conf`` gets, as the task runner resolves."""
    task = dag.task_dict["train_spot"]
    return process_params(dag, task, conf, suppress_exception=False)


def test_a_runs_conf_is_not_the_next_runs_default(dags):
    train = dags["train_llama"]
    declared = _resolved(train, {})["steps"]

    assert _resolved(train, {"steps": declared + 7})["steps"] == declared + 7
    assert _resolved(train, {})["steps"] == declared + 7  # what Airflow leaves in the DAG object

    train.reset()  # what every dags[...].test() does first
    assert _resolved(train, {})["steps"] == declared
