"""The training loop: resume → loop { step; stop or checkpoint if asked } → final checkpoint.

Runs under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment) or as one plain process, which still joins a 1-rank process group so
that both take the same code path. Returns the process exit code (see trainer.config.job_config).
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainer import torch_private

from trainer.model import hf

from trainer.step import setup as job_setup
from trainer.money.cap import BudgetGuard
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.config.job_config import BUDGET_EXIT_CODE, PREEMPTED_EXIT_CODE, TrainConfig
from trainer.contract import JobEnv, simulate_preemption
from trainer.money.ledger import CostLedger
from trainer.data.loader import TrainBatches, eval_batches
from trainer.step.process_group import (
    Dist,
    StopRequests,
    log,
    setup_distributed,
    world_fields,
    world_size_from_env,
)
from trainer.report.checkpoint_reports import CheckpointReports
from trainer.report.metrics import Metrics, SaveOverlap
from trainer.model.llama import Llama
from trainer.model.parallelize import build_optimizer, build_scheduler
from trainer.report.progress import Progress
from trainer.elastic.startup import StartupClock
from trainer.step.train_step import train_step

# Imported from here by benchmarks and tests: the process group and the step live in their own modules.

StepHook = Callable[[int], None]
"""Called with each step number once the step is queued: a seam for tests (checkpoint/faults.py)."""

INIT_EVAL_BATCHES = 4
"""Held-out micro-batches evaluated at step 0 of a job that starts from an init_from model."""


def train(cfg: TrainConfig, *, step_hook: StepHook | None = None, startup: StartupClock | None = None) -> int:
    """Train to cfg.steps or until stopped; returns 0 or PREEMPTED_EXIT_CODE. ``startup``: the process's
    start clock (``trainer/elastic/startup.py``), from ``python -m trainer``'s main; else from here."""
    cfg.validate_world_size(world_size_from_env())  # fail before joining the group
    startup = startup or StartupClock(started_at=time.time())
    d = setup_distributed(cfg.parallel)
    startup.mark("process_group")
    log(d, torch_private.startup_line())  # the torch and every fallback in force (trainer/torch_private/)
    try:
        job = Job.build(cfg, d)
        startup.mark("build")
        job.step_hook, job.startup = step_hook, startup
        return job.run()
    finally:
        dist.destroy_process_group()


