"""Job directories as a training run leaves them (progress, spend files, committed checkpoints, a registry
entry), and their job index entries, written directly: for the Training jobs pages' tests and their
benchmark (benchmarks/ui_jobs.py), which need many jobs, or broken ones, without training any."""

from __future__ import annotations

import json
import time
from pathlib import Path

from airflow_dtrain import jobs_index
from trainer.checkpoint_dir import MANIFEST, PROGRESS, REGISTRY_BEST, step_dir_name


def write_job(
    root: Path,
    job: str,
    *,
    dag_id: str = "train_llama",
    owner: str = "user:alice",
    state: str = "finished",
    steps: int = 60,
    step: int = 60,
    preempted_at: int | None = 30,
    budget_usd: float = 5.0,
    dollars: float = 1.25,
    checkpoints: tuple[int, ...] = (30, 60),
) -> Path:
    """One job under ``root`` (``root/ckpt/<job>``, ``root/registry/<job>``) and its index entry (the index:
    ``[dtrain] jobs_index``); its checkpoint directory."""
    now = time.time()
    ckpt, registry = root / "ckpt" / job, root / "registry" / job
    ckpt.mkdir(parents=True)
    events = [{"kind": "checkpoint", "step": s, "time": now - 600 + s} for s in checkpoints]
    if preempted_at is not None:
        events += [
            {"kind": "preempted", "step": preempted_at, "time": now - 500},
            {"kind": "relaunch", "step": preempted_at, "time": now - 480},
        ]
    history = [[s, 5.0 - 3.0 * s / steps, 3e-4, now - 600 + s, 1000.0 + s] for s in range(1, step + 1, 3)]
    (ckpt / PROGRESS).write_text(
        json.dumps(
            {
                "status": "completed" if state == "finished" else "running",
                "step": step,
                "steps": steps,
                "loss": 2.0,
                "steps_lost": 0,
                "checkpoint_step": checkpoints[-1] if checkpoints else None,
                "events": events,
                "history": history,
                "updated_at": now,
            }
        )
    )
    (ckpt / "spend").mkdir()
    for i, (nodes, usd) in enumerate(((2, dollars / 2), (2, dollars / 2))):
        (ckpt / "spend" / f"{job}-r{i}.json").write_text(
            json.dumps(
                {
                    "attempt": f"{job}-r{i}",
                    "capacity": "spot",
                    "nodes": nodes,
                    "price_per_node_hour": 1.5,
                    "launched_at": now - 600 + 300 * i,
                    "billed_s": 280.0,
                    "node_hours": 0.1,
                    "gpu_hours": 0.1,
                    "dollars": usd,
                    "ended": True,
                }
            )
        )
    for s in checkpoints:
        step_dir = ckpt / step_dir_name(s)
        step_dir.mkdir()
        (step_dir / MANIFEST).write_text(
            json.dumps(
                {
                    "step": s,
                    "world_size": 2,
                    "flavor": "tiny",
                    "config_hash": "x",
                    "files": {},
                    "tokens_seen": s * 512,
                    "wall_time_s": float(s),
                }
            )
        )
    (registry / "eval-0123456789ab").mkdir(parents=True)
    (registry / "eval-0123456789ab" / REGISTRY_BEST).write_text(json.dumps({"loss": 2.25, "step": 60}))
    jobs_index.record(
        dag_id,
        owner,
        job,
        run=(f"manual__{job}", "train_spot"),
        state=state,
        checkpoint_uri=str(ckpt),
        registry_entry=str(registry),
        steps=steps,
        budget_usd=budget_usd,
        num_nodes=2,
        min_nodes=1,
    )
    return ckpt
