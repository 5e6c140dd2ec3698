"""What a trial reads of its checkpoint directory: the final tensors against the reference's, the
progress file, the manifests and leases, and the row of figures a fault returns.

Every read goes through the trainer's one reader of the directory,
``trainer.checkpoint.directory.CheckpointDir``:
what "committed" means, where progress and leases live, is named there once. (corruption.py WRITES broken
manifests: that is the fault, not a read.)"""

from __future__ import annotations

from pathlib import Path

from trainer.checkpoint.directory import CheckpointDir

from . import runs
from .runs import STEPS


def load_tensors(step_dir: Path, scratch: Path) -> dict:
    """The model and optimizer tensors of a checkpoint, unsharded
    (``trainer.checkpoint.state.checkpoint_tensors``)."""
    from trainer.checkpoint.state import checkpoint_tensors

    return {k: v for k, v in checkpoint_tensors(str(step_dir)).items() if k.startswith(("model.", "optim."))}


def bitwise_equal(ckpt: Path, scratch: Path) -> bool | str:
    """The final checkpoint's tensors equal the reference's, bit for bit (False, or why not comparable)."""
    import torch

    root = CheckpointDir(str(ckpt))
    if not root.is_committed(STEPS):
        return False
    final = Path(root.step_path(STEPS))
    try:
        ours = load_tensors(final, scratch)
    except Exception as err:  # noqa: BLE001 - reported, not raised
        print(f"    cannot load {final}: {type(err).__name__}: {err}", flush=True)
        return False
    if ours.keys() != runs.REFERENCE.keys():
        return False
    return all(torch.equal(ours[k], runs.REFERENCE[k]) for k in runs.REFERENCE)


def progress(ckpt: Path) -> dict:
    """The trainer's live status ({} before it first wrote it, or while it cannot be read)."""
    try:
        return CheckpointDir(str(ckpt)).progress()
    except (OSError, ValueError):
        return {}


def manifests(ckpt: Path) -> list[dict]:
    """The manifests of the committed checkpoints, oldest first; one that does not parse (a corruption
    fault's) or vanished meanwhile (pruned) is left out."""
    root = CheckpointDir(str(ckpt))
    out = []
    for checkpoint in root.committed():
        try:
            out.append(root.manifest(checkpoint.path))
        except (FileNotFoundError, ValueError):
            pass
    return out


def fenced_commits(ckpt: Path, old_token: int, new_acquired_at: float) -> int:
    """Manifests the older lease's writer committed after the newer lease existed (must be 0)."""
    return sum(
        1
        for m in manifests(ckpt)
        if m.get("lease") == old_token and m.get("created_at", 0) >= new_acquired_at
    )


def lease_of(ckpt: Path, group: str):
    """The lease the group named ``group`` took on the directory, or None."""
    root = CheckpointDir(str(ckpt))
    return next((root.lease(t) for t in root.leases() if root.lease(t).info.get("group") == group), None)


def row(**kw) -> dict:
    base = {
        "finished": False,
        "steps_lost": None,
        "bitwise": None,
        "spend_ratio": None,
        "writers": None,
        "fenced": None,
        "detected": None,
        "held": None,
        "note": "",
    }
    return {**base, **kw}
