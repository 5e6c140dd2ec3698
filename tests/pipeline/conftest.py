from __future__ import annotations

import pytest
from airflow.dag_processing.dagbag import DagBag

from tests.conftest import REPO


@pytest.fixture
def dags(airflow_home):
    """The repository's DAGs, parsed by a real DagBag in the test's AIRFLOW_HOME."""
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.dags
