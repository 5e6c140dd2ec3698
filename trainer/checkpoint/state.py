"""The training state a checkpoint holds, as DCP saves it, and the stager that copies it to host memory.

The DCP save holds the model and optimizer (sharded), the LR scheduler, the data position, the step,
and each rank's python/numpy/torch RNG states.
"""

from __future__ import annotations

import copy
import random
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from trainer.torch_private import tensor_hooks
from trainer.checkpoint.reader import storage_reader
from trainer.base.storage import Storage


def rng_state() -> dict[str, torch.Tensor]:
    """This rank's Python, numpy and torch RNG states, as tensors only.

    DCP's async stager deep-copies the state it is handed; some torch releases (2.11) cannot
    deep-copy numpy's state tuple (a ``type`` and an ``ndarray`` inside), and every release
    would pickle it into a per-rank blob. So each state is packed into int64/float64 tensors
    (Mersenne Twister words fit in int64), and unpacked on load.
    """
    version, words, gauss = random.getstate()  # words: 624 state words + the position
    _, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": torch.tensor([version, *words], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
        "numpy": torch.tensor([pos, has_gauss, *keys.tolist()], dtype=torch.int64),
        "numpy_gauss": torch.tensor([cached], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    python = state["python"].tolist()
    has_gauss, gauss = state["python_gauss"].tolist()
    random.setstate((python[0], tuple(python[1:]), gauss if has_gauss else None))
    pos, has_np_gauss, *keys = state["numpy"].tolist()
    np.random.set_state(
        ("MT19937", np.array(keys, dtype=np.uint32), pos, has_np_gauss, float(state["numpy_gauss"].item()))
    )
    torch.set_rng_state(state["torch"])


def plain(state: Any) -> Any:
    """``state`` with every mapping a plain dict and every sequence a list (tensors untouched).

    Only tensors and plain Python values go to DCP: the async stager of some torch releases
    (2.11) cannot deep-copy anything else (an ``OrderedDict``, numpy objects) and fails with
    ``KeyError: <class 'type'>``; the load side fills the same plain structure in place.
    """
    if isinstance(state, torch.Tensor):
        return state
    if isinstance(state, dict):
        return {k: plain(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [plain(v) for v in state]
    return state


def training_state(model, optimizer, scheduler, data, step: int, rank: int) -> dict:
    """What a save writes and a load fills in place."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {
        "model": plain(model_sd),
        "optim": plain(optim_sd),
        # copies now: an async save stages the state while training goes on
        "scheduler": copy.deepcopy(scheduler.state_dict()),
        "data": copy.deepcopy(data.state_dict()),
        "step": step,
        # per-rank keys: DCP keeps one copy of keys that every rank saves alike
        f"rng_rank{rank}": rng_state(),
    }


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


# torch 2.11's DefaultStager closes its StateDictStager at the end of every stage (pytorch#183413):
# that clears its copier table, so a second save through the same stager fails inside DCP with
# "KeyError: <class 'type'>", and it drops the cached host buffers, so every save allocates and
# pins the whole state again (on an H100, 14 GB took the first step after each save from 0.22 s to
# 5-11 s). There the trainer uses torch_private's _KeepBuffersStager, whose _stage is 2.12's: the same
# copy, no close. From 2.12 on, DefaultStager itself is kept for the whole run.
STAGER_CLOSES_AFTER_STAGE = _torch_version() < (2, 12)


def new_stager(cuda: bool):
    """A DCP stager for every save of the run: pinned host buffers on GPU, allocated at the
    first save and reused by every later one (DCP keys them by the source tensor's storage)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    # Async staging: the copy runs in the stager's thread (on a side stream on GPU) while the
    # next step's forward/backward run; Checkpointer.wait_for_staging() joins it.
    options = StagingOptions(
        use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
    )
    if not STAGER_CLOSES_AFTER_STAGE:
        return DefaultStager(options)
    # trainer.torch_private, hook stager_keep_buffers: 2.12's stage on 2.11's stager
    if (stager := tensor_hooks.keep_buffers_stager(DefaultStager, options)) is not None:
        return stager
    stager = DefaultStager(options)  # the fallback: one stager a save (it closes after staging)
    stager.reusable = False
    return stager


def checkpoint_tensors(step_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of a local DCP checkpoint, unsharded and flattened to dotted keys
    (``{"model.x": t, "optim.state.x.exp_avg": t, ...}``): what a bitwise comparison of two runs reads.

    The keys are the FQNs DCP stored, so a flat dict of full-size tensors loads them whatever the world size
    that saved them; the non-tensor items are not read at all (torch's dcp_to_torch_save would read them, and
    the whole checkpoint, through its own reader, which unpickles whatever the files hold).
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = storage_reader(Storage(step_dir), step_dir).read_metadata()
    flat = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in metadata.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(flat, storage_reader=storage_reader(Storage(step_dir), step_dir), no_dist=True)
    return flat
