"""Job directories as a training run leaves them (progress, spend files, committed checkpoints, a registry
entry), and their job index entries, written directly: for the Training jobs pages' tests and their
benchmark (benchmarks/ui_jobs.py), which need many jobs, or broken ones, without training any."""

from __future__ import annotations

import json
import time
from pathlib import Path

from airflow_dtrain import jobs_index
from trainer.checkpoint.directory import MANIFEST, PROGRESS, REGISTRY_BEST, step_dir_name


def _progress(
    ckpt: Path, *, state: str, steps: int, step: int, preempted_at: int | None, saved: tuple
) -> None:
    now = time.time()
    events = [{"kind": "checkpoint", "step": s, "time": now - 600 + s} for s in saved]
    if preempted_at is not None:
        events += [{"kind": "preempted", "step": preempted_at, "time": now - 500},
                   {"kind": "relaunch", "step": preempted_at, "time": now - 480}]  # fmt: skip
    history = [[s, 5.0 - 3.0 * s / steps, 3e-4, now - 600 + s, 1000.0 + s] for s in range(1, step + 1, 3)]
    progress = {
        "status": "completed" if state == "finished" else "running", "step": step, "steps": steps,
        "loss": 2.0, "steps_lost": 0, "checkpoint_step": saved[-1] if saved else None, "events": events,
        "history": history, "updated_at": now,
    }  # fmt: skip
    (ckpt / PROGRESS).write_text(json.dumps(progress))


def _spend(ckpt: Path, job: str, dollars: float) -> None:
    """Two attempts of 2 nodes, 280 s billed each, ``dollars`` between them."""
    (ckpt / "spend").mkdir()
    for i in range(2):
        entry = {
            "attempt": f"{job}-r{i}", "capacity": "spot", "nodes": 2, "price_per_node_hour": 1.5,
            "launched_at": time.time() - 600 + 300 * i, "billed_s": 280.0, "node_hours": 0.1,
            "gpu_hours": 0.1,
            "dollars": dollars / 2, "ended": True,
        }  # fmt: skip
        (ckpt / "spend" / f"{job}-r{i}.json").write_text(json.dumps(entry))


def _checkpoints(ckpt: Path, saved: tuple) -> None:
    for s in saved:
        step_dir = ckpt / step_dir_name(s)
        step_dir.mkdir()
        manifest = {"step": s, "world_size": 2, "flavor": "tiny", "config_hash": "x", "files": {},
                    "tokens_seen": s * 512, "wall_time_s": float(s)}  # fmt: skip
        (step_dir / MANIFEST).write_text(json.dumps(manifest))


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
    ckpt, registry = root / "ckpt" / job, root / "registry" / job
    ckpt.mkdir(parents=True)
    _progress(ckpt, state=state, steps=steps, step=step, preempted_at=preempted_at, saved=checkpoints)
    _spend(ckpt, job, dollars)
    _checkpoints(ckpt, checkpoints)
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
