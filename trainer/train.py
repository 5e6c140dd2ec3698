"""The training loop: resume → loop { step; stop or checkpoint if asked } → final checkpoint.

Runs under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment) or as one plain process, which still joins a 1-rank process group so
that both take the same code path. Returns the process exit code (see trainer.config).
"""

import math
import os
import random
import signal
import socket
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.checkpoint import Checkpointer
from trainer.config import PREEMPTED_EXIT_CODE, TrainConfig
from trainer.data import TrainBatches, resolve_dataset
from trainer.metrics import Metrics, flops_per_token
from trainer.model import Llama, ModelArgs
from trainer.parallelize import build_optimizer, build_scheduler, clip_grads, parallelize, set_grad_sync
from trainer.progress import Progress


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    mesh: DeviceMesh


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup_distributed() -> Dist:
    if "RANK" not in os.environ:  # a plain process: become rank 0 of 1
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # nccl for the model, gloo for the odd CPU object exchange
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, init_method="env://")
    return Dist(rank, local_rank, world_size, device, init_device_mesh(device.type, (world_size,)))


class StopRequests:
    """Signals set flags; ranks act on them only at a step boundary, together.

    SIGTERM/SIGINT: save and exit 75. SIGUSR1: save now, carry on. A signal that reached
    only some ranks (one node's) still stops all: agree() takes the max over ranks.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.stop = self.checkpoint_now = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_checkpoint_now)

    def _on_stop(self, signum, frame) -> None:
        self.stop = True

    def _on_checkpoint_now(self, signum, frame) -> None:
        self.checkpoint_now = True

    def agree(self) -> tuple[bool, bool]:
        flags = torch.tensor([self.stop, self.checkpoint_now], dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        self.checkpoint_now = False
        return bool(flags[0]), bool(flags[1])


def build_model(cfg: TrainConfig, d: Dist) -> Llama:
    with torch.device("meta"):  # no memory until sharded
        model = Llama(ModelArgs.from_flavor(cfg.model.flavor, cfg.data.seq_len))
    parallelize(model, d.mesh)
    model.to_empty(device=d.device)  # each rank allocates only its shards
    model.init_weights(cfg.seed)
    return model


def train_step(model, optimizer, scheduler, micro_batches, cfg: TrainConfig, step: int, rank: int):
    """Forward/backward over this rank's micro-batches, then one optimizer step. Returns (loss, grad_norm)."""
    loss_sum = torch.zeros((), device=micro_batches[0][0].device)
    for i, (inputs, targets) in enumerate(micro_batches):  # each (micro_batch, seq_len)
        set_grad_sync(model, i == len(micro_batches) - 1)
        logits = model(inputs)  # (micro_batch, seq_len, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        # Every micro-batch holds the same number of tokens, so dividing by the count here
        # and FSDP's mean over ranks give the gradient of the global mean loss.
        (loss / len(micro_batches)).backward()
        loss_sum += loss.detach()
    grad_norm = clip_grads(model, cfg.optim.grad_clip)
    loss = loss_sum / len(micro_batches)
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # the logged loss is the global batch's
    loss = loss.item()
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise FloatingPointError(f"step {step}, rank {rank}: non-finite loss {loss} or grad norm {grad_norm}")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm


def train(cfg: TrainConfig) -> int:
    """Train to cfg.steps or until stopped; returns 0 or PREEMPTED_EXIT_CODE."""
    cfg.validate_world_size(world_size_from_env())  # fail before joining the group
    d = setup_distributed()
    try:
        return _train(cfg, d)
    finally:
        dist.destroy_process_group()


