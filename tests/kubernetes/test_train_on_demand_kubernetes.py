"""train_llama's ``train_on_demand`` task on the kubernetes backend, against the fake API server.

The task is the DAG file's own (``train("on_demand", ...)``), rendered as a run with
``backend=kubernetes`` renders it, and launched on the fake cluster; the assertions are on
what ``kubectl get pods -o yaml`` and the task's result would show.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_dtrain import FSDPTrainOperator
from tests.conftest import REPO, RecordingTI
from tests.kubernetes.conftest import Background

STEPS = 60  # the DAG's default
ON_DEMAND_PRICE = 3.5
ON_DEMAND_NODES = {
    ("karpenter.sh/capacity-type", "on-demand"),
    ("eks.amazonaws.com/capacityType", "ON_DEMAND"),
}


class BudgetTI(RecordingTI):
    """The task instance, with the budget task's decision to pull (the on-demand offer's price) and the
    prepare_data task's dataset."""

    def xcom_pull(self, task_ids: str | None = None, key: str | None = None) -> Any:
        if (task_ids, key) == ("prepare_data", None):
            return "builtin"  # what prepare_data returns for the default dataset
        assert (task_ids, key) == ("budget", "decision")
        return {"offer": {"on_demand_price": ON_DEMAND_PRICE}}


def _train_on_demand(tmp_path: Path, ti: RecordingTI, monkeypatch) -> FSDPTrainOperator:
    """dags/train_llama.py's train_on_demand, its templates rendered for backend=kubernetes; its pods as
    whoever deploys the DAG sets them ([dtrain] kubernetes)."""
    monkeypatch.setenv(
        "AIRFLOW__DTRAIN__KUBERNETES",
        json.dumps(
            {
                "image": "ghcr.io/acme/dtrain:test",
                "volumes": [
                    {"claim": "checkpoints", "mount_path": str(tmp_path)}
                ],  # the worker mounts it too (tmp dir)
            }
        ),
    )
    loader = importlib.util.spec_from_file_location(
        "train_llama_under_test", REPO / "dags" / "train_llama.py"
    )
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    task = module.dag.get_task("train_on_demand")
    params = {
        **module.dag.params.dump(),
        "backend": "kubernetes",
        "checkpoint_uri": str(tmp_path / "ckpt"),  # on the PVC
        "kubernetes": {},
    }
    task.render_template_fields({"params": params, "run_id": ti.run_id, "ti": ti})
    task.poll_interval = 0.05  # the DAG's 1 s, shortened for the test
    return task


