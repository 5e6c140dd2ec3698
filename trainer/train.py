"""The training loop: resume → loop { step; stop or checkpoint if asked } → final checkpoint.

Runs under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment) or as one plain process, which still joins a 1-rank process group so
that both take the same code path. Returns the process exit code (see trainer.config).
"""

import dataclasses
import math
import os
import random
import signal
import socket
import sys
import time
from datetime import timedelta
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from trainer.checkpoint import Checkpointer
from trainer.auto_batch import fit_micro_batch_size
from trainer.cost import CAPACITY_TYPES, CostLedger, nodes_in_group
from trainer.budget import BudgetGuard, attempt_name
from trainer.checkpoint_dir import CheckpointDir
from trainer.config import BUDGET_EXIT_CODE, PREEMPTED_EXIT_CODE, ConfigError, ParallelConfig, TrainConfig
from trainer import hf
from trainer.data import TrainBatches, default_data_dir, eval_batches, resolve_dataset
from trainer.metrics import Metrics, SaveOverlap, flops_per_token
from trainer.model import Llama, ModelArgs
from trainer.parallelize import (
    build_mesh,
    build_optimizer,
    build_scheduler,
    clip_grads,
    needs_fsdp,
    parallelize,
    set_grad_sync,
)
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


def setup_distributed(parallel: ParallelConfig | None = None) -> Dist:
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
    timeout = timedelta(seconds=(parallel or ParallelConfig()).collective_timeout_s)
    dist.init_process_group(backend, init_method="env://", timeout=timeout)
    # One line from every rank, so a group's log shows who joined where.
    print(
        f"[trainer] rank {rank}/{world_size} (local rank {local_rank}) on {socket.gethostname()}, "
        f"device {device}, backend {backend}",
        file=sys.stderr,
        flush=True,
    )
    mesh = build_mesh(device.type, world_size, parallel or ParallelConfig())
    if rank == 0 and mesh.ndim > 1:
        print(
            f"[trainer] HSDP mesh {dict(zip(mesh.mesh_dim_names, mesh.shape))}", file=sys.stderr, flush=True
        )
    return Dist(rank, local_rank, world_size, device, mesh)


