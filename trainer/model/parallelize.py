"""The model's layout on the devices (mesh, activation checkpointing, compile, FSDP2), the
optimizer, the LR schedule, and one optimizer step's gradient maths."""

import math
import os
from collections import defaultdict

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from trainer.torch_private import tensor_hooks
from trainer.config.fields import ConfigError
from trainer.config.sections import OptimConfig, ParallelConfig
from trainer.model.llama import Llama


def replicate_degree(cfg: ParallelConfig, world_size: int) -> int:
    """The number of HSDP replica groups: cfg.replicate_degree, or one per node when it is 0."""
    replicate = cfg.replicate_degree
    if replicate == 0:  # one replica group per node: torchrun says how many ranks a node runs
        replicate = world_size // int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if replicate < 1 or world_size % replicate:
        raise ConfigError(
            f"parallel.replicate_degree: {replicate} replica groups do not divide world size {world_size}"
        )
    return replicate


def build_mesh(device_type: str, world_size: int, cfg: ParallelConfig) -> DeviceMesh:
    """1-D ("dp_shard",) for FSDP; 2-D ("dp_replicate", "dp_shard") for HSDP.

    Ranks are laid out row-major, so with one replica group per node the shard dimension
    (a row: consecutive ranks) is the ranks of one node, where the all-gathers and
    reduce-scatters of every layer run; only the gradient all-reduce crosses nodes.
    """
    replicate = replicate_degree(cfg, world_size)
    if replicate == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(
        device_type, (replicate, world_size // replicate), mesh_dim_names=("dp_replicate", "dp_shard")
    )


def parallelize(
    model: Llama, mesh: DeviceMesh, cfg: ParallelConfig | None = None, *, shard: bool | None = None
) -> Llama:
    """Lay a (meta-device) model out on the mesh in place and return it.

    The order matters, and is torchtitan's:

    1. activation checkpointing, per block: it must be inside what is compiled, so that
       the compiled graph holds the recomputation rather than breaking around it;
    2. torch.compile, per block: all blocks have the same code and shapes, so one compiled
       graph serves every layer (compiling the whole model would trace the FSDP hooks); and
       the loss (trainer/model/loss.py: each chunk's projection, upcast and cross-entropy fused);
    3. fully_shard on each block: each becomes its own all-gather / reduce-scatter unit,
       so only one block's full weights are live at a time, and the next block's
       all-gather overlaps the current block's compute;
    4. fully_shard on the root last: it takes what is left (embeddings, final norm,
       lm_head), used at the very start and end of forward. Applied before the blocks
       it would claim their parameters too.

    A 2-D mesh (build_mesh with replicate_degree > 1) makes fully_shard HSDP: sharded over
    the mesh's second dimension, replicated over its first.

    shard: apply fully_shard (3, 4) or not; None (the trainer): needs_fsdp(mesh), so one CPU
    process trains a plain module.
    """
    cfg = cfg or ParallelConfig()
    apply_ac(model, cfg)
    if cfg.compile:
        for layer in model.layers:
            layer.compile(fullgraph=True)
        model.compile_loss = True
    if not (needs_fsdp(mesh) if shard is None else shard):
        return model
    kwargs: dict = {"mesh": mesh}
    if mesh.device_type == "cuda":
        # bf16 compute and communication, fp32 gradient reduction and master weights.
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cfg.cpu_offload:
            # Shards, gradients and optimizer state live in pinned host memory; each block is
            # copied to the GPU for its forward and backward, and the optimizer steps on the CPU.
            kwargs["offload_policy"] = CPUOffloadPolicy()
    last = len(model.layers) - 1
    for i, layer in enumerate(model.layers):
        # The last block is the first one backward needs: keeping it gathered after
        # forward saves an all-gather per micro-step for one block's worth of memory.
        fully_shard(layer, reshard_after_forward=i < last, **kwargs)
    fully_shard(model, **kwargs)
    return model


def needs_fsdp(mesh: DeviceMesh) -> bool:
    """Whether the model is wrapped with fully_shard: always but on one CPU process.

    One rank on a CPU has nothing to shard and no mixed precision to apply (bf16 compute with fp32
    master weights comes from FSDP2's MixedPrecisionPolicy, on CUDA). There FSDP2 would only copy every
    parameter into and out of its flat buffers and run its hooks, 8 % of a step (benchmarks/RESULTS.md,
    "Against a plain model"), so the model stays a plain module with plain tensors. Its checkpoints are
    the same keys and values: DCP loads them into DTensors at another world size, and DTensors' back
    into plain tensors (a 1-rank run resumed on 2 ranks, and back, is tested).
    """
    return mesh.size() > 1 or mesh.device_type != "cpu"


def apply_ac(model: Llama, cfg: ParallelConfig) -> None:
    """Mark the blocks whose activations are recomputed in backward (see DecoderLayer.forward)."""
    mode, every = cfg.activation_checkpointing, cfg.selective_ac_every
    for i, layer in enumerate(model.layers):
        if mode == "full" or (mode == "selective" and every >= 1 and i % every == 0):
            layer.checkpoint_activations = True  # keep only the block's input
        elif mode == "selective" and every == 0:  # op-level
            layer.checkpoint_activations = True
            layer.ac_context_fn = op_level_ac_context


# What op-level selective AC keeps: the expensive results (attention, matmuls). The cheap
# pointwise ops around them (norms, rotary, SiLU, the SwiGLU product) are recomputed.
# attention's aten ops are private names (trainer.torch_private, hook sac_attention_ops)
_ATTENTION_OPS = tensor_hooks.attention_ops()
_MM = torch.ops.aten.mm.default


def op_level_ac_context():
    """A fresh policy per checkpointed forward: save attention outputs and every other matmul
    output (torchtitan's "op" mode: half the matmuls are recomputed, trading about a sixth of
    a forward's FLOPs for most of a block's activation memory)."""
    mm_count: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func is _MM:
            key = "recompute" if ctx.is_recompute else "forward"
            mm_count[key] += 1
            # The count runs the same in forward and recompute, so both agree on which to keep.
            return CheckpointPolicy.MUST_SAVE if mm_count[key] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in _ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


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


def set_grad_sync(model: torch.nn.Module, enabled: bool) -> None:
    """No gradient sync on the non-final micro-steps: the reduce-scatter happens once per
    optimizer step, and gradients accumulate unsharded in between. A plain module (one CPU
    process, see needs_fsdp) has no sync to skip."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


def clip_grads(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm (over all shards); returns the norm before clipping, a
    0-d tensor on the device (reading it waits for the device)."""
    # The grads are DTensors sharded over ranks; clip_grad_norm_ reduces the norm across
    # them, and full_tensor() makes the (replicated) result a plain local number.
    norm = torch.nn.utils.clip_grad_norm_(
        model.parameters(), max_norm if max_norm > 0 else float("inf"), foreach=True
    )
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm
