from __future__ import annotations

import copy
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag

from tests.conftest import REPO


class FreshRuns:
    """A parsed DAG whose every ``test()`` run starts from the params the DAG declares.

    Airflow's ``process_params`` resolves a run's conf into the task's own ``Param`` objects
    (``ParamsDict.update`` calls ``Param.resolve``, which keeps the value), so after
    ``dag.test(run_conf={"steps": 7})`` the next ``dag.test()`` of the same DAG object runs 7 steps
    too. A scheduler never shows that (each task runs in a new process from the serialised DAG);
    in a test it made a run's outcome depend on the runs before it. Every other attribute is the
    DAG's own."""

    def __init__(self, dag: Any) -> None:
        self._dag = dag
        self._declared = {key: _values(params) for key, params in _params_of(dag)}

    def reset(self) -> None:
        """Every param of the DAG and of its tasks back to the value the DAG declares."""
        for key, params in _params_of(self._dag):
            for name, value in self._declared[key].items():
                params.get_param(name).value = copy.deepcopy(value)

    def test(self, *args: Any, **kwargs: Any) -> Any:
        """``dag.test()`` from the declared params (``reset`` first)."""
        self.reset()
        return self._dag.test(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dag, name)


def _params_of(dag: Any):
    """(key, ParamsDict) of the DAG and of each of its tasks: the objects a run's conf is written into."""
    yield None, dag.params
    for task_id, task in dag.task_dict.items():
        if task.params is not None:
            yield task_id, task.params


def _values(params: Any) -> dict[str, Any]:
    return {name: copy.deepcopy(params.get_param(name).value) for name in params}


@pytest.fixture
def dags(airflow_home):
    """The repository's DAGs, parsed by a real DagBag in the test's AIRFLOW_HOME; each run of one starts
    from its declared params (``FreshRuns``)."""
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return {dag_id: FreshRuns(dag) for dag_id, dag in bag.dags.items()}
