"""OpenLineage: with the OpenLineage provider installed, a training task's lineage names the data and the
model it started from as inputs and its checkpoints as output; without the provider nothing is needed."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from airflow_dtrain.lineage import dataset_name

RUN_ID = "manual__2026-05-01T09:30:00+00:00"


def test_dataset_names_follow_openlineage_naming():
    assert dataset_name("s3://ml-data/stores/fineweb-llama3/") == ("s3://ml-data", "stores/fineweb-llama3")
    assert dataset_name("/mnt/ckpt/demo") == ("file", "/mnt/ckpt/demo")
    assert dataset_name("file:///mnt/ckpt/demo/") == ("file", "/mnt/ckpt/demo")


def test_the_operator_imports_nothing_of_openlineage():
    # (Airflow's provider discovery imports each provider's get_provider_info: that much is Airflow's own)
    code = ("import sys, airflow.sdk; before = {m for m in sys.modules if 'openlineage' in m}\n"
            "import airflow_dtrain.operators.fsdp_train\n"
            "print(sorted({m for m in sys.modules if 'openlineage' in m} - before))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]"


def _extract(op):
    """What the OpenLineage listener does when a task succeeds: its extractor manager on the task."""
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    ti = types.SimpleNamespace(
        dag_id=op.dag_id, run_id=RUN_ID, task_id=op.task_id, map_index=-1, try_number=1
    )
    return ExtractorManager().extract_metadata(
        dagrun=types.SimpleNamespace(run_id=RUN_ID), task=op, task_instance_state=TaskInstanceState.SUCCESS,
        task_instance=ti,
    )  # fmt: skip


def test_a_training_task_has_its_data_and_model_in_and_its_checkpoints_out(tmp_path):
    pytest.importorskip(
        "airflow.providers.openlineage",
        reason="the OpenLineage provider is not installed "
        "(pip install apache-airflow-providers-openlineage: the test extra has it)",
    )
    from airflow.sdk import DAG

    from airflow_dtrain import FSDPTrainOperator

    store, model = tmp_path / "stores" / "fineweb", tmp_path / "hf" / "llama-3.2-1b"
    with DAG(dag_id="lineage_demo", schedule=None):
        op = FSDPTrainOperator(
            task_id="train",
            dataset=str(store),
            init_from=str(model),
            checkpoint_uri="s3://ml-ckpt/jobs/demo",
            backend="kubernetes",
            kubernetes={"image": "ghcr.io/acme/dtrain:1"},
            local_state_dir=str(tmp_path),
        )
    lineage = _extract(op)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("file", str(store)), ("file", str(model))]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("s3://ml-ckpt", "jobs/demo")]


def test_the_builtin_corpus_is_no_input_and_a_default_checkpoint_directory_is_the_output(tmp_path):
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is not installed")
    from airflow.sdk import DAG

    from airflow_dtrain import FSDPTrainOperator
    from airflow_dtrain.job.naming import group_base_name

    with DAG(dag_id="lineage_demo", schedule=None):
        op = FSDPTrainOperator(task_id="train", local_state_dir=str(tmp_path / "groups"))
    lineage = _extract(op)
    assert lineage.inputs == []
    base = group_base_name("lineage_demo", RUN_ID, "train", -1)
    assert [(d.namespace, d.name) for d in lineage.outputs] == [
        ("file", str(tmp_path / "checkpoints" / base))
    ]
