"""Shared helpers of the integration tests: small specs and waiting on real groups."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from airflow_dtrain.launchers.base import GroupState, GroupStatus, PodGroupLauncher
from trainer.events import read_events

# Small enough for 2 CPU cores: a few seconds of training per group.
SMALL = {
    "flavor": "debug",
    "seq_len": 64,
    "global_batch_size": 4,
    "micro_batch_size": 2,
    "log_every": 2,
}


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def group_events(state_dir: Path, name: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The trainer's events of local group ``name`` (of one ``kind``: all when None), from its ranks' events
    files (``<group dir>/events``, trainer/events.py), not scraped from its group.log; for a group that
    ended (a running one: ``LocalLauncher.events``)."""
    events = read_events(Path(state_dir) / name / "events")
    return [e for e in events if kind is None or e["event"] == kind]


def wait_terminal(launcher: PodGroupLauncher, name: str, timeout: float = 300) -> GroupStatus:
    def ended():
        status = launcher.status(name)
        return status if status.state.terminal or status.state == GroupState.NOT_FOUND else None

    return wait_for(ended, timeout, f"group {name} to end")


def progress(checkpoint_dir: Path) -> dict[str, Any]:
    path = Path(checkpoint_dir) / "progress.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def wait_for_step(checkpoint_dir: Path, step: int, timeout: float = 240) -> dict[str, Any]:
    return wait_for(
        lambda: (p := progress(checkpoint_dir)).get("step", 0) >= step and p, timeout, f"step {step}"
    )


def node_pids(state_dir: Path, name: str) -> dict[int, int]:
    nodes = json.loads((Path(state_dir) / name / "nodes.json").read_text())
    return {int(i): record["pid"] for i, record in nodes.items()}
