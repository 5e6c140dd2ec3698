"""Corrupted checkpoints: a copy of the reference's cut after a step drawn at random (as if the run had
died right after committing it), that step damaged (a flipped byte in a shard, a truncated manifest, a NaN
in the manifest); the resume must detect it, use the one before and train on to the reference's weights."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from . import runs
from .checkpoints import bitwise_equal, row
from .runs import EVERY, STEPS, Run


def _corrupt_copy(rng, ckpt: Path, corrupt) -> int:
    """The reference's directory copied to ``ckpt`` up to a step drawn from ``rng``, that step corrupted;
    returns the step. (The reference keeps every checkpoint: faults.py's ``set_up``.)"""
    k = rng.choice(range(2 * EVERY, STEPS + 1, EVERY))
    shutil.copytree(runs.REFERENCE_DIR, ckpt)
    for later in range(k + EVERY, STEPS + 1, EVERY):
        shutil.rmtree(ckpt / f"step-{later:08d}")
    corrupt(ckpt / f"step-{k:08d}")
    return k


def _resume_corrupted(ckpt, work, k, note):
    run = Run(ckpt, work)
    rc = run.wait()
    res = run.of("resume")
    fell_back = bool(res) and res[0]["from_step"] == k - EVERY and "fails verification" in run.stderr()
    return row(
        finished=rc == 0,
        steps_lost=(k - res[0]["from_step"]) if res else None,
        detected=fell_back,
        bitwise=bitwise_equal(ckpt, work),
        note=f"step {k}: {note}; resumed from {res[0]['from_step'] if res else None}",
    )


def f_flip_byte(rng, ckpt, work):
    where = {}

    def corrupt(step_dir):
        shard = rng.choice(sorted(step_dir.glob("__*_*.distcp")))
        data = bytearray(shard.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= 0xFF
        shard.write_bytes(bytes(data))
        where.update(file=shard.name, offset=i)

    k = _corrupt_copy(rng, ckpt, corrupt)
    return _resume_corrupted(ckpt, work, k, f"flipped byte {where['offset']} of {where['file']}")


def f_truncate_manifest(rng, ckpt, work):
    where = {}

    def corrupt(step_dir):
        text = (step_dir / "manifest.json").read_text()
        cut = rng.randrange(1, len(text) - 1)
        (step_dir / "manifest.json").write_text(text[:cut])
        where.update(cut=cut, of=len(text))

    k = _corrupt_copy(rng, ckpt, corrupt)
    return _resume_corrupted(ckpt, work, k, f"manifest cut to {where['cut']} of {where['of']} bytes")


def f_nan_manifest(rng, ckpt, work):
    field = rng.choice(["step", "step_time_s", "tokens_seen", "wall_time_s", "cost.total_dollars"])

    def corrupt(step_dir):
        m = json.loads((step_dir / "manifest.json").read_text())
        node, keys = m, field.split(".")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = math.nan
        (step_dir / "manifest.json").write_text(json.dumps(m))

    k = _corrupt_copy(rng, ckpt, corrupt)
    return _resume_corrupted(ckpt, work, k, f"{field} = NaN")
