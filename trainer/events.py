"""The trainer's events as data: one JSON-lines file per rank, line-atomic under concurrency.

A rank's events (``{"event": "train", ...}``, see ``trainer/report/metrics.py``) used to reach their readers
only as lines of its stdout, scraped out of the group's log: there a ``print`` writes the text and its newline
as two writes, and another process's torchrun-prefixed output can land between them, so an event line came out
merged with another (``{"event": "checkpoint", ...}[rank0]:``). Now each event is

* appended to ``<events dir>/rank-<global rank>.jsonl`` as ONE ``os.write`` of ``json + "\\n"`` on a file
  opened ``O_APPEND``: each rank has its own file (no two processes share a descriptor), and the kernel
  appends each write whole, so every line of every file parses;
* and still written to stdout, in a single write too, for people reading the log and for the readers that
  have no shared disk (the Kubernetes backend reads pod logs).

The events directory is ``$DTRAIN_EVENTS_DIR`` (``EVENTS_DIR_ENV``): the local launcher sets it on every
process of a group (``<group dir>/events``); without it (a pod, ``python -m trainer`` by hand) events go to
stdout only. ``read_events`` merges a directory's files for the readers (tests, the status line);
``EventCursor`` reads what is new since the last look. Standard library only and no import from this
package: a program of your own may import it or copy it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

EVENTS_DIR_ENV = "DTRAIN_EVENTS_DIR"
"""Where each rank appends its events (``rank-<RANK>.jsonl``); unset: stdout only."""
_SUFFIX = ".jsonl"


class EventError(ValueError):
    """A line of an events file that is not one whole JSON object: names the file and the line."""


def events_dir(environ: Any = None) -> Path | None:
    """``$DTRAIN_EVENTS_DIR`` as a path; None when unset or empty."""
    value = (os.environ if environ is None else environ).get(EVENTS_DIR_ENV, "")
    return Path(value) if value else None


def rank_file(directory: str | os.PathLike, rank: int) -> Path:
    """The events file of global rank ``rank``."""
    return Path(directory) / f"rank-{int(rank)}{_SUFFIX}"


def encode(event: str, fields: dict[str, Any]) -> bytes:
    """One event as one line: ``{"event": event, **fields}`` and a newline, as bytes."""
    return (json.dumps({"event": event, **fields}) + "\n").encode()


class EventLog:
    """Appends one rank's events to its own file (``rank_file``), each in a single write, and echoes them
    to stdout in a single write too.

    :param directory: the events directory; None: stdout only.
    :param rank: this process's global rank (torchrun's ``RANK``).
    :param stdout: echo each event to stdout (``sys.stdout``) as well.
    """

    def __init__(self, directory: str | os.PathLike | None, rank: int = 0, *, stdout: bool = True) -> None:
        self.path = rank_file(directory, rank) if directory is not None else None
        self.stdout = stdout
        self._fd: int | None = None

    @classmethod
    def from_env(cls, environ: Any = None, *, stdout: bool = True) -> EventLog:
        """The log of this process: the directory from ``EVENTS_DIR_ENV``, the rank from ``RANK``."""
        environ = os.environ if environ is None else environ
        return cls(events_dir(environ), int(environ.get("RANK", "0") or 0), stdout=stdout)

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self._fd

    def emit(self, event: str, **fields: Any) -> None:
        """Append ``{"event": event, **fields}`` as one line (one ``os.write``), then echo it to stdout."""
        data = encode(event, fields)
        if self.path is not None:
            written = os.write(self._open(), data)
            if written != len(data):  # a regular file takes a whole write (or raises: ENOSPC)
                raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes of an event")
        if self.stdout:
            sys.stdout.write(data.decode())  # one write: the line and its newline together
            sys.stdout.flush()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_process_log: EventLog | None = None


def emit(event: str, **fields: Any) -> None:
    """Append an event to this process's log (``EventLog.from_env``, made on first use)."""
    global _process_log
    if _process_log is None:
        _process_log = EventLog.from_env()
    _process_log.emit(event, **fields)


def parse_line(line: str, where: str) -> dict[str, Any]:
    """One events-file line as its event; ``EventError`` naming ``where`` (file and line) otherwise."""
    try:
        event = json.loads(line)
    except ValueError as err:
        raise EventError(f"{where}: not a JSON event line ({err}): {line[:200]!r}") from None
    if not isinstance(event, dict) or "event" not in event:
        raise EventError(f"{where}: not an event (a JSON object with an 'event' key): {line[:200]!r}")
    return event


def _files(directory: Path) -> list[Path]:
    """The rank files of ``directory``, by rank (none: the directory does not exist yet)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.name.startswith("rank-") and p.name.endswith(_SUFFIX)]
    return sorted(found, key=lambda p: int(p.name[5 : -len(_SUFFIX)] or -1))


def _read_from(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole lines of ``path`` from ``offset``, parsed, and the offset after the last of them (a line
    still being written, without its newline yet, is left for the next read)."""
    with open(path, "rb") as file:
        file.seek(offset)
        data = file.read()
    end = data.rfind(b"\n") + 1
    events, at = [], offset
    for number, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        where = f"{path}:{number}" if offset == 0 else f"{path} (the line at byte {at})"
        events.append(parse_line(raw.decode("utf-8", "replace"), where))
        at += len(raw) + 1
    return events, offset + end


def read_events(directory: str | os.PathLike, *, rank: int | None = None) -> list[dict[str, Any]]:
    """Every event of ``directory`` (``rank``: that rank's only), rank by rank, each rank's in the order it
    wrote them; nothing is skipped: a line that does not parse raises ``EventError`` naming its file and line.
    For a directory no rank writes to any more (a run that ended); while they write, use ``EventCursor``."""
    paths = _files(Path(directory)) if rank is None else [rank_file(directory, rank)]
    return [event for path in paths if path.exists() for event in _read_whole(path)]


def _read_whole(path: Path) -> list[dict[str, Any]]:
    """Every event of a file that is no longer written: a last line without its newline is an error too."""
    events, end = _read_from(path, 0)
    if end != path.stat().st_size:
        raise EventError(f"{path}:{len(events) + 1}: an event line without its newline (cut short?)")
    return events


def events_of(directory: str | os.PathLike, kind: str) -> list[dict[str, Any]]:
    """The events of one kind (``"resume"``, ``"train"``, ...) in ``directory``."""
    return [event for event in read_events(directory) if event["event"] == kind]


class EventCursor:
    """Reads the events written to a directory since the last ``read`` (plain values: ``offsets`` per file
    name, so a watcher can carry where it left off)."""

    def __init__(self, directory: str | os.PathLike, offsets: dict[str, int] | None = None) -> None:
        self.directory = Path(directory)
        self.offsets = dict(offsets or {})

    def read(self) -> list[dict[str, Any]]:
        """The events appended since the last read, rank by rank."""
        new = []
        for path in _files(self.directory):
            events, self.offsets[path.name] = _read_from(path, self.offsets.get(path.name, 0))
            new += events
        return new