@dataclass
class Job(CheckpointReports):
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
    hf_source: dict | None = (
        None  # the init_from model's config files and dtype, for the export (trainer.model.hf)
    )
    _unsettled: tuple | None = None  # (step, lr, loss, grad_norm) of the last step, not read yet
    _last_step_end: float = 0.0
    _budget_stop: dict | None = None  # rank 0: why the job stops at its cap
    overlap: SaveOverlap = field(default_factory=SaveOverlap)  # what each save cost the steps around it
    _slow_saves: int = 0  # interval saves that had to wait for the previous one to commit
    # how long the last committed save took (not counting a wait for the one before)
    _last_save_s: float = 0.0
    step_hook: StepHook | None = None  # see StepHook
    startup: StartupClock | None = None  # where this process's start went, until its first step

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
        """Run a status write; while another error is on its way out, a failing write is logged, not
        raised."""
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
        if self.startup is not None:
            self.startup.mark("load")
        if self.resumed_from is None and self.cfg.model.init_from:
            self.evaluate_start()
        self.metrics.emit("world", step=step, **world_fields(self.d.world_size))
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
        if self.step_hook is not None:
            self.step_hook(step)
        if cfg.checkpoint.every:  # the first interval save then costs what the later ones do
            self.ckpt.warm_up_staging(self.model, self.optimizer, self.scheduler, self.data, step)
        self.settle()  # the previous step's: the device finished it while this one was queued
        self._unsettled = (step, lr, loss, grad_norm)
        if self.startup is not None:  # this process's first step
            self.started(step)
        now = time.perf_counter()
        self.cost.time_step(now - self._last_step_end)
        self.overlap.step(now - self._last_step_end)
        if self.budget is not None:
            if (
                not self.budget.recent
            ):  # the first step of this attempt: what a relaunch costs before training
                self.budget.startup_s = self.cost.clock() - self.cost.launched_at
            self.budget.observe_step(now - self._last_step_end)
            self.budget.record(step=step)
            self.stops.budget = self.stops.budget or self._over_budget(step) is not None
        self._last_step_end = now
        self.metrics.count_tokens(self.tokens(1))
        if step % cfg.metrics.log_every == 0 or step == cfg.steps:
            self.settle()
        self.report_checkpoints()  # an async save commits in the background
        self.simulate_preemption(step)
        stop, checkpoint_now, budget = self.stops.agree()
        if stop or budget:
            self.settle()
            return "budget" if budget and not stop else True
        if checkpoint_now or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < cfg.steps):
            self.settle()  # a non-finite step is never saved
            self.save(step, "checkpoint-now" if checkpoint_now else "interval")
        return False

    def started(self, step: int) -> None:
        """The first step of this process is done (waited for): say where its start went."""
        self.settle()
        self.startup.mark("first_step")
        mine = self.startup.graphs_compiled()
        # the group's first step waited for the most; -1: a rank's torch does not count them
        compiled = torch.tensor([-1 if mine is None else mine], dtype=torch.int64)
        dist.all_reduce(compiled, op=dist.ReduceOp.MAX)
        graphs = None if int(compiled) < 0 else int(compiled)
        fields = {**self.startup.fields(), "graphs_compiled": graphs}
        self.metrics.emit("startup", step=step, **fields)
        self.metrics.gauge("startup.seconds", fields["total_s"])
        self.progress.started(fields["total_s"])
        said = "graphs not counted" if graphs is None else f"{graphs} graph(s) compiled"
        log(self.d, f"{self.startup.summary()}; {said}")
        self.startup = None  # said once

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

    def simulate_preemption(self, step: int) -> None:
        """The contract's preemption simulation (trainer/contract.py), at the configured step: rank 0
        sends the real SIGTERM a platform would, once, not again after resuming past it."""
        at = self.cfg.simulate_preemption_at_step
        env = JobEnv(
            checkpoint_uri="", steps=self.cfg.steps, simulate_preemption_at_step=at, rank=self.d.rank
        )
        simulate_preemption(step, resumed_from=self.resumed_from, signals=self.stops, env=env)

    @classmethod
    def build(cls, cfg: TrainConfig, d: Dist) -> "Job":
        """Every part of an attempt, in the order that refuses a bad one before costly work."""
        stops = StopRequests()  # first: a SIGTERM while loading must not kill us unsaved
        job_setup.seed(cfg, d)
        data_dir, data = job_setup.load_data(cfg, d)
        hf_dir = job_setup.init_from_dir(cfg, d)
        args = hf.model_args(cfg, hf_dir)  # a bad config.json is refused before the checkpoint dir is touched
        if hf_dir is not None:  # so is data of another tokenizer than the model's
            hf.check_data_tokenizer(hf_dir, cfg.model.init_from, cfg.data.dataset, data.tokenizer)
        ckpt = job_setup.checkpointer(cfg, d, args, data)
        point = job_setup.resume_point(ckpt, d)
        model = job_setup.model(cfg, d, args, hf_dir, fresh=point is None)
        cfg = job_setup.fit_batch(cfg, d, model, data, data_dir)
        optimizer = build_optimizer(model, cfg.optim)
        metrics = job_setup.metrics(cfg, d, model)
        cost, budget = job_setup.cost(cfg, d)
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
            metrics=metrics,
            progress=Progress(ckpt.root, cfg.steps, enabled=d.rank == 0),
            cost=cost,
            budget=budget,
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
        self.progress.update(torch=torch_private.torch_report())  # summary.json's "torch"
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

    def preempted(self, step: int) -> int:
        self.stops.ignore_further()
        seconds = self.save(step, "preemption", blocking=True)
        self.progress.update(status="preempted")
        grace = self.cfg.checkpoint.grace_period_s
        self.metrics.emit("preempted", step=step, seconds_to_save=round(seconds, 3), grace_period_s=grace)
        verdict = "within" if seconds <= grace else "WARNING: longer than"
        log(
            self.d,
            f"preempted at step {step}: checkpoint saved in {seconds:.1f}s, {verdict} the {grace}s grace "
            "period",
        )
        return PREEMPTED_EXIT_CODE

    def stopped_at_budget(self, step: int) -> int:
        """Save the step reached and stop: going on would pass the job's dollar cap."""
        self.stops.ignore_further()
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
