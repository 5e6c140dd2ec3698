"""DAG files (and the provider's plugin, which every Airflow component loads) load without errors and
without importing anything heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

_PROBE = r"""
import json, sys, time
t = time.perf_counter()
import airflow_dtrain
from airflow_dtrain import FSDPTrainOperator
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
elapsed = time.perf_counter() - t
import airflow_dtrain.ui.plugin  # what every Airflow component loads: the Training jobs plugin
print(json.dumps({
    "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dag_ids": sorted(bag.dag_ids),
    "heavy": [m for m in ("torch", "boto3", "botocore", "kubernetes", "numpy") if m in sys.modules],
    "seconds": elapsed,
    "parse_seconds": {str(s.file): s.duration.total_seconds() if hasattr(s.duration, "total_seconds") else
    s.duration for s in bag.dagbag_stats},
}))
"""


def _probe() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(REPO / "dags")],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_dagbag_loads_with_no_import_errors_and_nothing_heavy():
    result = _probe()
    assert result["import_errors"] == {}
    assert "train_llama" in result["dag_ids"]
    assert result["heavy"] == [], f"heavy modules imported at parse time: {result['heavy']}"
    # What a user would notice is Airflow giving up on the file (core.dagbag_import_timeout, 30 s by default);
    # how fast it parses on a shared, loaded machine is not a test (nothing heavy is imported: above).
    from airflow.configuration import conf

    timeout = conf.getfloat("core", "dagbag_import_timeout")
    for path, seconds in result["parse_seconds"].items():
        print(f"{path}: parsed in {seconds:.2f}s")
        assert seconds < timeout, (
            f"{path} took {seconds:.2f}s to parse, past core.dagbag_import_timeout={timeout}"
        )


def test_train_llama_has_a_schedule_params_doc_and_tags():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["train_llama"]
    assert dag.schedule is not None or dag.timetable.summary != "None"
    assert dag.doc_md and "train_llama" in dag.doc_md
    assert {"llm", "training"} <= set(dag.tags)
    for name in ("backend", "flavor", "num_nodes", "procs_per_node", "steps", "checkpoint_uri",
                 "simulate_preemption_at_step"):  # fmt: skip
        assert name in dag.params, name
