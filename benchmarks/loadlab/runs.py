"""The runs a load test gives Airflow: its DAGs folder, each run's configuration, triggering them through the
REST API, and what each run's end looked like (state, timings, the train tasks' summaries)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
PRICE = 36.0  # $/node-hour: a cent a second, so "to the cent" is a check on seconds
TRAIN = {  # small enough for 8 at once on 2 cores: the debug flavour, one process, few steps
    "flavor": "debug",
    "num_nodes": 1,
    "procs_per_node": 1,
    "seq_len": 32,
    "global_batch_size": 4,
    "micro_batch_size": 4,
    "checkpoint_every": 5,
    "simulate_preemption_at_step": 0,
    "local_spot_price": PRICE,
    "local_on_demand_price": PRICE,
    "max_price": PRICE,
    "budget_usd": 50.0,
    "max_preemptions": 10,
}
SWEEP = {
    "flavor": "debug",
    "num_nodes": 1,
    "procs_per_node": 1,
    "seq_len": 32,
    "global_batch_size": 4,
    "micro_batch_size": 4,
    "price_per_hour": PRICE,
    "budget_usd": 50.0,
    "learning_rates": [1e-3, 3e-3],
}
TRAIN_TASKS = ("train_spot", "train_on_demand", "train")


def dags_folder(work: Path, max_active_runs: int) -> Path:
    """The bundled train_llama and sweep_llama, train_llama allowing ``max_active_runs`` runs at once (the
    bundled DAG allows one: its one daily job). Nothing else differs: the file is copied, one literal
    changed."""
    folder = work / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    text = (REPO / "dags" / "train_llama.py").read_text()
    if "max_active_runs=1," not in text:
        raise RuntimeError("dags/train_llama.py: no `max_active_runs=1,` to raise for the load test")
    (folder / "train_llama.py").write_text(
        text.replace("max_active_runs=1,", f"max_active_runs={max_active_runs},")
    )
    (folder / "sweep_llama.py").write_text((REPO / "dags" / "sweep_llama.py").read_text())
    return folder


@dataclass
class Run:
    """One DAG run the load test triggered, and what became of it."""

    dag_id: str
    run_id: str
    conf: dict
    job: str
    triggered_at: float = 0.0
    state: str = ""
    first_task_at: float | None = None
    ended_at: float | None = None
    summaries: list[dict] = field(default_factory=list)
    triggering_user_name: str | None = None
    """Who triggered it (the REST API's): a run acts for that user, and its default directories say so."""


def plan(train_runs: int, sweeps: int, steps: int) -> list[Run]:
    """``train_runs`` train_llama runs of jobs of their own, and ``sweeps`` sweep_llama runs."""
    tag = uuid.uuid4().hex[:6]
    runs = [
        Run("train_llama", f"load_{tag}_{i}", {**TRAIN, "job": f"load-j{i}", "steps": steps}, f"load-j{i}")
        for i in range(train_runs)
    ]
    runs += [
        Run("sweep_llama", f"sweep_{tag}_{i}", {**SWEEP, "steps": steps}, f"sweep-{i}") for i in range(sweeps)
    ]
    return runs


def trigger(cluster: Cluster, run: Run, logical_date: str | None) -> None:
    """POST a dagRun. The first train_llama run takes the DAG's next logical date: the scheduler then
    creates no scheduled run of its own (with the DAG's default params) when the DAG is unpaused."""
    run.triggered_at = time.time()
    cluster.post(f"/api/v2/dags/{run.dag_id}/dagRuns",
                 {"dag_run_id": run.run_id, "logical_date": logical_date, "conf": run.conf})  # fmt: skip


def trigger_all(cluster: Cluster, runs: list[Run], dags: dict[str, dict]) -> None:
    first = dags["train_llama"].get("next_dagrun_logical_date")
    for i, run in enumerate(runs):
        trigger(cluster, run, first if i == 0 and run.dag_id == "train_llama" else None)
    for dag_id in {r.dag_id for r in runs}:
        cluster.http.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False})


def _stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def observe(cluster: Cluster, run: Run) -> bool:
    """Refresh ``run`` from the REST API; True once it has ended."""
    got = cluster.get(f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}")
    if got is None:
        return False
    run.state = got.get("state") or ""
    run.triggering_user_name = got.get("triggering_user_name")
    if run.first_task_at is None:
        tis = cluster.get(f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}/taskInstances") or {}
        starts = [_stamp(t.get("start_date")) for t in tis.get("task_instances", [])]
        run.first_task_at = min((s for s in starts if s), default=None)
    if run.state in ("success", "failed"):
        run.ended_at = _stamp(got.get("end_date")) or time.time()
        run.summaries = summaries(cluster, run)
        return True
    return False


def _ti_path(run: Run) -> str:
    return f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}/taskInstances"


def summaries(cluster: Cluster, run: Run) -> list[dict]:
    """The train tasks' summaries (XCom return_value), every mapped member of a sweep's."""
    tis = cluster.get(f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}/taskInstances", limit=100) or {}
    out = []
    for ti in tis.get("task_instances", []):
        if ti.get("task_id") not in TRAIN_TASKS or ti.get("state") != "success":
            continue
        path = f"{_ti_path(run)}/{ti['task_id']}/xcomEntries/return_value"
        got = cluster.get(path, map_index=ti.get("map_index", -1)) or {}
        value = got.get("value")
        if isinstance(value, str):
            import json

            value = json.loads(value)
        if isinstance(value, dict):
            out.append({**value, "task_id": ti["task_id"], "map_index": ti.get("map_index", -1)})
    return out


def wait_all(cluster: Cluster, runs: list[Run], timeout: float, on_tick=None) -> None:
    """Poll every run until all ended (or ``timeout``); ``on_tick()`` between polls (the faults' clock)."""
    deadline = time.monotonic() + timeout
    pending = list(runs)
    while pending and time.monotonic() < deadline:
        pending = [r for r in pending if not observe(cluster, r)]
        if on_tick is not None:
            on_tick()
        time.sleep(3)
