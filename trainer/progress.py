"""progress.json: the job's live status for the Airflow operator, kept across attempts.

Written by rank 0, atomically, after every step (the file is tiny), at every
checkpoint and on exit. Fields::

    status             "running" | "completed" | "preempted" | "failed"
    step, steps        last completed step, target steps
    loss               last loss
    tokens_seen        global tokens consumed up to `step`
    resumed_from_step  checkpoint step this attempt started from, or null
    steps_lost         cumulative: steps trained by earlier attempts past their last checkpoint
    latest_checkpoint  absolute path of the newest committed checkpoint, or null
    attempt            1 for the first start, +1 for each restart
    wall_time_s        training wall time summed over attempts
    history            [[step, loss], ...]: the loss curve, at most HISTORY_POINTS points
                       (thinned evenly as it grows), without steps a resume trains again
    updated_at         unix time
"""

import json
import os
import time

from trainer.checkpoint import write_json_atomic

FILENAME = "progress.json"
HISTORY_POINTS = 1000


class Progress:
    def __init__(self, root: str | None, steps: int, enabled: bool):
        """root: the local checkpoint directory (None: no progress file); enabled: rank 0 only."""
        self.path = os.path.join(root, FILENAME) if (root and enabled) else None
        if self.path:
            os.makedirs(root, exist_ok=True)
        self.steps = steps
        self.attempt, self.steps_lost, self.prior_wall_s = 1, 0, 0.0
        self.resumed_from_step: int | None = None
        self.history: list[list[float]] = []
        self.start_time = time.monotonic()
        self.state = {"status": "running", "step": 0, "loss": None, "tokens_seen": 0, "latest_checkpoint": None}

    def start(self, resumed_from_step: int | None, latest_checkpoint: str | None, tokens_seen: int) -> None:
        """Carry the counters of the previous attempt (if any) over into this one."""
        self.resumed_from_step = resumed_from_step
        start_step = resumed_from_step or 0
        previous = self._read()
        if previous is not None:
            self.attempt = int(previous.get("attempt", 1)) + 1
            # The previous attempt trained up to its `step`; whatever lies past the
            # checkpoint we restart from is trained again.
            self.steps_lost = int(previous.get("steps_lost", 0)) + max(0, int(previous.get("step", 0)) - start_step)
            self.prior_wall_s = float(previous.get("wall_time_s", 0.0))
            if previous.get("step") == start_step:
                self.state["loss"] = previous.get("loss")
            self.history = [p for p in previous.get("history", []) if p[0] <= start_step]
        self.state.update(step=start_step, tokens_seen=tokens_seen, latest_checkpoint=latest_checkpoint)
        self.update()

    def update(self, **fields) -> None:
        self.state.update(fields)
        if self.path is None:
            return
        if "step" in fields and fields.get("loss") is not None:
            self.history.append([fields["step"], round(float(fields["loss"]), 6)])
            if len(self.history) > HISTORY_POINTS:
                self.history = self.history[::2]  # halve the resolution, keep the whole run
        write_json_atomic(self.path, {
            **self.state,
            "steps": self.steps,
            "resumed_from_step": self.resumed_from_step,
            "steps_lost": self.steps_lost,
            "attempt": self.attempt,
            "wall_time_s": round(self.wall_time_s, 3),
            "history": self.history,
            "updated_at": time.time(),
        })

    @property
    def wall_time_s(self) -> float:
        return self.prior_wall_s + time.monotonic() - self.start_time

    def _read(self) -> dict | None:
        if self.path is None or not os.path.exists(self.path):
            return None
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None  # unreadable: start the counters afresh rather than refuse to train
