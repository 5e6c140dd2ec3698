"""Events stay whole under concurrency (trainer/events.py), where print()ed lines in a shared log did not.

Many processes, as the ranks of a group, each write thousands of events with large payloads at once,
their stdout all appended to one shared log with torchrun-style ``[rankN]:`` noise between the events,
as the local backend's ``group.log`` gets them. Every line of every rank's events file parses and the
counts and contents match exactly; the same lines written the old way (``print``: the text, then the
newline, two writes) come out merged in the shared log.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.events import EVENTS_DIR_ENV, EventCursor, EventError, EventLog, read_events, rank_file

REPO = Path(__file__).resolve().parents[2]
RANKS = 16
EVENTS_PER_RANK = 1000

# One rank: EVENTS events of 1-9 KiB, a noise line before each, as torchrun's prefixed output; "old" prints
# each event as the trainer did before (print: two writes when unbuffered), "new" emits it (EventLog).
_RANK = r"""
import hashlib, json, os, sys
from trainer.events import emit
mode, rank, count = sys.argv[1], int(os.environ["RANK"]), int(sys.argv[2])
for seq in range(count):
    payload = chr(97 + (rank + seq) % 26) * (1024 * (1 + (rank * 7 + seq) % 9))
    fields = {"rank": rank, "seq": seq, "sha": hashlib.sha256(payload.encode()).hexdigest()[:16],
              "payload": payload}
    os.write(1, f"[rank{rank}]: step {seq} noise\n".encode())
    if mode == "new":
        emit("probe", **fields)
    else:
        print(json.dumps({"event": "probe", **fields}), flush=True)
"""


def _run_ranks(tmp_path: Path, mode: str, count: int) -> Path:
    """Start RANKS processes at once, their stdout appended to one shared log; wait for them all."""
    events, log = tmp_path / f"events-{mode}", tmp_path / f"group-{mode}.log"
    with open(log, "ab") as shared:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _RANK, mode, str(count)],
                stdout=shared,
                env={
                    **os.environ,
                    "RANK": str(rank),
                    EVENTS_DIR_ENV: str(events),
                    "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": str(REPO),
                },
            )  # fmt: skip
            for rank in range(RANKS)
        ]
    assert [p.wait(timeout=600) for p in procs] == [0] * RANKS
    return tmp_path


def _whole(line: str) -> bool:
    try:
        return json.loads(line)["event"] == "probe"
    except ValueError:
        return False


def test_many_ranks_writing_at_once_every_line_of_every_file_parses_and_counts_match(tmp_path):
    _run_ranks(tmp_path, "new", EVENTS_PER_RANK)
    events_dir = tmp_path / "events-new"
    assert sorted(p.name for p in events_dir.iterdir()) == sorted(f"rank-{r}.jsonl" for r in range(RANKS))
    events = read_events(events_dir)  # raises on any line that does not parse
    assert len(events) == RANKS * EVENTS_PER_RANK
    for rank in range(RANKS):
        mine = read_events(events_dir, rank=rank)
        assert [e["seq"] for e in mine] == list(range(EVENTS_PER_RANK))  # each rank's, in order, once
        for event in mine:
            assert event["rank"] == rank
            assert hashlib.sha256(event["payload"].encode()).hexdigest()[:16] == event["sha"]
    # stdout carries the same events, each line whole too (one write each), for people and pod logs
    lines = (tmp_path / "group-new.log").read_text().splitlines()
    assert sum(line.startswith("{") for line in lines) == RANKS * EVENTS_PER_RANK
    assert all(_whole(line) for line in lines if not line.startswith("[rank"))


def test_the_old_print_to_a_shared_log_merges_lines_under_the_same_load(tmp_path):
    """What the events files replace: print()ed events, scraped from the shared log, come out broken."""
    for _ in range(3):  # the interleaving is up to the scheduler; under this load it comes at once
        _run_ranks(tmp_path, "old", EVENTS_PER_RANK)
        lines = (tmp_path / "group-old.log").read_text().splitlines()
        broken = [line for line in lines if "{" in line and not _whole(line)]
        if broken:
            break
    assert broken, "16 ranks printing at once never merged a line: the old way's failure did not show"
    assert any(line.startswith("[rank") and '{"event"' in line for line in broken) or any(
        line.startswith("{") and "[rank" in line for line in broken
    )


def test_a_line_that_does_not_parse_is_an_error_naming_its_file_and_line(tmp_path):
    log = EventLog(tmp_path, rank=3, stdout=False)
    log.emit("train", step=1)
    log.close()
    with open(rank_file(tmp_path, 3), "ab") as file:
        file.write(b'{"event": "checkpoint", "step": 2}[rank0]: merged\n')
    with pytest.raises(EventError, match=r"rank-3\.jsonl:2: not a JSON event line"):
        read_events(tmp_path)
    rank_file(tmp_path, 3).write_text('{"event": "train", "step": 1}\n{"event": "train", "st')
    with pytest.raises(EventError, match=r"rank-3\.jsonl:2: an event line without its newline"):
        read_events(tmp_path)


def test_a_cursor_reads_what_is_new_and_leaves_a_line_being_written_for_the_next_read(tmp_path):
    cursor = EventCursor(tmp_path / "events")
    assert cursor.read() == []  # no directory yet: nothing, no error
    log = EventLog(tmp_path / "events", rank=0, stdout=False)
    log.emit("train", step=1)
    assert cursor.read() == [{"event": "train", "step": 1}]
    with open(rank_file(tmp_path / "events", 0), "ab") as file:
        file.write(b'{"event": "train", "st')  # half a line, as a reader may see a write in progress
        assert cursor.read() == []
        file.write(b'ep": 2}\n')
    log.emit("done", step=2)
    assert cursor.read() == [{"event": "train", "step": 2}, {"event": "done", "step": 2}]
    again = EventCursor(tmp_path / "events", cursor.offsets)  # carried as plain values
    assert again.read() == []
