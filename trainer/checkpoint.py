"""Resumable checkpoints: a DCP sharded save per step directory, committed by a manifest.

Layout under checkpoint.uri::

    step-00000050/
        .metadata, __0_0.distcp, __1_0.distcp, ...   torch.distributed.checkpoint files
        manifest.json                                written last: the commit point
    progress.json                                    see trainer/progress.py

A step directory without manifest.json is an interrupted save and is ignored (and
cleaned up). The DCP save holds the model and optimizer (sharded), the LR scheduler,
the data position, the step, and each rank's python/numpy/torch RNG states.
"""

import hashlib
import json
import os
import random
import re
import shutil
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer.config import CheckpointConfig, ConfigError

_STEP_DIR = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"


def local_dir(uri: str) -> str | None:
    """The local directory of a checkpoint URI; None when checkpoints are off."""
    if uri == "":
        return None
    if uri.startswith("s3://"):
        raise ConfigError(f"checkpoint.uri: s3:// is not supported by this trainer yet, got {uri!r}")
    return os.path.abspath(uri[len("file://"):] if uri.startswith("file://") else uri)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def write_json_atomic(path: str, obj: dict) -> None:
    """Readers (the Airflow operator) never see a half-written file: write a temp file, then rename."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def committed_checkpoints(root: str) -> list[tuple[int, str]]:
    """[(step, path)] of the step directories that have a manifest, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        if m and os.path.exists(os.path.join(root, name, MANIFEST)):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class Checkpointer:
    """Saves and restores the training state; every method is called on all ranks together."""

    def __init__(self, cfg: CheckpointConfig, *, flavor: str, config: dict, config_hash: str,
                 rank: int, world_size: int):
        self.cfg, self.flavor, self.config, self.config_hash = cfg, flavor, config, config_hash
        self.rank, self.world_size = rank, world_size
        self.root = local_dir(cfg.uri)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def latest(self) -> tuple[int, str] | None:
        found = committed_checkpoints(self.root) if self.enabled else []
        return found[-1] if found else None

    def _state(self, model, optimizer, scheduler, data, step: int) -> dict:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": scheduler.state_dict(),
            "data": data.state_dict(),
            "step": step,
            # per-rank keys: DCP keeps one copy of keys that every rank saves alike
            f"rng_rank{self.rank}": _rng_state(),
        }

    def save(self, step: int, model, optimizer, scheduler, data, *, tokens_seen: int, wall_time_s: float) -> str:
        """Save and commit step `step`; returns the step directory. Idempotent per step."""
        path = os.path.join(self.root, step_dir_name(step))
        if os.path.exists(os.path.join(path, MANIFEST)):
            return path  # e.g. the final save right after an interval save of the same step
        if self.rank == 0 and os.path.exists(path):
            shutil.rmtree(path)  # an interrupted save of this step (maybe another world size)
        dist.barrier()
        dcp.save(self._state(model, optimizer, scheduler, data, step), checkpoint_id=path)
        # Each rank hashes the shard files it wrote, so the manifest of a large model
        # costs one shard's hashing time, not the whole checkpoint's.
        mine = sorted(n for n in os.listdir(path) if n.startswith(f"__{self.rank}_"))
        if self.rank == 0:
            mine.append(".metadata")
        hashes = {n: {"size": os.path.getsize(os.path.join(path, n)), "sha256": _sha256(os.path.join(path, n))} for n in mine}
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, hashes)
        if self.rank == 0:
            files = {name: entry for part in gathered for name, entry in sorted(part.items())}
            manifest = {
                "step": step,
                "world_size": self.world_size,
                "flavor": self.flavor,
                "config_hash": self.config_hash,
                "tokens_seen": tokens_seen,
                "wall_time_s": round(wall_time_s, 3),
                "files": dict(sorted(files.items())),
                "created_at": time.time(),
                # not required by readers of the manifest; lets evaluate/export rebuild the model
                "config": self.config,
            }
            write_json_atomic(os.path.join(path, MANIFEST), manifest)  # the commit point
            self._apply_retention()
        dist.barrier()  # nobody reports the checkpoint before it is committed
        return path

    def _apply_retention(self) -> None:
        found = committed_checkpoints(self.root)
        for _, old in found[: -self.cfg.keep]:
            shutil.rmtree(old, ignore_errors=True)
        latest = found[-1][0]
        # Uncommitted directories older than the newest commit are dead interrupted saves.
        for name in os.listdir(self.root):
            m = _STEP_DIR.match(name)
            if m and int(m.group(1)) < latest and not os.path.exists(os.path.join(self.root, name, MANIFEST)):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def check_compatible(self, path: str) -> dict:
        """Refuse, before any model is built, a checkpoint this run cannot continue; returns its manifest."""
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        if manifest["flavor"] != self.flavor:
            raise ConfigError(
                f"model.flavor: {self.flavor!r} cannot resume from {path}, which holds flavour "
                f"{manifest['flavor']!r} (use the same flavour or another checkpoint.uri)"
            )
        for name, entry in manifest["files"].items():
            file = os.path.join(path, name)
            size = os.path.getsize(file) if os.path.exists(file) else None
            if size != entry["size"]:
                raise ValueError(f"cannot resume from {path}: {name} is {size} bytes, its manifest says {entry['size']}")
        return manifest

    def load(self, path: str, model, optimizer, scheduler, data) -> dict:
        """Restore everything from a committed step directory; returns its manifest.

        A different world size reshards: the model and optimizer are DTensors DCP
        can re-split, the data position is global, only the per-rank RNG states of
        ranks that did not exist before start from the seed.
        """
        manifest = self.check_compatible(path)
        state = self._state(model, optimizer, scheduler, data, 0)
        saved_keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        rng_key = f"rng_rank{self.rank}"
        if not any(k.startswith(rng_key + ".") for k in saved_keys):
            del state[rng_key]
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scheduler.load_state_dict(state["scheduler"])
        data.load_state_dict(state["data"])
        if rng_key in state:
            _set_rng_state(state[rng_key])
        if state["step"] != manifest["step"]:
            raise ValueError(f"cannot resume from {path}: it holds step {state['step']}, manifest says {manifest['step']}")
        return manifest