def _wait(predicate, what: str, task: Background, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if task.done:  # it ended before: its error says why
            task.result()
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _node_selection(pod: dict[str, Any]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(the node labels the pod requires, ORed; the capacity taints it tolerates)."""
    node_affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms = (node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    required = set()
    for term in terms:
        [expression] = term["matchExpressions"]
        assert expression["operator"] == "In"
        required |= {(expression["key"], value) for value in expression["values"]}
    tolerated = {(t["key"], t.get("value")) for t in pod["spec"].get("tolerations") or []}
    return required, tolerated


def _finish(fake, name: str, ckpt: Path, nodes: int, steps: int) -> None:
    """The trainer's last progress.json, then every pod exits 0."""
    progress = {
        "status": "completed",
        "step": steps,
        "steps": steps,
        "loss": 2.5,
        "tokens_seen": steps * 1024,
        "latest_checkpoint": str(ckpt / f"step-{steps:08d}"),
        "steps_lost": 0,
        "wall_time_s": 1.0,
    }
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "progress.json").write_text(json.dumps(progress))
    for index in range(nodes):
        fake.exit(name, index, 0)


def test_train_on_demand_runs_its_pods_on_on_demand_nodes_only(fake, tmp_path, monkeypatch):
    ti = BudgetTI(dag_id="train_llama", run_id="manual__on-demand", task_id="train_on_demand")
    op = _train_on_demand(tmp_path, ti, monkeypatch)
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group", task)

    spec = op.job_spec()
    nodes = spec.num_nodes
    assert nodes == 2 and spec.train.steps == STEPS
    for index in range(nodes):
        required, tolerated = _node_selection(fake.pod(name, index))
        assert required == ON_DEMAND_NODES, f"pod {index} may land on {required}"
        assert ON_DEMAND_NODES <= tolerated
    # the trainer's ledger bills the on-demand price to the on_demand bucket
    config = json.loads(fake.get("configmaps", f"{name}-config")["data"]["train_config.json"])
    cost = {k: config["cost"][k] for k in ("capacity_type", "price_per_node_hour", "gpus_per_node")}
    assert cost == {"capacity_type": "on_demand", "price_per_node_hour": ON_DEMAND_PRICE, "gpus_per_node": 0}

    fake.run(name)
    _finish(fake, name, tmp_path / "ckpt", nodes, STEPS)
    summary = task.result()
    assert summary["final_step"] == STEPS and summary["group"] == name


def test_a_gpu_groups_summary_counts_gpu_hours(fake, tmp_path, monkeypatch):
    """GPU nodes (the DAG has no param for them: set on the rendered task): the trainer's config
    carries resources.gpus_per_node as cost.gpus_per_node, so its ledger counts GPU-hours.

    The fake runs no trainer: the test plays rank 0 with the trainer's own CostLedger, built
    from the config the pods mount, and writes the manifest fields the trainer writes.
    """
    from trainer.config.job_config import TrainConfig
    from trainer.money.ledger import CostLedger

    ti = BudgetTI(dag_id="train_llama", run_id="manual__gpus", task_id="train_on_demand")
    op = _train_on_demand(tmp_path, ti, monkeypatch)
    op.procs_per_node, op.node_resources = 2, {"gpus_per_node": 2}
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group", task)
    pod = fake.pod(name, 0)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert _node_selection(pod)[0] == ON_DEMAND_NODES

    cfg = TrainConfig.from_dict(
        json.loads(fake.get("configmaps", f"{name}-config")["data"]["train_config.json"])
    )
    assert cfg.cost.gpus_per_node == 2
    fake.run(name)
    ledger = CostLedger(
        price_per_node_hour=cfg.cost.price_per_node_hour,
        capacity_type=cfg.cost.capacity_type,
        gpus_per_node=cfg.cost.gpus_per_node,
        nodes=2,
    )  # as trainer/train.py builds it
    time.sleep(0.2)  # some training
    step_dir = tmp_path / "ckpt" / f"step-{STEPS:08d}"
    step_dir.mkdir(parents=True)
    (step_dir / "manifest.json").write_text(
        json.dumps({"step": STEPS, "step_time_s": 0.01, "cost": ledger.snapshot()})
    )
    _finish(fake, name, tmp_path / "ckpt", 2, STEPS)

    summary = task.result()
    assert summary["gpu_hours"] > 0
    # 2 nodes x 2 GPUs: GPU-hours are twice the node-hours, billed on demand
    on_demand = json.loads((step_dir / "manifest.json").read_text())["cost"]["on_demand"]
    assert on_demand["node_hours"] > 0
    assert on_demand["gpu_hours"] == pytest.approx(
        on_demand["node_hours"] * 2, abs=2e-9
    )  # each rounded to 1e-9
    # The job is billed from the group's launch to the moment its end was seen (the spend file the
    # session opened and closed), which covers more than the trainer's own ledger in the manifest.
    from trainer.checkpoint.directory import CheckpointDir

    spend = CheckpointDir(str(tmp_path / "ckpt")).spend()
    assert list(spend.attempts) == [name] and spend.attempts[name]["ended"]
    assert summary["dollars"] == pytest.approx(spend.total_dollars, abs=2e-9)
    assert summary["dollars"] >= on_demand["dollars"] > 0
    assert summary["gpu_hours"] == pytest.approx(spend.by_capacity["on_demand"]["node_hours"] * 2, abs=4e-9)
