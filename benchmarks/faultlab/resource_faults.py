"""Faults of the run's surroundings: a full disk at a save, a spend cap the job cannot fit in, and a
second writer on the same checkpoint directory."""

from __future__ import annotations

import errno  # noqa: F401 - documented: the full-disk fault is ENOSPC
import signal
import time
import uuid

from trainer.testing.faults import activate

from .checkpoints import bitwise_equal, lease_of, manifests, progress, row
from .runs import EVERY, NPROC, PRICE, STEPS, Run, open_spend, train_event


def f_full_disk(rng, ckpt, work):
    from trainer.checkpoint.directory import CheckpointDir
    from trainer.validate import validate_checkpoint

    k, rank = rng.choice(range(2 * EVERY, STEPS, EVERY)), rng.randint(0, NPROC - 1)
    root = CheckpointDir(str(ckpt))
    first = Run(ckpt, work, env=activate({"DTRAIN_TEST_ENOSPC_AT_STEP": f"{k}:{rank}"}))
    rc1 = first.wait()
    err = first.stderr()
    clear = (
        f"checkpoint step {k} could not be written to {root.step_path(k)}" in err
        and "No space left on device" in err
    )
    older = [c.step for c in root.committed()]
    intact = True
    for step in older:
        try:
            validate_checkpoint(root.step_path(step), sample_tensors=None)
        except Exception:  # noqa: BLE001 - reported
            intact = False
    partial_gone = k not in {c.step for c in root.step_dirs()}
    second = Run(ckpt, work)  # "space freed": the same command without the hook
    rc2 = second.wait()
    return row(
        finished=rc1 == 74 and rc2 == 0 and clear,
        steps_lost=progress(ckpt).get("steps_lost"),
        bitwise=bitwise_equal(ckpt, work),
        note=f"ENOSPC at step {k} on rank {rank}: exit {rc1}, clear line {clear}, older {older} "
        f"valid {intact}, partial removed {partial_gone}; resume exit {rc2}",
    )


def f_budget(rng, ckpt, work):
    return budget_trial(rng, ckpt, work)


def budget_trial(rng, ckpt, work, env: dict | None = None, label: str = ""):
    """A run admitted under a cap it cannot fit in (``env``: more of its environment, ``label``: what that
    is, for the note): it must stop at the cap, the spend (billed to its exit by this process's clock)
    within it."""
    from trainer.checkpoint.directory import CheckpointDir
    from trainer.money.bill import billed

    cap = round(
        rng.uniform(14.0, 20.0), 2
    )  # the job needs ~30 s = $30 here: admitted on a 100x too small estimate
    attempt = f"budget-{uuid.uuid4().hex[:6]}"
    root = CheckpointDir(str(ckpt))
    root.storage.makedirs()
    # Opened at the launch, as GroupSession does: the bill runs from the start of the process, not of
    # training. This process's clock: what the run really cost is (its exit - the launch) x price.
    launched = open_spend(root, attempt, cap)
    run = Run(
        ckpt,
        work,
        env={**(env or {}), "DTRAIN_GROUP_NAME": attempt},
        args=[
            "--set",
            f"cost.budget_usd={cap}",
            "--set",
            f"cost.price_per_node_hour={PRICE}",
            "--set",
            "cost.stop_margin_s=3",
        ],
    )
    rc = run.wait()
    true_cost = (time.time() - launched) * PRICE / 3600
    entry = root.spend_entry(attempt)
    root.record_spend(
        attempt, {**billed(entry, until=time.time()), "ended": True}
    )  # closed when its end is seen
    spent = root.spend().total_dollars
    latest = root.latest()
    return row(
        finished="cap" if rc == 77 else rc == 0,
        spend_ratio=spent / cap,
        note=f"{label}cap ${cap}: exit {rc}, spent ${spent:.2f} (billed to the exit), last checkpoint "
        f"{latest.step if latest else None}; by this process's clock ${true_cost:.2f}",
    )


def f_second_writer(rng, ckpt, work):
    return second_writer_trial(rng, ckpt, work)


def second_writer_trial(rng, ckpt, work, envs: tuple[dict, dict] = ({}, {}), skews=(0.0, 0.0), label=""):
    """A writer stalled while a second one takes its directory over: the first must be fenced (exit 78),
    the second finish. ``envs``: more of each one's environment; ``skews``: how far each one's clock is
    off (seconds), which the times they write are corrected by; ``label``: what that is, for the note."""
    k = rng.randint(6, 20)
    first = Run(ckpt, work, env={**envs[0], "DTRAIN_GROUP_NAME": "writer-a"})
    first.wait_for(train_event(k))
    # The first writer stalls (a GC pause, a partitioned node) while a second one starts on the same directory
    # and takes its lease; then the first wakes up and goes on. Without the stall the second one's start-up
    # (imports, rendezvous) can outlast the first's remaining steps, and the two never overlap.
    first.signal_all(signal.SIGSTOP)
    second = Run(ckpt, work, env={**envs[1], "DTRAIN_GROUP_NAME": "writer-b"})
    second.wait_for(lambda e: e.get("event") in ("resume", "train"))
    first.signal_all(signal.SIGCONT)
    rc1, rc2 = first.wait(), second.wait()
    old, new = lease_of(ckpt, "writer-a"), lease_of(ckpt, "writer-b")
    fenced, after = commits_after(ckpt, old, new, skews)
    res = second.of("resume")
    return row(
        finished=rc1 == 78 and rc2 == 0,
        bitwise=bitwise_equal(ckpt, work),
        fenced=fenced,
        writers=after,
        held=rc1 == 78 and rc2 == 0 and fenced == 0 and after == 1 if any(skews) else None,
        note=f"{label}first writer stalled after step {k}, a second one started: first exit {rc1}, "
        f"second exit {rc2} (resumed from {res[0]['from_step'] if res else None})",
    )


def commits_after(ckpt, old, new, skews=(0.0, 0.0)) -> tuple[int | None, int]:
    """(commits of the older lease's writer after the newer lease was taken, how many writers committed
    from then on), on the true clock: each manifest's and lease's time less its writer's ``skews``."""
    if not (old and new):
        return None, 0
    skew_of = {old.token: skews[0], new.token: skews[1]}
    taken = new.info["acquired_at"] - skews[1]
    late = [m for m in manifests(ckpt) if m.get("created_at", 0) - skew_of.get(m.get("lease"), 0.0) >= taken]
    return sum(m.get("lease") == old.token for m in late), len({m.get("lease") for m in late})
