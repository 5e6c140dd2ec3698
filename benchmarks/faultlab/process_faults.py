"""Faults on the processes of a run: signals (SIGTERM to the agent, SIGUSR1 to rank 0) and kill -9
(of a rank, of the agent, of the supervisor followed by a retry)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import psutil

from trainer.elastic.workers import rank_of

from . import runs
from .checkpoints import bitwise_equal, fenced_commits, lease_of, progress, row
from .runs import EVERY, NPROC, STEPS, Run, train_event


def f_sigterm(rng, ckpt, work):
    k = rng.randint(6, STEPS - 6)
    first = Run(ckpt, work)
    first.wait_for(train_event(k))
    first.proc.send_signal(signal.SIGTERM)
    rc1 = first.wait()
    second = Run(ckpt, work)
    rc2 = second.wait()
    pre = first.of("preempted")
    res = second.of("resume")
    lost = pre[0]["step"] - res[0]["from_step"] if pre and res else None
    return row(
        finished=rc1 == 75 and rc2 == 0,
        steps_lost=lost,
        bitwise=bitwise_equal(ckpt, work),
        note=f"SIGTERM after step {k}: exit {rc1}, then {rc2}",
    )


def f_sigusr1(rng, ckpt, work):
    k = rng.randint(6, STEPS - 6)
    run = Run(ckpt, work)
    run.wait_for(train_event(k))
    rank0 = run.workers().get(0)
    if rank0 is not None:
        rank0.send_signal(signal.SIGUSR1)
    rc = run.wait()
    now = [c["step"] for c in run.of("checkpoint") if c.get("reason") == "checkpoint-now"]
    return row(
        finished=rc == 0 and bool(now),
        steps_lost=0,
        bitwise=bitwise_equal(ckpt, work),
        note=f"SIGUSR1 to rank 0 after step {k}: saved step {now}, exit {rc}",
    )


def f_kill_rank(rng, ckpt, work):
    k, rank = rng.randint(6, STEPS - 6), rng.randint(0, NPROC - 1)
    first = Run(ckpt, work)
    first.wait_for(train_event(k))
    victim = first.workers().get(rank)
    if victim is not None:
        victim.kill()
    rc1 = first.wait()
    second = Run(ckpt, work)
    rc2 = second.wait()
    res = second.of("resume")
    return row(
        finished=rc1 == 76 and rc2 == 0,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        note=f"kill -9 rank {rank} after step {k}: exit {rc1}; resumed from "
        f"{res[0]['from_step'] if res else None}",
    )


def f_kill_agent(rng, ckpt, work):
    k = rng.randint(6, STEPS - 6)
    first = Run(ckpt, work)
    first.wait_for(train_event(k))
    workers = list(first.workers().values())
    first.proc.kill()
    rc1 = first.wait()
    _, alive = psutil.wait_procs(workers, timeout=90)  # parent-death SIGTERM: they save and exit
    for p in alive:
        p.kill()
    second = Run(ckpt, work)
    rc2 = second.wait()
    res = second.of("resume")
    return row(
        finished=rc2 == 0 and not alive,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        note=f"kill -9 agent after step {k}: agent {rc1}, orphans exited by themselves: {not alive}; "
        f"resumed from {res[0]['from_step'] if res else None}",
    )


def supervisor_spec(ckpt):
    """The faults job as a JobSpec for the local launcher: the same run as ``Run``'s command."""
    from airflow_dtrain.job.spec import JobSpec

    return JobSpec.from_arguments(
        flavor="debug",
        seq_len=32,
        global_batch_size=8,
        micro_batch_size=4,
        log_every=1,
        steps=STEPS,
        checkpoint_every=EVERY,
        checkpoint_uri=str(ckpt),
        num_nodes=1,
        procs_per_node=NPROC,
        job="faults",
    )


def sample_groups(base: str, samples: list[set], stop: threading.Event) -> None:
    """Every 0.2 s until ``stop``: the set of groups named ``base*`` that have a training process alive."""
    while not stop.is_set():
        alive = set()
        for p in psutil.process_iter():
            try:
                g = p.environ().get("DTRAIN_GROUP_NAME", "")
                if g.startswith(base) and rank_of(p.pid) is not None and p.status() != psutil.STATUS_ZOMBIE:
                    alive.add(g)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        samples.append(alive)
        time.sleep(0.2)


def f_supervisor(rng, ckpt, work):
    from airflow_dtrain.launchers.base import GroupState
    from airflow_dtrain.launchers.local import LocalLauncher

    k = rng.randint(6, STEPS - 10)
    spec = supervisor_spec(ckpt)
    launcher = LocalLauncher(work / f"groups-{uuid.uuid4().hex[:6]}")
    base = f"faults-{runs.BENCH_ID}-{uuid.uuid4().hex[:6]}"  # kill_leftovers ends this run's groups only
    samples: list[set] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_groups, args=(base, samples, stop), daemon=True)
    sampler.start()
    first, second = f"{base}-r0", f"{base}-r1"
    launcher.launch(first, spec)
    deadline = time.monotonic() + 240
    while progress(ckpt).get("step", 0) < k and time.monotonic() < deadline:
        time.sleep(0.2)
    supervisor = json.loads((launcher.state_dir / first / "supervisor.json").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    launcher.launch(second, spec)  # as GroupSession's retry does: waits for the orphans, then starts r1
    deadline = time.monotonic() + 300
    while (
        launcher.status(second).state in (GroupState.PENDING, GroupState.RUNNING)
        and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    state = launcher.status(second).state
    stop.set()
    sampler.join(timeout=5)
    old, new = lease_of(ckpt, first), lease_of(ckpt, second)
    fenced = fenced_commits(ckpt, old.token, new.info["acquired_at"]) if old and new else None
    return row(
        finished=state == GroupState.SUCCEEDED,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        writers=max((len(s) for s in samples), default=0),
        fenced=fenced,
        note=f"kill -9 supervisor at step >= {k}; retry {state.value}; {len(samples)} samples",
    )