class StopRequests:
    """Signals set flags; ranks act on them only at a step boundary, together.

    SIGTERM/SIGINT: save and exit 75. SIGUSR1: save now, carry on. A signal that reached
    only some ranks (one node's) still stops all: agree() takes the max over ranks.
    """

    def __init__(self):
        self.stop = self.checkpoint_now = self.budget = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_checkpoint_now)

    def _on_stop(self, signum, frame) -> None:
        self.stop = True

    def _on_checkpoint_now(self, signum, frame) -> None:
        self.checkpoint_now = True

    def ignore_further_signals(self) -> None:
        """Once every rank is stopping, another SIGTERM has nothing left to ask. When the
        first rank exits, torchrun SIGTERMs the others; Python restores the default
        (fatal) action while it shuts down, which would turn their exit 75 into a death
        by signal. An ignored signal stays ignored."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)

    def agree(self) -> tuple[bool, bool, bool]:
        """(stop, checkpoint now, stop at the budget) as any rank asked; every rank gets the same answer."""
        # Taken before the collective: a SIGUSR1 that lands while it waits for the other ranks is kept for
        # the next boundary (clearing the flag after it dropped such a request without a trace).
        checkpoint_now, self.checkpoint_now = self.checkpoint_now, False
        # A CPU tensor: gloo carries it even beside NCCL, so this never waits for the GPU.
        flags = torch.tensor([self.stop, checkpoint_now, self.budget], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1]), bool(flags[2])


INIT_EVAL_BATCHES = 4
"""Held-out micro-batches evaluated at step 0 of a job that starts from an init_from model."""


# Test hook, named as such: SECONDS that every step also sleeps (as a slower machine's step would take), so that
# the tests' long-running and time-capped groups leave the CPU to the tests running beside them.
_TEST_STEP_SLEEP_ENV = "DTRAIN_TEST_STEP_SLEEP"


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
            "one process on a CPU: the model is not wrapped with FSDP2 (nothing to shard, no mixed precision)",
        )
    offload = cfg.parallel.cpu_offload and d.device.type == "cuda"
    model.to_empty(device="cpu" if offload else d.device)  # each rank allocates only its shards
    model.init_weights(cfg.seed, parameters=random_init)
    if offload:  # FSDP keeps the parameters in host memory; the rotary tables are used on the GPU
        model.rope_cos, model.rope_sin = model.rope_cos.to(d.device), model.rope_sin.to(d.device)
    return model


def train_step(model, optimizer, scheduler, micro_batches, cfg: TrainConfig, before_optimizer_step=None):
    """Forward/backward over this rank's micro-batches, then one optimizer step.

    Returns (loss, grad_norm) as 0-d tensors on the device, not read yet: the global batch's
    mean loss (all-reduced) and the global gradient norm before clipping. Reading them
    (.item()) waits for the device, so the training loop reads a step's values only after
    it has queued the next one (see Job.settle).

    before_optimizer_step: called right before the parameters and the optimizer state change
    (an async checkpoint's copy of them, which overlapped forward/backward, is joined there).
    """
    loss_sum = torch.zeros((), device=micro_batches[0][0].device)
    for i, (inputs, targets) in enumerate(micro_batches):  # each (micro_batch, seq_len)
        if len(micro_batches) > 1:  # (sync is on after every step: the last micro-step turns it on)
            set_grad_sync(model, i == len(micro_batches) - 1)
        # the mean loss over (micro_batch, seq_len) tokens; the logits are never whole (trainer/loss.py)
        loss = model(inputs, targets, loss_chunk_tokens=cfg.parallel.loss_chunk_tokens)
        # Every micro-batch holds the same number of tokens, so dividing by the count here
        # and FSDP's mean over ranks give the gradient of the global mean loss.
        (loss / len(micro_batches)).backward()
        loss_sum += loss.detach()
    grad_norm = clip_grads(model, cfg.optim.grad_clip)
    loss = loss_sum / len(micro_batches)
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # the logged loss is the global batch's
    if before_optimizer_step is not None:
        before_optimizer_step()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm


def train(cfg: TrainConfig) -> int:
    """Train to cfg.steps or until stopped; returns 0 or PREEMPTED_EXIT_CODE."""
    cfg.validate_world_size(world_size_from_env())  # fail before joining the group
    d = setup_distributed(cfg.parallel)
    try:
        job = Job.build(cfg, d)
        return job.run()
    finally:
        dist.destroy_process_group()


@dataclass
class Job:
    """Everything one training attempt holds; run() is the algorithm."""

    cfg: TrainConfig
    d: Dist
    stops: StopRequests
    ckpt: Checkpointer
    data: TrainBatches
    model: Llama
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    metrics: Metrics
    progress: Progress
    cost: CostLedger
    budget: BudgetGuard | None  # rank 0 only
    data_dir: str = ""  # the token directory (the held-out split is read from it)
    resume_point: tuple[int, str] | None = None  # the verified checkpoint to resume from (None: from scratch)
    resumed_from: int | None = None  # the step this attempt resumed from (None: from scratch)
    hf_source: dict | None = None  # the init_from model's config files and dtype, for the export (trainer.hf)
    _unsettled: tuple | None = None  # (step, lr, loss, grad_norm) of the last step, not read yet
    _last_step_end: float = 0.0
    _budget_stop: dict | None = None  # rank 0: why the job stops at its cap
    overlap: SaveOverlap = field(default_factory=SaveOverlap)  # what each save cost the steps around it
    _slow_saves: int = 0  # interval saves that had to wait for the previous one to commit
    _last_save_s: float = (
        0.0  # how long the last committed save took (not counting a wait for the one before)
    )
    _test_step_sleep: float = field(default_factory=lambda: float(os.environ.get(_TEST_STEP_SLEEP_ENV) or 0))

    def run(self) -> int:
        cfg = self.cfg
        step = self.start()
        failed = None
        try:
            while step < cfg.steps:
                step += 1
                stop = self.step(step)
                if stop == "budget":
                    return self.stopped_at_budget(step)
                if stop:
                    return self.preempted(step)
            self.save(step, "final", blocking=True)
            self.progress.update(status="completed")
            self.metrics.emit(
                "done", step=step, loss=self.progress.state["loss"], tokens_seen=self.tokens(step)
            )
            return 0
        except BaseException as err:
            failed = err
            # The storage that refused a checkpoint may refuse the status file too: that must not hide why.
            self._best_effort(lambda: self.progress.update(status="failed"), failed)
            raise
        finally:
            self.ckpt.close()
            self.metrics.close()
            if self.budget is not None:
                # "exited": this attempt spends no more (the provider, if any, still bills its teardown)
                self._best_effort(
                    lambda: self.budget.record(force=True, step=self.progress.state.get("step"), exited=True),
                    failed,
                )

    def _best_effort(self, write, failed: BaseException | None) -> None:
        """Run a status write; while another error is on its way out, a failing write is logged, not raised."""
        if failed is None:
            write()
            return
        try:
            write()
        except OSError as err:
            log(self.d, f"could not record the end of this attempt ({err}) after: {type(failed).__name__}")

    def start(self) -> int:
        """Resume (if there is a checkpoint) and start the clocks; returns the step trained so far."""
        step, self.resumed_from = self.resume()
        if self.resumed_from is None and self.cfg.model.init_from:
            self.evaluate_start()
        self.metrics.start_window()
        self._last_step_end = time.perf_counter()
        return step

    @torch.no_grad()
    def evaluate_start(self) -> None:
        """The held-out loss of the weights a job starts from (the init_from model's): an "eval" event at
        step 0, over the first INIT_EVAL_BATCHES micro-batches of the held-out split, which every rank
        evaluates whole (the model is sharded: all ranks run each forward)."""
        self.model.eval()
        total, tokens = 0.0, 0
        for inputs, targets in eval_batches(
            self.data_dir, self.cfg.data.seq_len, self.cfg.micro_batch_size, INIT_EVAL_BATCHES, self.d.device
        ):
            total += float(self.model(inputs, targets)) * targets.numel()
            tokens += targets.numel()
        self.model.train()
        if self.d.rank == 0 and tokens:
            self.metrics.emit(
                "eval", step=0, loss=total / tokens, tokens=tokens, source=self.cfg.model.init_from
            )

    def step(self, step: int) -> bool | str:
        """Train step `step` and do its bookkeeping; True when the group agreed to stop after it,
        "budget" when it must stop there to stay within its dollar cap.

        No device sync per step: the step's loss and grad norm are read (settle) once the
        next step is queued, or right away when they are logged, saved or stopped on.
        """
        cfg = self.cfg
        lr = self.scheduler.get_last_lr()[0]  # the lr this step uses
        loss, grad_norm = train_step(
            self.model,
            self.optimizer,
            self.scheduler,
            self.data.next_batch(),
            cfg,
            before_optimizer_step=self.ckpt.wait_for_staging,
        )
        if self._test_step_sleep:
            time.sleep(self._test_step_sleep)
        self.settle()  # the previous step's: the device finished it while this one was queued
        self._unsettled = (step, lr, loss, grad_norm)
        now = time.perf_counter()
        self.cost.time_step(now - self._last_step_end)
        self.overlap.step(now - self._last_step_end)
        if self.budget is not None:
            if (
                not self.budget.recent
            ):  # the first step of this attempt: what a relaunch costs before training
                self.budget.startup_s = time.time() - self.cost.launched_at
            self.budget.observe_step(now - self._last_step_end)
            self.budget.record(step=step)
            self.stops.budget = self.stops.budget or self._over_budget(step) is not None
        self._last_step_end = now
        self.metrics.count_tokens(self.tokens(1))
        if step % cfg.metrics.log_every == 0 or step == cfg.steps:
            self.settle()
        self.report_checkpoints()  # an async save commits in the background
        maybe_simulate_preemption(cfg, step, self.resumed_from, self.d, self.stops)
        stop, checkpoint_now, budget = self.stops.agree()
        if stop or budget:
            self.settle()
            return "budget" if budget and not stop else True
        if checkpoint_now or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < cfg.steps):
            self.settle()  # a non-finite step is never saved
            self.save(step, "checkpoint-now" if checkpoint_now else "interval")
        return False

    def _over_budget(self, step: int) -> dict | None:
        over = self.budget.over()
        if over is not None:
            self._budget_stop = {"step": step, **over}
        return over

    def settle(self) -> None:
        """Read the last step's loss and grad norm: fail on a non-finite one, log and record it."""
        if self._unsettled is None:
            return
        (step, lr, loss, grad_norm), self._unsettled = self._unsettled, None
        loss, grad_norm = loss.item(), grad_norm.item()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise FloatingPointError(
                f"step {step}, rank {self.d.rank}: non-finite loss {loss} or grad norm {grad_norm}"
            )
        logged = step % self.cfg.metrics.log_every == 0 or step == self.cfg.steps
        speed = self.metrics.log_step(
            step=step, loss=loss, grad_norm=grad_norm, lr=lr, force=step == self.cfg.steps
        )
        self.progress.update(step=step, loss=loss, lr=lr, tokens_per_s=speed, tokens_seen=self.tokens(step),
                             flush=logged)  # fmt: skip
        if logged:
            self.gauge_cost()

    @classmethod
    def build(cls, cfg: TrainConfig, d: Dist) -> "Job":
        stops = StopRequests()  # first: a SIGTERM while loading must not kill us unsaved
        random.seed(cfg.seed + d.rank)
        np.random.seed(cfg.seed + d.rank)
        torch.manual_seed(cfg.seed + d.rank)
        # The data first: a bad dataset is refused before the checkpoint directory is touched (no lease taken).
        data_dir = resolve_dataset(cfg.data, d.local_rank == 0, dist.barrier)
        data = TrainBatches(
            data_dir,
            cfg.data.seq_len,
            cfg.global_batch_size,
            cfg.micro_batch_size,
            d.rank,
            d.world_size,
            cfg.seed,
            d.device,
        )
        hf_dir = None
        if cfg.model.init_from:  # each node's local rank 0 copies a remote model first
            if d.local_rank == 0:
                hf_dir = hf.local_copy(cfg.model.init_from, default_data_dir())
            dist.barrier()
            hf_dir = hf.local_copy(cfg.model.init_from, default_data_dir())
        args = hf.model_args(
            cfg, hf_dir
        )  # a bad config.json is refused before the checkpoint directory is touched
        if hf_dir is not None:  # so is data of another tokenizer than the model's
            hf.check_data_tokenizer(hf_dir, cfg.model.init_from, cfg.data.dataset, data.tokenizer)
        # data.tokenizer: manifests record it, and a checkpoint of another tokenizer's data is refused.
        ckpt = Checkpointer(
            cfg.checkpoint,
            flavor=cfg.model.flavor,
            shape=dataclasses.asdict(args),
            config=cfg.to_dict(),
            config_hash=cfg.config_hash(),
            rank=d.rank,
            world_size=d.world_size,
            device=d.device,
            tokenizer=data.tokenizer,
            collective_timeout_s=cfg.parallel.collective_timeout_s,
        )
        point = ckpt.resume_point()  # the newest checkpoint that verifies (rank 0 decides)
        if point is not None:
            ckpt.check_compatible(point[1])  # before building a model it cannot fill
            for skipped in point[2] if d.rank == 0 else ():
                log(
                    d,
                    f"checkpoint {skipped['checkpoint']} fails verification ({skipped['check']}: "
                    f"{skipped['file']}: {skipped['detail']}); resuming from an older one",
                )
        # A model that is loaded whole next skips the random draw (on a large model, most of a start-up).
        model = build_model(cfg, d, args, random_init=point is None and hf_dir is None)
        if hf_dir is not None and point is None:  # a fresh job starts from the source's weights
            n = hf.load_weights(model, hf_dir, cfg.model.init_from)
            if d.rank == 0:
                log(d, f"initialised {n} tensors from {cfg.model.init_from}")
        if cfg.parallel.auto_micro_batch_size:  # same global batch; accumulation absorbs the change
            cfg = fit_micro_batch_size(cfg, model, d.device, d.world_size, log=lambda m: log(d, m))
            data.micro_batch_size = cfg.micro_batch_size
        if data.vocab_size > model.args.vocab_size:
            raise ConfigError(
                f"data.dataset: {data_dir} has vocab {data.vocab_size} > model vocab {model.args.vocab_size}"
            )
        optimizer = build_optimizer(model, cfg.optim)
        fpt = flops_per_token(model.args, model.num_params(exclude_embedding=True), cfg.data.seq_len)
        ledger_uri = cfg.cost.ledger_uri or cfg.checkpoint.uri
        spend_dir = CheckpointDir(ledger_uri) if ledger_uri else None
        opened = (spend_dir.spend_entry(attempt_name()) or {}) if spend_dir is not None else {}
        cost = CostLedger(
            price_per_node_hour=cfg.cost.price_per_node_hour,
            capacity_type=cfg.cost.capacity_type,
            gpus_per_node=cfg.cost.gpus_per_node,
            nodes=nodes_in_group(d.world_size),
            since=opened.get("launched_at"),
        )
        return cls(
            cfg=cfg,
            d=d,
            stops=stops,
            ckpt=ckpt,
            data=data,
            data_dir=data_dir,
            model=model,
            optimizer=optimizer,
            resume_point=None if point is None else (point[0], point[1]),
            hf_source=hf.source_record(hf_dir, cfg.model.init_from) if hf_dir and d.rank == 0 else None,
            scheduler=build_scheduler(optimizer, cfg.optim, cfg.steps),
            metrics=Metrics(
                cfg.metrics,
                is_rank0=d.rank == 0,
                rank=d.rank,
                world_size=d.world_size,
                device=d.device,
                flops_per_token=fpt,
            ),
            progress=Progress(ckpt.root, cfg.steps, enabled=d.rank == 0),
            cost=cost,
            budget=BudgetGuard(cfg.cost, cost, spend_dir, attempt_name(), cfg.checkpoint.grace_period_s)
            if d.rank == 0
            else None,
        )

    def tokens(self, steps: int) -> int:
        return steps * self.cfg.global_batch_size * self.cfg.data.seq_len

    def resume(self) -> tuple[int, int | None]:
        """Load the latest committed checkpoint, if any; returns (step, resumed_from_step)."""
        latest = self.resume_point
        step, resumed_from = 0, None
        if latest is not None:
            manifest = self.ckpt.load(latest[1], self.model, self.optimizer, self.scheduler, self.data)
            self.cost.carry(manifest.get("cost"), manifest.get("step_time_s"))
            step = resumed_from = latest[0]
            self.metrics.emit("resume", from_step=step, path=latest[1])
        self.progress.start(resumed_from, latest[1] if latest else None, self.tokens(step))
        return step, resumed_from

    def save(self, step: int, reason: str, *, blocking: bool = False) -> float:
        """Checkpoint `step` (all ranks); returns the seconds training was held up.

        blocking: return once committed (final, preemption). Otherwise an async save
        returns after the copy to host memory and report_checkpoints() reports its commit.
        """
        if not self.ckpt.enabled:
            log(self.d, f"step {step}: no checkpoint.uri, not saving ({reason})")
            return 0.0
        start = time.perf_counter()
        fields = {
            "tokens_seen": self.tokens(step),
            "wall_time_s": round(self.progress.wall_time_s, 3),
            "step_time_s": self.cost.step_time_s,
            "cost": self.cost.snapshot(),
            **({"hf_source": self.hf_source} if self.hf_source else {}),
        }
        self.ckpt.save(
            step,
            self.model,
            self.optimizer,
            self.scheduler,
            self.data,
            manifest_fields=fields,
            reason=reason,
            blocking=blocking,
        )
        seconds = time.perf_counter() - start
        self.overlap.saved(step, in_background=self.ckpt.in_flight)
        self.report_checkpoints()
        if self.ckpt.waited is not None and reason == "interval":
            self.warn_slow_saves(step, *self.ckpt.waited)
        return seconds

    def warn_slow_saves(self, step: int, behind: int, waited: float) -> None:
        """An interval save found the previous one still in flight: the interval is shorter than a save, and
        training stands still at every save. Said at the 1st, 10th, 100th... such save (the events have each)."""
        self._slow_saves += 1
        if str(self._slow_saves).rstrip("0") != "1":
            return
        every, step_s = self.cfg.checkpoint.every, self.overlap.reference() or self.cost.step_time_s or 0.0
        advice = (
            f"; checkpoint.every >= {math.ceil(self._last_save_s / step_s) + 1} would let each save finish "
            "in the background"
            if step_s and self._last_save_s
            else ""
        )
        log(
            self.d,
            f"step {step}: this save waited {waited:.1f}s for the save of step {behind} to commit "
            f"({self._slow_saves} so far): checkpoint.every={every} steps (~{every * step_s:.1f}s of "
            f"training) is shorter than one save ({self._last_save_s:.1f}s){advice}",
        )

    def report_checkpoints(self) -> None:
        """Events, gauges and progress for the saves committed since the last call."""
        if not self.ckpt.enabled:
            return
        for c in self.ckpt.completed():
            cost = self.overlap.committed(c["step"], c["blocked_s"])
            self.metrics.emit(
                "checkpoint",
                step=c["step"],
                seconds=round(c["seconds"], 3),
                path=c["path"],
                reason=c["reason"],
                blocked_s=round(c["blocked_s"], 3),
                **{"async": c.get("async", False)},
                waited_s=round(c.get("waited_s", 0.0), 3),
                **{k: v if v is None or isinstance(v, int) else round(v, 3) for k, v in cost.items()},
            )
            self.metrics.gauge("checkpoint.seconds", c["seconds"])
            self.metrics.gauge("checkpoint.blocked_seconds", c["blocked_s"])
            self.metrics.gauge("checkpoint.overlap_seconds", cost["overlap_s"])
            self.metrics.gauge("checkpoint.cost_seconds", cost["cost_s"])
            self._last_save_s = c["seconds"] - c.get(
                "waited_s", 0.0
            )  # its own time, not its wait for the one before
            if self.budget is not None:
                self.budget.observe_save(c["seconds"])
            took = (
                cost["cost_s"] if cost["cost_s"] is not None else c["blocked_s"]
            )  # unknown overlap: at least
            self.progress.update(
                latest_checkpoint=c["path"],
                checkpoint_step=c["step"],
                checkpoint_cost_s=round(self.progress.state.get("checkpoint_cost_s", 0.0) + took, 3),
            )
            self.gauge_cost()

    def gauge_cost(self) -> None:
        """The spend so far (statsd): <prefix>.cost.dollars and <prefix>.cost.gpu_hours, and the cap beside it."""
        ledger = self.cost.snapshot()
        # the job's spend as the budget counts it: every attempt's spend file, this one live
        dollars = self.budget.spent() if self.budget is not None and self.budget.dir is not None else None
        self.metrics.gauge("cost.dollars", ledger["total_dollars"] if dollars is None else round(dollars, 9))
        self.metrics.gauge("cost.gpu_hours", round(sum(ledger[c]["gpu_hours"] for c in CAPACITY_TYPES), 6))
        if self.cfg.cost.budget_usd:
            self.metrics.gauge("cost.budget_dollars", self.cfg.cost.budget_usd)

    def preempted(self, step: int) -> int:
        self.stops.ignore_further_signals()
        seconds = self.save(step, "preemption", blocking=True)
        self.progress.update(status="preempted")
        grace = self.cfg.checkpoint.grace_period_s
        self.metrics.emit("preempted", step=step, seconds_to_save=round(seconds, 3), grace_period_s=grace)
        verdict = "within" if seconds <= grace else "WARNING: longer than"
        log(
            self.d,
            f"preempted at step {step}: checkpoint saved in {seconds:.1f}s, {verdict} the {grace}s grace period",
        )
        return PREEMPTED_EXIT_CODE

    def stopped_at_budget(self, step: int) -> int:
        """Save the step reached and stop: going on would pass the job's dollar cap."""
        self.stops.ignore_further_signals()
        why = self._budget_stop or {}
        if self.d.world_size > 1:  # rank 0 decided; every rank logs the same reason
            box = [why]
            dist.broadcast_object_list(box, src=0)
            why = box[0]
        seconds = self.save(step, "budget", blocking=True)
        self.progress.update(status="stopped_at_budget", budget=why)
        self.metrics.emit("budget_stop", seconds_to_save=round(seconds, 3), **{**why, "step": step})
        log(
            self.d,
            f"stopped at step {step} of {self.cfg.steps} to stay within the ${self.cfg.cost.budget_usd:.2f} "
            f"budget: ${why.get('spent_usd', 0):.4f} spent, ${why.get('projected_usd', 0):.4f} by the time "
            f"another step, a save and the exit could end (step {why.get('step_time_s')} s, save "
            f"{why.get('save_s')} s, ${why.get('usd_per_hour')}/h); checkpoint saved in {seconds:.1f}s",
        )
        return BUDGET_EXIT_CODE


def maybe_simulate_preemption(
    cfg: TrainConfig, step: int, resumed_from: int | None, d: Dist, stops: StopRequests
) -> None:
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
