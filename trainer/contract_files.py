"""The file side of trainer/contract.py: paths, atomic JSON, checksums, the writer lease, the spend file.

Standard library only and no import from this package, like trainer/contract.py, which re-exports what a
program uses from here: copy both files next to your program (or import ``trainer.contract``). The
checkpoint layout's names that trainer/checkpoint/directory.py also spells stay in trainer/contract.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from typing import Any

LEASES = "lease"
LEASE_FILE = re.compile(r"^(\d{10})\.json$")
SPEND = "spend"
_SPEND_WRITE_S = 5.0


def local_path(uri: str) -> str:
    """The local path of a checkpoint URI; ValueError for anything these helpers cannot write."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    if "://" in uri:
        raise ValueError(
            f"checkpoint uri: these helpers write local paths and file:// only, got {uri!r} "
            "(keep the same layout with your own storage library)"
        )
    if not uri:
        raise ValueError(
            "checkpoint uri: empty (DTRAIN_CHECKPOINT_URI is not set: the job keeps no checkpoints)"
        )
    return uri


def write_json(path: str, obj: Any, durable: bool = True, indent: int | None = 2) -> None:
    """Whole or not at all for readers: a temporary file, renamed (fsynced first when ``durable``)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


def files_of(step_dir: str, skip: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256"}} of every file in a step directory but ``skip`` (the commit's)."""
    found = {}
    for where, _, names in os.walk(step_dir):
        for name in names:
            path = os.path.join(where, name)
            rel = os.path.relpath(path, step_dir).replace(os.sep, "/")
            # temporary files start with a dot; DCP's index (.metadata) is part of the checkpoint
            if rel in skip or (name.startswith(".") and name != ".metadata"):
                continue
            found[rel] = {"size": os.path.getsize(path), "sha256": sha256(path)}
    return dict(sorted(found.items()))


class Fenced(RuntimeError):
    """Another group took over the checkpoint directory (its writer lease is newer): commit nothing more,
    exit ``FENCED_EXIT_CODE``."""


def take_lease(uri: str, *, job: str = "", attempts: int = 100) -> int:
    """Become the directory's one writer: create ``lease/<token>.json`` with 1 + the highest token there
    (exclusively: two writers racing get one token each) and return the token. Every earlier writer is
    fenced off from then on (``commit_checkpoint(lease=...)`` refuses to commit for it). Rank 0, at start."""
    root = os.path.abspath(local_path(uri))
    leases = os.path.join(root, LEASES)
    os.makedirs(leases, exist_ok=True)

    def tokens() -> list[int]:
        return sorted(int(m.group(1)) for n in os.listdir(leases) if (m := LEASE_FILE.match(n)))

    token = (tokens() or [0])[-1] + 1
    for _ in range(attempts):
        body = {"token": token, "job": job, "group": os.environ.get("DTRAIN_GROUP_NAME"),
                "host": socket.gethostname(), "pid": os.getpid(), "acquired_at": time.time()}  # fmt: skip
        try:
            fd = os.open(
                os.path.join(leases, f"{token:010d}.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644
            )
        except FileExistsError:
            token = max(token + 1, (tokens() or [0])[-1] + 1)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=2)
        newest = tokens()[-1]
        if newest > token:  # read from a stale listing: give it back, take one past the newest
            os.remove(os.path.join(leases, f"{token:010d}.json"))
            token = newest + 1
            continue
        for old in tokens()[:-4]:  # the newest four tell the history; ours is never among the removed
            if old < token:
                os.remove(os.path.join(leases, f"{old:010d}.json"))
        return token
    raise RuntimeError(f"could not take a writer lease in {leases} after {attempts} attempts")


def newer_lease(root: str, token: int) -> int | None:
    try:
        names = os.listdir(os.path.join(root, LEASES))
    except FileNotFoundError:
        return None
    newest = max((int(m.group(1)) for n in names if (m := LEASE_FILE.match(n))), default=0)
    return newest if newest > token else None


