"""Object storage that fails: a run whose ``checkpoint.uri`` is ``s3://`` (a moto server behind
``s3_server``'s fault front) meets 500 InternalError and 503 SlowDown answers on its checkpoint writes, its
spend-ledger writes and its lease writes.

Expected: a burst of transient errors (1-3 answers in a row, fewer than botocore's 5 attempts) is absorbed by
the retries, and the run finishes with bitwise-equal weights; a persistent outage on one save's files fails
that save without committing anything of it (exit 74, one line naming the step, older checkpoints intact)
and the same command, once S3 is back, resumes and finishes bitwise equal.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from trainer.checkpoint.directory import CheckpointDir

from . import runs
from .checkpoints import load_tensors, row
from .runs import EVERY, PRICE, STEPS, Run, open_spend, train_event
from .s3_server import BUCKET, FaultyS3

CHECKPOINT_KEYS, SPEND_KEYS, LEASE_KEYS = r"/step-\d+/", r"/spend/", r"/lease/"
_SERVER: list[FaultyS3] = []


def server() -> FaultyS3:
    """The one faulty S3 of this benchmark run (started on first use; its bucket created)."""
    if not _SERVER:
        s3 = FaultyS3()
        s3.create_bucket()
        runs.BASE_ENV.update(s3.env)  # every run's, and the benchmark's own reads (CheckpointDir, s3fs)
        os.environ.update(s3.env)
        _SERVER.append(s3)
    return _SERVER[0]


def uri_of(ckpt: Path) -> str:
    return f"s3://{BUCKET}/{ckpt.name}-{uuid.uuid4().hex[:6]}"


def burst(rng) -> tuple[int, int]:
    """(status, count) of a transient burst: 500 or 503, 1 to 3 answers in a row."""
    return rng.choice([500, 503]), rng.randint(1, 3)


def s3_bitwise(uri: str, work: Path) -> bool:
    """The final checkpoint on S3, downloaded, equals the reference's tensors bit for bit."""
    import torch

    root = CheckpointDir(uri)
    if not root.is_committed(STEPS):
        return False
    local = work / f"download-{uuid.uuid4().hex[:6]}"
    root.storage.fs.get(root.step_path(STEPS), str(local), recursive=True)
    try:
        ours = load_tensors(local, work)
    except Exception as err:  # noqa: BLE001 - reported, not raised
        print(f"    cannot load {uri}: {type(err).__name__}: {err}", flush=True)
        return False
    return ours.keys() == runs.REFERENCE.keys() and all(torch.equal(ours[k], runs.REFERENCE[k]) for k in ours)


def injected_since(s3: FaultyS3, before: int) -> str:
    """What the front failed since ``before``: '2 (PUT .../step-00000010/__0_0.distcp 503, ...)'."""
    hits = s3.faults.injected[before:]
    shown = ", ".join(f"{m} ...{p[-28:]} {s}" for m, p, s in hits[:3]) + (", ..." if len(hits) > 3 else "")
    return f"{len(hits)} ({shown})"


def f_s3_checkpoint(rng, ckpt, work):
    s3, uri = server(), uri_of(ckpt)
    k, (status, count) = rng.randint(EVERY, STEPS - EVERY - 1), burst(rng)
    run = Run(uri, work, env=s3.env)
    run.wait_for(train_event(k))
    before = len(s3.faults.injected)
    s3.faults.fail(CHECKPOINT_KEYS, status, count)
    rc = run.wait()
    s3.faults.clear()
    hit = len(s3.faults.injected) - before
    return row(
        finished=rc == 0,
        bitwise=s3_bitwise(uri, work),
        held=rc == 0 and hit == count,
        note=f"{count} x {status} on checkpoint writes after step {k}: injected "
        f"{injected_since(s3, before)}; exit {rc}",
    )


