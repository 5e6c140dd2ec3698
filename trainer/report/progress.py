"""progress.json: the job's live status for the Airflow operator, kept across attempts.

Written by rank 0 (atomically: a local rename, or one S3 PUT), at every checkpoint, on
every status change and on exit; in between, after every step for a local directory
(the file is tiny) and only at log intervals (metrics.log_every) for s3://, where each
write is a request. Fields::

    status             "running" | "completed" | "preempted" | "failed"
    step, steps        last completed step, target steps
    loss               last loss
    tokens_seen        global tokens consumed up to `step`
    resumed_from_step  checkpoint step this attempt started from, or null
    steps_lost         cumulative: steps trained by earlier attempts past their last checkpoint
    latest_checkpoint  path (or s3:// URL) of the newest committed checkpoint, or null
    checkpoint_step    its step
    attempt            1 for the first start, +1 for each restart
    wall_time_s        training wall time summed over attempts
    startup_s          what the attempts (and an elastic group's worker restarts) spent from their process's
                       start to their first step, summed (trainer/elastic/startup.py: rank 0's)
    checkpoint_cost_s  of it, what the committed saves took from training (blocked + the slowdown of the steps
                       an async save overlapped: the checkpoint events' cost_s), summed over attempts
    history            [[step, loss, lr, unix time, tokens/s], ...]: the curves of the evaluation report
                       (tokens/s over the metrics' log interval, null between logged steps): the
                       first step, every k-th step and the latest one, at most HISTORY_POINTS points
                       (k doubles as the run grows), without the steps a resume trains again
                       (files of earlier versions hold [step, loss] points)
    events             [{"kind", "step", "time"}, ...]: "checkpoint" (committed), and at a restart
                       the previous attempt's end ("preempted", "failed", "stopped_at_budget", ...,
                       at its last step) and "relaunch" (at the step it resumes from); the newest
                       MAX_EVENTS
    updated_at         unix time
"""

import json
import time

from trainer.checkpoint.directory import PROGRESS, CheckpointDir
from trainer.base.say import say
from trainer.base.storage import Storage

HISTORY_POINTS = 1000
MAX_EVENTS = 2000


