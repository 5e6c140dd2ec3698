"""One training step and the model it trains: the sharded model built, forward/backward over a rank's
micro-batches, one optimizer step (also what benchmarks/mfu.py times)."""

import torch
import torch.distributed as dist

from trainer.config.job_config import TrainConfig
from trainer.step.process_group import Dist, log
from trainer.model.llama import Llama, ModelArgs
from trainer.model.parallelize import clip_grads, needs_fsdp, parallelize, set_grad_sync


def build_model(
    cfg: TrainConfig, d: Dist, args: ModelArgs | None = None, *, random_init: bool = True
) -> Llama:
    """The sharded model of shape ``args`` (default: the flavour's), randomly initialised (``random_init``;
    else only its buffers: every parameter is loaded next, from a checkpoint or a Hugging Face model)."""
    with torch.device("meta"):  # no memory until sharded
        model = Llama(args or ModelArgs.from_flavor(cfg.model.flavor, cfg.data.seq_len))
    parallelize(model, d.mesh, cfg.parallel)
    if not needs_fsdp(d.mesh):
        log(
            d,
            "one process on a CPU: the model is not wrapped with FSDP2 (nothing to shard, no mixed "
            "precision)",
        )
    offload = cfg.parallel.cpu_offload and d.device.type == "cuda"
    model.to_empty(device="cpu" if offload else d.device)  # each rank allocates only its shards
    model.init_weights(cfg.seed, parameters=random_init)
    if offload:  # FSDP keeps the parameters in host memory; the rotary tables are used on the GPU
        model.rope_cos, model.rope_sin = model.rope_cos.to(d.device), model.rope_sin.to(d.device)
    check_meshes_are_this_ranks(model)
    return model


def check_meshes_are_this_ranks(model: torch.nn.Module) -> None:
    """Refuse a model whose sharded parameters are laid out for another rank: their device mesh says this
    process sits elsewhere than its rank does. A process that trains a second world (an elastic group's
    host, ``trainer/elastic/worker_host.py``) would otherwise save and train another rank's shard without an
    error, had a cache of torch's handed it a mesh of the last world (each is cleared between worlds)."""
    from torch.distributed.tensor import DTensor

    meshes = {id(p.device_mesh): p.device_mesh for p in model.parameters() if isinstance(p, DTensor)}
    rank = dist.get_rank()
    for mesh in meshes.values():
        where = (mesh.mesh == rank).nonzero()
        expected = tuple(where[0].tolist()) if len(where) else None
        if mesh.get_coordinate() != expected:
            raise RuntimeError(
                f"rank {rank}: the model's device mesh {mesh} places this process at "
                f"{mesh.get_coordinate()}, not at {expected}: a mesh of an earlier world was reused"
            )


def train_step(model, optimizer, scheduler, micro_batches, cfg: TrainConfig, before_optimizer_step=None):
    """Forward/backward over this rank's micro-batches, then one optimizer step.

    Returns (loss, grad_norm) as 0-d tensors on the device, not read yet: the global batch's
    mean loss (all-reduced) and the global gradient norm before clipping. Reading them
    (.item()) waits for the device, so the training loop reads a step's values only after
    it has queued the next one (see Job.settle).

    before_optimizer_step: called right before the parameters and the optimizer state change
    (an async checkpoint's copy of them, which overlapped forward/backward, is joined there).
    """
    weights = getattr(micro_batches, "weights", None)  # uneven shares (trainer.data.loader.MicroBatches)
    loss_sum = torch.zeros((), device=micro_batches[0][0].device)
    for i, (inputs, targets) in enumerate(micro_batches):  # each (micro_batch, seq_len)
        if len(micro_batches) > 1:  # (sync is on after every step: the last micro-step turns it on)
            set_grad_sync(model, i == len(micro_batches) - 1)
        # the mean loss over (micro_batch, seq_len) tokens; the logits are never whole (trainer/model/loss.py)
        loss = model(inputs, targets, loss_chunk_tokens=cfg.parallel.loss_chunk_tokens)
        if weights is None:
            # Every micro-batch holds the same number of tokens, so dividing by the count here
            # and FSDP's mean over ranks give the gradient of the global mean loss.
            (loss / len(micro_batches)).backward()
            loss_sum += loss.detach()
        else:  # its rows x world size / global batch: FSDP's mean over ranks makes it the global mean's
            (loss * weights[i]).backward()
            loss_sum += loss.detach() * weights[i]
    grad_norm = clip_grads(model, cfg.optim.grad_clip)
    if weights is None:
        loss = loss_sum / len(micro_batches)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # the logged loss is the global batch's
    else:
        loss = loss_sum  # each rank's rows x world size / global batch: their mean is the global batch's
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    if before_optimizer_step is not None:
        before_optimizer_step()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm
