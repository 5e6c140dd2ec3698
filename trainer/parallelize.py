"""FSDP2 sharding, the optimizer, the LR schedule, and one optimizer step's gradient maths."""

import math

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from trainer.config import OptimConfig
from trainer.model import Llama


def parallelize(model: Llama, mesh: DeviceMesh) -> Llama:
    """Shard a (meta-device) model in place with FSDP2 and return it.

    Order: fully_shard each transformer block, then the root. Each block becomes its own
    all-gather / reduce-scatter unit, so only one block's full weights are live at a
    time; the root gets what is left (embeddings, final norm, lm_head), which are used
    at the very start and end of forward. There is no activation checkpointing or
    torch.compile step in this trainer; they would come before fully_shard.
    """
    mp = None
    if mesh.device_type == "cuda":
        # bf16 compute and communication, fp32 gradient reduction and master weights.
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mesh": mesh} if mp is None else {"mesh": mesh, "mp_policy": mp}
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norm gains)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    on_cuda = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        # fused kernels only exist for CUDA; foreach batches the per-parameter ops on CPU.
        fused=on_cuda,
        foreach=not on_cuda,
    )


def lr_lambda(cfg: OptimConfig, total_steps: int):
    """Multiplier of the peak lr for a 0-based step: linear warmup, then cosine down to
    min_lr_ratio, reached exactly at the last step (index total_steps - 1)."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        decay_steps = max(1, total_steps - 1 - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps))


def set_grad_sync(model: FSDPModule, enabled: bool) -> None:
    """No gradient sync on the non-final micro-steps: the reduce-scatter happens once per
    optimizer step, and gradients accumulate unsharded in between."""
    model.set_requires_gradient_sync(enabled)


def clip_grads(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (over all shards) and return the norm before clipping."""
    # The grads are DTensors sharded over ranks; clip_grad_norm_ reduces the norm across
    # them, and full_tensor() makes the (replicated) result a plain local number.
    norm = torch.nn.utils.clip_grad_norm_(
        model.parameters(), max_norm if max_norm > 0 else float("inf"), foreach=True
    )
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.item()
