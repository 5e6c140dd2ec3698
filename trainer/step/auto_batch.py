"""Auto micro-batch size: the largest micro-batch that fits in GPU memory, found before training.

The global batch stays what the config says: only its split into micro-batches changes
(a larger micro-batch means fewer accumulation micro-steps and better GPU utilisation),
so the loss trajectory is the same up to floating-point summation order and the data
position in checkpoints does not depend on it.

Candidates are the divisors of the per-rank batch (global_batch_size / world size). A
candidate is probed with what one optimizer step will hold at its peak: up to two
micro-steps of forward and backward on the real sharded model (the first without
gradient sync, as accumulation runs, the last with the reduce-scatter), while a
reserve the size of AdamW's two fp32 moments, plus some headroom, is held allocated.
Memory use grows with the micro-batch, so the largest that fits is found by binary
search in log2(#candidates) probes.

Every rank probes the same candidates in lockstep and they agree on each result (the
minimum over ranks), so all ranks pick the same size. This assumes the group's GPUs are
alike (a pod group is homogeneous): an out-of-memory error on one rank only, in the
middle of a forward, would leave the others waiting in the next all-gather until the
process group times out.
"""

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from trainer import torch_private
from trainer.torch_private import tensor_hooks
from trainer.config.job_config import TrainConfig
from trainer.config.fields import ConfigError

HEADROOM = 0.05
"""Fraction of the GPU's memory kept free on top of the probe's peak (allocator
fragmentation, communication buffers that grow later, the evaluation of a longer run)."""


def candidates(global_batch_size: int, world_size: int) -> list[int]:
    """Micro-batch sizes that split this rank's share of the global batch evenly, ascending."""
    per_rank = global_batch_size // world_size
    return [m for m in range(1, per_rank + 1) if per_rank % m == 0]


def largest_fitting(sizes: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of the ascending `sizes` for which fits() is true, assuming that if a
    size fits every smaller one does; None if not even the smallest fits. Calls fits()
    at most ceil(log2(len(sizes) + 1)) times."""
    lo, hi, best = 0, len(sizes) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(sizes[mid]):
            best, lo = sizes[mid], mid + 1
        else:
            hi = mid - 1
    return best


def probe(
    model: torch.nn.Module,
    micro_batch: int,
    micro_steps: int,
    seq_len: int,
    vocab_size: int,
    device: torch.device,
    reserve_bytes: int,
    loss_chunk_tokens: int = 0,
) -> bool:
    """True if `micro_steps` (1 or 2) forward/backward passes of `micro_batch` sequences run
    without an out-of-memory error while `reserve_bytes` more are held. Leaves the model
    as it found it: no gradients, every FSDP unit resharded."""
    reserve = None
    try:
        reserve = torch.empty(reserve_bytes, dtype=torch.uint8, device=device)
        tokens = torch.randint(0, vocab_size, (micro_batch, seq_len + 1), device=device)
        for i in range(micro_steps):
            _set_grad_sync(model, i == micro_steps - 1)
            # the loss as training takes it (chunked: the full logits never exist)
            model(tokens[:, :-1], tokens[:, 1:], loss_chunk_tokens=loss_chunk_tokens).backward()
        return True
    except torch.OutOfMemoryError:
        _reset_fsdp(model)
        return False
    finally:
        del reserve
        _set_grad_sync(model, True)
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _reset_fsdp(model: torch.nn.Module) -> None:
    """Bring FSDP2 back to idle after an exception inside forward or backward.

    An OOM mid-backward leaves the blocks in their pre-backward state, so the next backward
    would not reduce-scatter their gradients. FSDP2 resets that state in the callback it
    queues at the end of every backward, which the exception skipped: run it here, then reshard
    whatever is still gathered (private API: ``trainer.torch_private``, hook ``fsdp_reset_after_oom``;
    ``fit_micro_batch_size`` searches only where it is in force).
    """
    tensor_hooks.reset_fsdp_backward(model)


def fit_micro_batch_size(
    cfg: TrainConfig,
    model: torch.nn.Module,
    device: torch.device,
    world_size: int,
    log: Callable[[str], None],
) -> TrainConfig:
    """cfg with micro_batch_size set to the largest that fits; cfg itself on CPU (skipped)."""
    if device.type != "cuda":
        log(
            f"auto micro-batch size: skipped on {device.type} (no GPU memory to probe); "
            f"keeping micro_batch_size {cfg.micro_batch_size}"
        )
        return cfg
    if not torch_private.use("fsdp_reset_after_oom"):  # an OOM probe could not be undone: no search
        log(
            f"auto micro-batch size: not searched on this torch; keeping micro_batch_size "
            f"{cfg.micro_batch_size}"
        )
        return cfg
    per_rank = cfg.global_batch_size // world_size
    total = torch.cuda.get_device_properties(device).total_memory
    # AdamW keeps two fp32 moments per parameter of this rank's shards (on the GPU unless offloaded).
    on_gpu = [p for p in model.parameters() if p.device.type == "cuda"]
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in on_gpu)
    reserve = 2 * 4 * local + int(HEADROOM * total)
    tried: dict[int, bool] = {}

    def fits(mb: int) -> bool:
        ok = probe(
            model,
            mb,
            min(2, per_rank // mb),
            cfg.data.seq_len,
            model.args.vocab_size,
            device,
            reserve,
            cfg.parallel.loss_chunk_tokens,
        )
        agreed = torch.tensor([int(ok)], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # the same answer on every rank
        tried[mb] = bool(agreed.item())
        return tried[mb]

    best = largest_fitting(candidates(cfg.global_batch_size, world_size), fits)
    torch.cuda.reset_peak_memory_stats(device)
    if best is None:
        raise ConfigError(
            f"parallel.auto_micro_batch_size: not even 1 sequence of data.seq_len {cfg.data.seq_len} fits in "
            f"{total / 2**30:.1f} GiB of GPU memory (try parallel.activation_checkpointing, "
            f"parallel.cpu_offload or more ranks)"
        )
    log(
        f"auto micro-batch size: {best} (probed {dict(sorted(tried.items()))}, True = fits; "
        f"configured {cfg.micro_batch_size}); gradient accumulation {per_rank // best}"
    )
    return replace(cfg, micro_batch_size=best)


def _set_grad_sync(model: torch.nn.Module, enabled: bool) -> None:
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