def _train(cfg: TrainConfig, d: Dist) -> int:
    random.seed(cfg.seed + d.rank)
    np.random.seed(cfg.seed + d.rank)
    torch.manual_seed(cfg.seed + d.rank)
    data_dir = resolve_dataset(cfg.data, d.local_rank == 0, dist.barrier)
    data = TrainBatches(data_dir, cfg.data.seq_len, cfg.global_batch_size, cfg.micro_batch_size,
                        d.rank, d.world_size, cfg.seed, d.device)
    model = build_model(cfg, d)
    if data.vocab_size > model.args.vocab_size:
        raise ValueError(f"data.dataset: {data_dir} has vocab {data.vocab_size} > model vocab {model.args.vocab_size}")
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.steps)
    ckpt = Checkpointer(cfg.checkpoint, flavor=cfg.model.flavor, config=cfg.to_dict(),
                        config_hash=cfg.config_hash(), rank=d.rank, world_size=d.world_size)
    metrics = Metrics(cfg.metrics, is_rank0=d.rank == 0, world_size=d.world_size, device=d.device,
                      flops_per_token=flops_per_token(model.args, model.num_params(exclude_embedding=True), cfg.data.seq_len))
    progress = Progress(ckpt.root, cfg.steps, enabled=d.rank == 0)
    tokens_per_step = cfg.global_batch_size * cfg.data.seq_len

    step, resumed_from, latest = 0, None, ckpt.latest()
    if latest is not None:
        ckpt.load(latest[1], model, optimizer, scheduler, data)
        step = resumed_from = latest[0]
        metrics.emit("resume", from_step=step, path=latest[1])
    progress.start(resumed_from, latest[1] if latest else None, step * tokens_per_step)
    stops = StopRequests(d.device)

    def save(reason: str) -> float:
        if not ckpt.enabled:
            log(d, f"step {step}: no checkpoint.uri, not saving ({reason})")
            return 0.0
        start = time.perf_counter()
        path = ckpt.save(step, model, optimizer, scheduler, data,
                         tokens_seen=step * tokens_per_step, wall_time_s=progress.wall_time_s)
        seconds = time.perf_counter() - start
        metrics.emit("checkpoint", step=step, seconds=round(seconds, 3), path=path, reason=reason)
        metrics.gauge("checkpoint_seconds", seconds)
        progress.update(latest_checkpoint=path)
        return seconds

    try:
        metrics.start_window()
        while step < cfg.steps:
            step += 1
            lr = scheduler.get_last_lr()[0]  # the lr this step uses
            loss, grad_norm = train_step(model, optimizer, scheduler, data.next_batch(), cfg, step, d.rank)
            metrics.count_tokens(tokens_per_step)
            metrics.log_step(step=step, loss=loss, grad_norm=grad_norm, lr=lr, force=step == cfg.steps)
            progress.update(step=step, loss=loss, tokens_seen=step * tokens_per_step)
            maybe_simulate_preemption(cfg, step, resumed_from, d, stops)
            stop, checkpoint_now = stops.agree()
            if stop:
                seconds = save("preemption")
                progress.update(status="preempted")
                metrics.emit("preempted", step=step, seconds_to_save=round(seconds, 3),
                             grace_period_s=cfg.checkpoint.grace_period_s)
                if seconds > cfg.checkpoint.grace_period_s:
                    log(d, f"WARNING: preemption save took {seconds:.1f}s > grace period {cfg.checkpoint.grace_period_s}s")
                return PREEMPTED_EXIT_CODE
            if checkpoint_now:
                save("checkpoint-now")
            elif cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < cfg.steps:
                save("interval")
        save("final")
        progress.update(status="completed")
        metrics.emit("done", step=step, loss=progress.state["loss"], tokens_seen=step * tokens_per_step)
        return 0
    except BaseException:
        progress.update(status="failed")
        raise
    finally:
        metrics.close()


def maybe_simulate_preemption(cfg: TrainConfig, step: int, resumed_from: int | None, d: Dist, stops: StopRequests) -> None:
    """Rank 0 sends the real SIGTERM a platform would, once: not again after resuming past it."""
    k = cfg.simulate_preemption_at_step
    if d.rank != 0 or k == 0 or step != k or (resumed_from is not None and resumed_from >= k):
        return
    # Stop at this boundary, not whenever the agent's forwarded signal happens to land.
    stops.stop = True
    target = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else os.getpid()
    log(d, f"step {step}: simulating preemption, SIGTERM to pid {target}")
    os.kill(target, signal.SIGTERM)


def log(d: Dist, message: str) -> None:
    if d.rank == 0:
        print(f"[trainer] {message}", file=sys.stderr, flush=True)
