"""train_llama through a real Airflow: dag.test() against the session's sqlite database."""

from __future__ import annotations

import json

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.utils.state import DagRunState, TaskInstanceState

from tests.conftest import REPO

pytestmark = pytest.mark.torchrun


@pytest.fixture
def train_llama(airflow_home):
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.dags["train_llama"]


def test_dag_test_trains_through_a_simulated_preemption(train_llama, tmp_path):
    ckpt = tmp_path / "ckpt"
    run = train_llama.test(
        run_conf={
            "steps": 16,
            "seq_len": 64,
            "global_batch_size": 4,
            "checkpoint_every": 5,
            "simulate_preemption_at_step": 8,
            "checkpoint_uri": str(ckpt),
        }
    )
    assert run.state == DagRunState.SUCCESS
    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == "train"]
    assert ti.state == TaskInstanceState.SUCCESS
    summary = json.loads((ckpt / "summary.json").read_text())
    assert summary["final_step"] == 16
    assert summary["preemptions"] == 1
    assert summary["steps_lost"] == 0
    assert (ckpt / "step-00000016" / "manifest.json").is_file()


def test_bad_trigger_form_input_fails_before_anything_starts(train_llama, tmp_path):
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="num_nodes"):
        train_llama.test(run_conf={"num_nodes": 0, "checkpoint_uri": str(tmp_path / "ckpt")})
    assert not (tmp_path / "ckpt").exists()
