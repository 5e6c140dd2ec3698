"""Faults on Airflow itself under a training group: the triggerer restarted while the train task is
deferred, the scheduler restarted while the group trains, the metadata database unavailable for 30 s.

Each trial starts a real Airflow of its own (``loadlab.cluster``: api-server, scheduler, dag-processor and
triggerer as separate processes, LocalExecutor, Postgres when this machine can start it, else sqlite) and
triggers one train_llama run (local backend, debug flavour, one process, steps slowed to 0.3 s so the fault
lands mid-training). Expected outcome, for each: the run completes; the group is neither relaunched nor
duplicated (one training group at any time, 0 relaunches, 0 preemptions); no step is lost. For the
database fault a task retry is allowed, never a second group training beside the first.

The checkpoints go to the job's own directory in that Airflow home (a run may write only under
``[dtrain] storage_roots``), not to the ``ckpt`` path faults.py hands over; ``ckpt`` is left unused.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import psutil

from airflow_dtrain.launchers.local_processes import GROUP_DIR_ENV
from trainer.elastic.workers import rank_of
from loadlab.checks import checkpoint_dir
from loadlab.cluster import Cluster
from loadlab.database import Database
from loadlab.runs import TRAIN, Run, dags_folder, observe, trigger

from .checkpoints import row

STEPS = 40
SLOW_STEPS = {"DTRAIN_TEST_STEP_SLEEP": "0.3", "DTRAIN_FAULTS": "trainer.testing.faults:from_env"}
DB_DOWN_S = 30.0


def _progress(cluster: Cluster, run: Run) -> dict:
    from trainer.checkpoint.directory import CheckpointDir

    try:
        return CheckpointDir(checkpoint_dir(cluster.home, run)).progress()
    except (OSError, ValueError):
        return {}


def _train_state(cluster: Cluster, run: Run) -> str:
    """The state of the train task the budget chose (train_spot or train_on_demand: the other is skipped)."""
    states = []
    for task in ("train_spot", "train_on_demand"):
        got = cluster.get(f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}/taskInstances/{task}") or {}
        states.append(got.get("state") or "")
    return next((s for s in states if s not in ("", "skipped", "scheduled", "none")), "")


def sample_groups(groups: Path, samples: list[set], stop: threading.Event) -> None:
    """Every 0.2 s until ``stop``: the groups of this Airflow (their processes tagged with a directory
    under ``groups``) that have a training rank alive."""
    where = str(groups.resolve())
    while not stop.is_set():
        alive = set()
        for proc in psutil.process_iter():
            try:
                env = proc.environ()
                if env.get(GROUP_DIR_ENV, "").startswith(where) and rank_of(proc.pid) is not None:
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        alive.add(env.get("DTRAIN_GROUP_NAME"))
            except (psutil.Error, OSError):
                continue
        samples.append(alive)
        time.sleep(0.2)


def _until(what: str, cluster: Cluster, run: Run, probe, timeout: float = 600) -> None:
    """Wait for ``probe()``; RuntimeError when the run ended or ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    while not probe():
        if observe(cluster, run) or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: never happened (run {run.state or 'still running'})")
        time.sleep(1)


def _wait_end(cluster: Cluster, run: Run, timeout: float = 900) -> None:
    """Until the run ended (``observe`` then holds its state and summaries)."""
    deadline = time.monotonic() + timeout
    while not observe(cluster, run):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not end in {timeout:.0f} s (state {run.state or 'none'})")
        time.sleep(2)


def _trial(rng, work, fault, name: str):
    """One run under ``fault(cluster, db, run)`` (called once the group trains at a random step): the
    faults table's row."""
    home = work / f"airflow-{name}-{uuid.uuid4().hex[:6]}"
    home.mkdir(parents=True)
    db = Database(home)
    cluster = Cluster(home, db, dags_folder(home, max_active_runs=2), SLOW_STEPS)
    run = Run(
        "train_llama", f"fault_{name}_{uuid.uuid4().hex[:6]}", {**TRAIN, "job": name, "steps": STEPS}, name
    )
    samples: list[set] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_groups, args=(home / "groups", samples, stop), daemon=True)
    k = rng.randint(8, STEPS - 15)
    try:
        cluster.migrate()
        cluster.start()
        cluster.wait_healthy()
        dag = cluster.wait_parsed("train_llama")["train_llama"]
        sampler.start()
        trigger(cluster, run, dag.get("next_dagrun_logical_date"))
        cluster.http.patch("/api/v2/dags/train_llama", json={"is_paused": False})
        _until(f"step {k}", cluster, run, lambda: _progress(cluster, run).get("step", 0) >= k)
        what = fault(cluster, db, run)
        _wait_end(cluster, run)
    except (RuntimeError, OSError) as err:
        return row(note=f"{name}: {err}"[:2000])
    finally:
        stop.set()
        cluster.stop()
        db.stop()
    summary = run.summaries[0] if run.summaries else {}
    writers = max((len(s) for s in samples), default=0)
    finished = run.state == "success" and summary.get("final_step") == STEPS
    groups = summary.get("relaunches"), summary.get("preemptions")
    shutil.rmtree(home, ignore_errors=True)
    held = finished and groups == (0, 0) and writers == 1
    return row(
        finished=held,
        held=held,
        steps_lost=_lost(summary),
        writers=writers,
        note=f"{what} at step >= {k} ({db.kind}): run {run.state}, final step {summary.get('final_step')}, "
        f"relaunches/preemptions {groups}",
    )


def _lost(summary: dict) -> int | None:
    return summary.get("steps_lost") if summary else None


def _restart_triggerer(cluster: Cluster, db: Database, run: Run) -> str:
    _until("the train task deferred", cluster, run, lambda: _train_state(cluster, run) == "deferred")
    cluster.restart("triggerer", down_s=5)
    return "triggerer restarted while the train task deferred"


def _restart_scheduler(cluster: Cluster, db: Database, run: Run) -> str:
    cluster.restart("scheduler", down_s=5)
    return "scheduler restarted"


def _database_down(cluster: Cluster, db: Database, run: Run) -> str:
    """The database away for DB_DOWN_S. A component that exits meanwhile (the scheduler does, on its
    first failed query) is started again once the database is back, as systemd or a Deployment would:
    the note names it."""
    db.stop_for(DB_DOWN_S)
    time.sleep(15)  # the components notice the outage at their next query
    died = [name for name, proc in list(cluster.procs.items()) if proc.poll() is not None]
    for name in died:
        cluster.restart(name)
    return f"metadata database unavailable {DB_DOWN_S:.0f} s (exited, restarted: {died or 'none'})"


def f_triggerer_restart(rng, ckpt, work):
    return _trial(rng, work, _restart_triggerer, "triggerer")


def f_scheduler_restart(rng, ckpt, work):
    return _trial(rng, work, _restart_scheduler, "scheduler")


def f_database_down(rng, ckpt, work):
    return _trial(rng, work, _database_down, "database")