def f_s3_ledger(rng, ckpt, work):
    s3, uri = server(), uri_of(ckpt)
    k, (status, count), cap = rng.randint(1, STEPS // 2), burst(rng), 1e6
    attempt = f"s3-ledger-{uuid.uuid4().hex[:6]}"
    root = CheckpointDir(uri)
    open_spend(root, attempt, cap)
    args = ["--set", f"cost.budget_usd={cap}", "--set", f"cost.price_per_node_hour={PRICE}"]
    run = Run(uri, work, env={**s3.env, "DTRAIN_GROUP_NAME": attempt}, args=args)
    run.wait_for(train_event(k))
    before = len(s3.faults.injected)
    s3.faults.fail(SPEND_KEYS, status, count)
    rc = run.wait()
    s3.faults.clear()
    hit = len(s3.faults.injected) - before
    entry = root.spend_entry(attempt) or {}
    lost = "could not update this attempt's spend file" in run.stderr()
    return row(
        finished=rc == 0,
        bitwise=s3_bitwise(uri, work),
        spend_ratio=float(entry.get("dollars", 0.0)) / cap,
        held=rc == 0 and hit == count and not lost and float(entry.get("billed_s", 0)) > 0,
        note=f"{count} x {status} on spend-ledger writes after step {k}: injected "
        f"{injected_since(s3, before)}; exit {rc}, a spend write given up: {lost}, "
        f"billed {entry.get('billed_s')}s",
    )


def f_s3_lease(rng, ckpt, work):
    s3, uri = server(), uri_of(ckpt)
    k, (status, count) = rng.randint(6, STEPS - 6), burst(rng)
    before = len(s3.faults.injected)
    s3.faults.fail(LEASE_KEYS, status, count)
    first = Run(uri, work, env=s3.env)
    first.wait_for(train_event(k))
    first.proc.send_signal(signal.SIGTERM)
    rc1 = first.wait()
    s3.faults.clear()
    s3.faults.fail(LEASE_KEYS, status, count)  # the resume takes its own lease through another burst
    second = Run(uri, work, env=s3.env)
    rc2 = second.wait()
    s3.faults.clear()
    hit = len(s3.faults.injected) - before
    pre, res = first.of("preempted"), second.of("resume")
    return row(
        finished=rc1 == 75 and rc2 == 0,
        steps_lost=pre[0]["step"] - res[0]["from_step"] if pre and res else None,
        bitwise=s3_bitwise(uri, work),
        held=rc1 == 75 and rc2 == 0 and hit == 2 * count,
        note=f"{count} x {status} on lease writes at each start, SIGTERM after step {k}: injected "
        f"{injected_since(s3, before)}; exit {rc1}, then {rc2}",
    )


def f_s3_outage(rng, ckpt, work):
    from trainer.validate import validate_checkpoint

    s3, uri = server(), uri_of(ckpt)
    k, status = rng.choice(range(2 * EVERY, STEPS, EVERY)), rng.choice([500, 503])
    root = CheckpointDir(uri)
    before = len(s3.faults.injected)
    s3.faults.fail(rf"/step-{k:08d}/", status)  # every write of that save, until cleared
    first = Run(uri, work, env=s3.env)
    rc1 = first.wait(timeout=600)
    s3.faults.clear()
    clear = f"checkpoint step {k} could not be written" in first.stderr()
    older = [c.step for c in root.committed()]
    intact = all(_valid(validate_checkpoint, root.step_path(s)) for s in older)
    partial = k in {c.step for c in root.step_dirs()}
    second = Run(uri, work, env=s3.env)  # S3 is back: the same command
    rc2 = second.wait()
    res = second.of("resume")
    return row(
        finished=rc1 == 74 and rc2 == 0,
        bitwise=s3_bitwise(uri, work),
        held=rc1 == 74 and clear and intact and not partial and older[-1:] == [k - EVERY],
        note=f"{status} on every write of step {k}'s save: injected {injected_since(s3, before)}; "
        f"exit {rc1}, clear line {clear}, committed {older} valid {intact}, step {k} left behind {partial}; "
        f"resumed from {res[0]['from_step'] if res else None}, exit {rc2}",
    )


def _valid(validate, path: str) -> bool:
    try:
        validate(path, sample_tensors=None)
    except Exception:  # noqa: BLE001 - reported as not intact
        return False
    return True
