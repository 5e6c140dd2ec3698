"""Where a training job stands, in one line of the task log, and the group's output batched.

``StatusLine`` reads the trainer's own events as they arrive (``trainer/report/metrics.py``: "train",
"checkpoint", "resume", "preempted"; on the local backend from the ranks' events files, ``group_events``,
on Kubernetes from the pods' logs) and the job's spend ledger, and every ``every_s`` seconds
(not every step) gives one line::

    step 1200/5000 · 3.1 s/step · 41k tok/s · ETA 3h17m · $12.40 of $50.00 · last ckpt step 1000 (2m ago)

``log_lines`` writes one poll's worth of group output as one log record (with many ranks and
nodes a record per line floods the task log and the triggerer), at most ``MAX_LINES`` of them,
always keeping the lines that report an error.

Plain values only (the trigger carries a ``StatusLine`` as a dict): nothing heavy is imported.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

STATUS_EVERY_S = 15.0
"""Seconds between two status lines."""
MAX_LINES = 200
"""Most group output lines in one log record; the rest are counted (errors are always kept)."""
_ERROR = re.compile(
    r"Traceback|Error|error:|exit [1-9]|FAILED|Killed|\[trainer\] (?!rank |writer lease)", re.I
)


def _compact(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def duration(seconds: float) -> str:
    """3h17m, 4m12s, 9s."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


@dataclass
class StatusLine:
    """The job's status from its event lines; ``due()`` gives the line every ``every_s`` seconds."""

    steps: int
    tokens_per_step: int
    budget_usd: float | None = None
    ledger_uri: str | None = None
    every_s: float = STATUS_EVERY_S
    step: int = 0
    tokens_per_s: float | None = None
    checkpoint_step: int | None = None
    checkpoint_at: float | None = None
    last_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any] | None) -> StatusLine | None:
        return cls(**value) if value else None

    def feed(self, lines: list[str], now: float | None = None, events: list[dict] | None = None) -> None:
        """Take in the trainer's events: ``events`` when the backend keeps them as data (the local one: its
        events files, ``group_events``), else the event lines among ``lines`` (pod logs, prefixed or not)."""
        self.feed_events(events_in(lines) if events is None else events, now)

    def feed_events(self, events: list[dict], now: float | None = None) -> None:
        """Take in the trainer's events ("train", "checkpoint", "resume"; the rest are not its business)."""
        now = time.time() if now is None else now
        for event in events:
            kind = event.get("event")
            if kind == "train":
                self.step = int(event.get("step") or self.step)
                if event.get("tokens_per_s"):
                    self.tokens_per_s = float(event["tokens_per_s"])
            elif kind == "checkpoint":
                self.checkpoint_step, self.checkpoint_at = int(event.get("step") or 0), now
            elif kind == "resume":
                self.step = int(event.get("from_step") or self.step)
                self.checkpoint_step = self.checkpoint_step or int(event.get("from_step") or 0)

    def spent(self) -> float | None:
        """Dollars spent by the job so far (every attempt), from its ledger; None without one."""
        if not self.ledger_uri:
            return None
        try:
            from trainer.checkpoint.directory import CheckpointDir

            return CheckpointDir(self.ledger_uri).spend().total_dollars
        except (OSError, ValueError):
            return None

    def line(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        parts = [f"step {self.step}/{self.steps}"]
        if self.tokens_per_s:
            seconds_per_step = self.tokens_per_step / self.tokens_per_s
            parts += [f"{seconds_per_step:.3g} s/step", f"{_compact(self.tokens_per_s)} tok/s",
                      f"ETA {duration(max(0, self.steps - self.step) * seconds_per_step)}"]  # fmt: skip
        else:
            parts += ["s/step –", "tok/s –", "ETA –"]
        spent = self.spent()
        if spent is not None:
            parts.append(
                f"${spent:,.2f} of ${self.budget_usd:,.2f}" if self.budget_usd else f"${spent:,.2f} spent"
            )
        elif self.budget_usd:
            parts.append(f"$? of ${self.budget_usd:,.2f}")
        if self.checkpoint_step is not None:
            ago = f" ({duration(now - self.checkpoint_at)} ago)" if self.checkpoint_at is not None else ""
            parts.append(f"last ckpt step {self.checkpoint_step}{ago}")
        else:
            parts.append("no checkpoint yet")
        return " · ".join(parts)

    def due(self, now: float | None = None) -> str | None:
        """The status line if ``every_s`` has passed since the last one (the first: at once)."""
        now = time.time() if now is None else now
        if self.last_at is not None and now - self.last_at < self.every_s:
            return None
        self.last_at = now
        return self.line(now)


def events_in(lines: list[str]) -> list[dict]:
    """The trainer's events among output lines (``[nodeN][rankR]:`` prefixed or not): for a backend whose
    events reach the Airflow side only as its pods' logs (Kubernetes: no shared disk). A line that is not a
    whole event is passed over: the logs are for people, the events files are the record."""
    events = []
    for line in lines:
        start = line.find('{"event"')
        if start < 0:
            continue
        try:
            event = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def group_events(launcher: Any, name: str, lines: list[str], cursor: Any = None) -> tuple[list[dict], Any]:
    """The trainer's events of group ``name`` since ``cursor``, and the cursor for the next call: read from
    its events files where the backend keeps them (the local one: ``LocalLauncher.events``), else found among
    ``lines``, the group's output of this poll (Kubernetes pod logs; the cursor stays None)."""
    if getattr(type(launcher), "events", None) is None:  # the class's: a test's mock launcher has every name
        return events_in(lines), cursor
    return launcher.events(name, cursor)


def has_trained(events: list[dict]) -> bool:
    """Whether a (relaunched) group trains again: it resumed from a checkpoint or reported a step."""
    return any(event.get("event") in ("resume", "train") for event in events)


def log_lines(log: Any, lines: list[str], *, limit: int = MAX_LINES) -> None:
    """One log record for ``lines`` (one poll's output of the group), at most ``limit`` of them: the
    first and the last ones, and every line that reports an error."""
    if not lines:
        return
    if len(lines) > limit:
        head, tail = lines[: limit // 4], lines[-(limit - limit // 4) :]
        middle = lines[limit // 4 : len(lines) - len(tail)]
        errors = [line for line in middle if _ERROR.search(line)]
        skipped = len(middle) - len(errors)
        lines = [*head, f"... {skipped} lines not shown (the group's own logs keep them) ...", *errors, *tail]
    log.info("%s", "\n".join(lines))


# A training process's own complaint: a line of a rank's output (torchrun's ``[rankN]:`` prefix) that is an
# error of its own, not a frame of a stack dump nor the ``Traceback`` line before its message.
_RANK_SAYS = re.compile(r"\[rank\d+\]:\s?(?P<text>.*)")
_RANK_ERROR = re.compile(r"\berror\b|^\w+(Error|Exception)\b|\[trainer\]", re.I)
FIRST_ERRORS = 3


def note_rank_errors(seen: list[str], lines: list[str], limit: int = FIRST_ERRORS) -> None:
    """Append to ``seen`` the first ``limit`` distinct complaints of the group's ranks among ``lines``: what a
    failed group's error leads with, however many lines of the launchers' own errors come after them (a
    peer's lost store, the agents' stack dumps) and push them out of the log's last lines."""
    for line in lines:
        if len(seen) >= limit:
            return
        said = _RANK_SAYS.search(line)
        if not said:
            continue
        text = said.group("text").strip()
        if _RANK_ERROR.search(text) and not text.startswith("Traceback") and text not in seen:
            seen.append(text)
