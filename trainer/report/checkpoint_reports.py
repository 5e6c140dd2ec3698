"""What a training attempt reports of its checkpoints and its spend: events, statsd gauges and
progress.json for each committed save, a warning when saves come faster than they commit, the cost."""

import math

from trainer.money.ledger import CAPACITY_TYPES
from trainer.step.process_group import log


class CheckpointReports:
    """Job's reporting half (trainer/train.py): it reads the Job's checkpointer, metrics, progress, cost
    and budget, and keeps the slow-save count and the last save's time."""

    def warn_slow_saves(self, step: int, behind: int, waited: float) -> None:
        """An interval save found the previous one still in flight: the interval is shorter than a save,
        and training stands still at every save. Said at the 1st, 10th, 100th... such save (the events have
        each)."""
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
            # its own time, not its wait for the one before
            self._last_save_s = c["seconds"] - c.get("waited_s", 0.0)
            if self.budget is not None:
                self.budget.observe_save(c["seconds"])
            # unknown overlap: at least what it blocked
            took = cost["cost_s"] if cost["cost_s"] is not None else c["blocked_s"]
            self.progress.update(
                latest_checkpoint=c["path"],
                checkpoint_step=c["step"],
                checkpoint_cost_s=round(self.progress.state.get("checkpoint_cost_s", 0.0) + took, 3),
            )
            self.gauge_cost()

    def gauge_cost(self) -> None:
        """The spend so far (statsd): <prefix>.cost.dollars and <prefix>.cost.gpu_hours, and the cap
        beside it."""
        ledger = self.cost.snapshot()
        # the job's spend as the budget counts it: every attempt's spend file, this one live
        dollars = self.budget.spent() if self.budget is not None and self.budget.dir is not None else None
        self.metrics.gauge("cost.dollars", ledger["total_dollars"] if dollars is None else round(dollars, 9))
        self.metrics.gauge("cost.gpu_hours", round(sum(ledger[c]["gpu_hours"] for c in CAPACITY_TYPES), 6))
        if self.cfg.cost.budget_usd:
            self.metrics.gauge("cost.budget_dollars", self.cfg.cost.budget_usd)