def read_json(path: str) -> dict[str, Any]:
    """A JSON file's object; {} when it does not exist or does not parse (a torn or hand-edited file)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return {}


def progress_state(
    previous: dict[str, Any],
    env: Any,
    step: int,
    status: str,
    now: float,
    *,
    loss: float | None,
    tokens_seen: int | None,
    latest_checkpoint: str | None,
    history_points: int,
) -> tuple[dict[str, Any], bool]:
    """(progress.json's next state, whether its status changed) after ``previous`` (trainer/contract.py's
    ``progress``; ``env``: its ``JobEnv``). An attempt's first call carries the last attempt's counters."""
    if previous.get("group") == env.attempt:
        state = dict(previous)
    else:  # this attempt's first call: carry the previous attempt's counters over
        state = {
            "group": env.attempt,
            "attempt": int(previous.get("attempt", 0)) + 1,
            "resumed_from_step": step or None,
            "steps_lost": int(previous.get("steps_lost", 0)) + max(0, int(previous.get("step", 0)) - step),
            "prior_wall_time_s": float(previous.get("wall_time_s", 0.0)),
            "attempt_started_at": now,
            "latest_checkpoint": previous.get("latest_checkpoint"),
            "loss": previous.get("loss") if previous.get("step") == step else None,
            "tokens_seen": previous.get("tokens_seen", 0),
            "history": [p for p in previous.get("history", []) if p[0] <= step],
        }
    changed = state.get("status") != status
    history = state.get("history", [])
    if loss is not None:
        history = [p for p in history if p[0] < step] + [[step, round(float(loss), 6)]]
        if len(history) > history_points:  # keep the curve's shape: every other point, the ends kept
            history = history[:1] + history[1:-1:2] + history[-1:]
    state.update(
        status=status, step=step, steps=env.steps, history=history, updated_at=now,
        wall_time_s=round(state["prior_wall_time_s"] + now - state["attempt_started_at"], 3),
        **({"loss": loss} if loss is not None else {}),
        **({"tokens_seen": tokens_seen} if tokens_seen is not None else {}),
        **({"latest_checkpoint": latest_checkpoint} if latest_checkpoint is not None else {}),
    )  # fmt: skip
    return state, changed


def _node_hours(entry: dict[str, Any], now: float) -> float:
    """Node-hours of a spend file up to ``now``: ``nodes`` throughout, or over an elastic group's
    ``node_changes`` (``[[at, nodes], ...]``, the first count reaching back to the launch): the copy of
    ``trainer.money.bill.node_hours`` this stdlib-only file keeps."""
    launched = float(entry["launched_at"])
    points = sorted((float(at), int(n)) for at, n in entry.get("node_changes") or [])
    if not points:
        return float(entry.get("nodes", 1)) * max(0.0, now - launched) / 3600
    total = 0.0
    for i, (at, nodes) in enumerate(points):
        since = launched if i == 0 else max(at, launched)
        until = min(points[i + 1][0] if i + 1 < len(points) else now, now)
        total += nodes * max(0.0, until - since)
    return total / 3600


_SKEW: dict[str, float] = {}  # root -> this node's clock minus its filesystem's


def storage_now(root: str) -> float:
    """Now on the clock of the filesystem holding ``root`` (its files' modification times), which the
    operator's spend files share: this node's clock less its difference from the filesystem's, where that
    is more than 2 s, measured once per root with a probe file (``trainer.money.clock``'s rule: a node
    whose clock is minutes off must not bill minutes that never ran)."""
    if root not in _SKEW:
        probe = os.path.join(root, SPEND, f".clock-{socket.gethostname()}-{os.getpid()}")
        try:
            os.makedirs(os.path.dirname(probe), exist_ok=True)
            before = time.time()
            with open(probe, "w"):
                pass
            skew = (before + time.time()) / 2 - os.stat(probe).st_mtime
            os.remove(probe)
        except OSError:
            skew = 0.0
        _SKEW[root] = skew if abs(skew) > 2.0 else 0.0
    return time.time() - _SKEW[root]


def record_spend(root: str, attempt: str, now: float, *, force: bool, step_time_s: float | None) -> None:
    """Bill this attempt's spend file up to ``now`` (as the operator does when the group ends): only a file
    the operator opened, never one it closed; never less than it already says."""
    path = os.path.join(root, SPEND, f"{attempt}.json")
    try:
        with open(path) as f:
            entry = json.load(f)
    except (FileNotFoundError, ValueError):
        return
    if "launched_at" not in entry or entry.get("ended"):
        return
    if not force and now - float(entry.get("updated_at") or 0) < _SPEND_WRITE_S:
        return
    seconds = max(0.0, now - float(entry["launched_at"]))
    node_hours = _node_hours(entry, now)

    def kept(key: str, value: float) -> float:  # over recorded sizes the figure is exact (money/bill.py)
        return (
            round(value, 9) if entry.get("node_changes") else max(float(entry.get(key, 0.0)), round(value, 9))
        )

    entry.update(
        billed_s=max(float(entry.get("billed_s", 0.0)), round(seconds, 3)),
        node_hours=kept("node_hours", node_hours),
        gpu_hours=kept("gpu_hours", node_hours * float(entry.get("gpus_per_node", 0))),
        dollars=kept("dollars", node_hours * float(entry.get("price_per_node_hour", 0))),
        updated_at=now,
        **({"step_time_s": round(step_time_s, 6)} if step_time_s else {}),
    )  # fmt: skip
    write_json(path, entry, durable=False)