class Progress:
    def __init__(self, root: "Storage | str | None", steps: int, enabled: bool):
        """root: the checkpoint storage or URI (None: no progress file); enabled: rank 0 only."""
        storage = Storage(root) if isinstance(root, str) else root
        self.storage = storage if (storage is not None and enabled) else None
        self.path = self.storage.path(PROGRESS) if self.storage else None
        if self.storage:
            self.storage.makedirs()
        self.steps = steps
        self.attempt, self.steps_lost, self.prior_wall_s = 1, 0, 0.0
        self.resumed_from_step: int | None = None
        self.history: list[list[float]] = []
        self.events: list[dict] = []
        self._history_json: list[str] = []  # each point serialized once: the per-step write stays cheap
        self._stride = 1  # the curve keeps every _stride-th step (see _record)
        self.start_time = time.monotonic()
        self.state = {
            "status": "running",
            "step": 0,
            "loss": None,
            "tokens_seen": 0,
            "latest_checkpoint": None,
        }

    def start(self, resumed_from_step: int | None, latest_checkpoint: str | None, tokens_seen: int) -> None:
        """Carry the counters of the previous attempt (if any) over into this one."""
        self.resumed_from_step = resumed_from_step
        start_step = resumed_from_step or 0
        previous = self._read()
        if previous is not None:
            self.attempt = int(previous.get("attempt", 1)) + 1
            # The previous attempt trained up to its `step`; whatever lies past the
            # checkpoint we restart from is trained again.
            self.steps_lost = int(previous.get("steps_lost", 0)) + max(
                0, int(previous.get("step", 0)) - start_step
            )
            self.prior_wall_s = float(previous.get("wall_time_s", 0.0))
            self.state["checkpoint_cost_s"] = float(previous.get("checkpoint_cost_s", 0.0))
            self.state["startup_s"] = float(previous.get("startup_s", 0.0))
            if previous.get("step") == start_step:
                self.state["loss"] = previous.get("loss")
            self.history = [p for p in previous.get("history", []) if p[0] <= start_step]
            self.events = list(previous.get("events") or [])
            ended = previous.get("status")
            if ended and ended != "completed":
                self.events.append(
                    {
                        "kind": "preempted" if ended == "running" else ended,
                        "step": int(previous.get("step", 0)),
                        "time": previous.get("updated_at"),
                    }
                )
            self.events.append({"kind": "relaunch", "step": start_step, "time": time.time()})
            self._history_json = [json.dumps(p) for p in self.history]
            interior = [b[0] - a[0] for a, b in zip(self.history[1:-1], self.history[2:-1])]
            self._stride = min(interior, default=1)  # go on at the previous attempt's sampling
        self.state.update(step=start_step, tokens_seen=tokens_seen, latest_checkpoint=latest_checkpoint)
        self.update()

    def started(self, seconds: float) -> None:
        """This attempt's first step is done, ``seconds`` after its process started."""
        self.update(startup_s=round(float(self.state.get("startup_s", 0.0)) + seconds, 3))

    def update(
        self, *, flush: bool = True, lr: float | None = None, tokens_per_s: float | None = None, **fields
    ) -> None:
        """Record fields; write the file now unless flush=False and the root is remote.

        ``lr``, ``tokens_per_s``: the step's learning rate and (at logged steps) throughput, for the curves
        only."""
        if fields.get("latest_checkpoint") and fields["latest_checkpoint"] != self.state.get(
            "latest_checkpoint"
        ):
            step = fields.get("checkpoint_step", self.state.get("step"))
            self.events.append({"kind": "checkpoint", "step": int(step or 0), "time": time.time()})
            if len(self.events) > MAX_EVENTS:
                self.events = self.events[-MAX_EVENTS:]
        self.state.update(fields)
        if "step" in fields and fields.get("loss") is not None:
            self._record(int(fields["step"]), float(fields["loss"]), lr, tokens_per_s)
        if self.storage is None or (not flush and self.storage.remote):
            return
        # Only a status change is worth an fsync; the per-step rewrite is only for the live view.
        durable = set(fields) - {"step", "loss", "tokens_seen"} != set()
        head = json.dumps(
            {
                **self.state,
                "steps": self.steps,
                "resumed_from_step": self.resumed_from_step,
                "steps_lost": self.steps_lost,
                "attempt": self.attempt,
                "wall_time_s": round(self.wall_time_s, 3),
                "updated_at": time.time(),
                "events": self.events,
            }
        )
        history = ", ".join(self._history_json)
        try:
            self.storage.write_text(self.path, f'{head[:-1]}, "history": [{history}]}}', durable=durable)
        except OSError as err:
            # The live view, not the job's state: a full or read-only checkpoint location must fail the next
            # checkpoint with its one clear line (exit 74), not a step with a traceback. Said once per cause.
            if str(err) != getattr(self, "_write_error", None):
                self._write_error = str(err)
                say(f"[trainer] could not update {self.path}: {err}")

    def _record(
        self, step: int, loss: float, lr: float | None = None, tokens_per_s: float | None = None
    ) -> None:
        """Add a point to the curve: the first step, every `stride`-th step and the latest step;
        past HISTORY_POINTS the stride doubles, so the whole run stays evenly sampled."""
        if len(self.history) > 1 and self.history[-1][0] % self._stride:
            self.history.pop()  # the previous latest point, off the grid
            self._history_json.pop()
        point = [
            step,
            round(loss, 6),
            None if lr is None else float(f"{lr:.6g}"),
            round(time.time(), 3),
            None if tokens_per_s is None else round(tokens_per_s, 1),
        ]
        self.history.append(point)
        self._history_json.append(json.dumps(point))
        if len(self.history) > HISTORY_POINTS:
            self._stride *= 2
            last = len(self.history) - 1
            keep = [i for i, p in enumerate(self.history) if i in (0, last) or p[0] % self._stride == 0]
            self.history = [self.history[i] for i in keep]
            self._history_json = [self._history_json[i] for i in keep]

    @property
    def wall_time_s(self) -> float:
        return self.prior_wall_s + time.monotonic() - self.start_time

    def _read(self) -> dict | None:
        if self.storage is None:
            return None
        try:
            return CheckpointDir(self.storage).progress() or None
        except (OSError, ValueError):
            return None  # unreadable: start the counters afresh rather than refuse to train
