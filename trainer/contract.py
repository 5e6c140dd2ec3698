"""The contract between FSDPTrainOperator and a training program of your own.

``FSDPTrainOperator(entrypoint=["/opt/train.py", ...])`` runs your program on every process of
the pod group, under the same torchrun agent, relaunches and spend ledger as the bundled
trainer. This module is what the program needs to keep its side (docs/own_training_code.md
tells the whole of it). Standard library only and no import from this package: import it
(``from trainer.contract import ...``) or copy the file next to your program.

What every process gets (both backends), read by ``job_env()``::

    DTRAIN_CHECKPOINT_URI              where checkpoints, progress.json and the spend ledger go
    DTRAIN_JOB                         the job's name ("" for none); a manifest records it
    DTRAIN_OWNER                       only when set: who the job belongs to ([dtrain] owners); in manifests
    DTRAIN_STEPS                       optimizer steps of the whole job (a resumed run goes on to it)
    DTRAIN_CHECKPOINT_EVERY            save every N steps (0: only at the end and when asked)
    DTRAIN_GRACE_PERIOD_S              seconds a preemption save may take before SIGKILL
    DTRAIN_SIMULATE_PREEMPTION_AT_STEP only when set: tests and demos (``simulate_preemption``)
    DTRAIN_GROUP_NAME                  this attempt's pod group: its name in the spend ledger
    DTRAIN_STATSD_TAGS                 only when set: DogStatsD tags (task instance, job) for your metrics

torchrun's RANK, LOCAL_RANK and WORLD_SIZE come with them.

Signals (``Signals``): SIGTERM (a preemption, or the group being stopped) means "save the step
you are on and exit ``PREEMPTED_EXIT_CODE``": the operator then relaunches the group, which
resumes from that checkpoint. SIGUSR1 (an interruption warning: checkpoint now) means "save at
the next step boundary and carry on". Act on them at a step boundary, every rank together.

Checkpoints (``step_path``, ``commit_checkpoint``, ``latest_checkpoint``): one directory per
save, ``<uri>/step-00000050/``, written by every rank, then committed by rank 0 writing its
``manifest.json`` last. A step directory without one is an interrupted save and never the latest.

Progress (``progress``): rank 0 keeps ``<uri>/progress.json`` (status, step, loss, ...), which the
operator reads for its summary and to tell a finished job (``status: "completed"`` at the last
step) from one that stopped early; it also keeps this attempt's spend file current.

The helpers handle local paths and ``file://`` URIs (a shared filesystem, a volume of the pods);
for ``s3://`` keep the same layout with your own storage library: the manifest is the commit.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

# The file side (atomic JSON, checksums, the writer lease, the spend file) is trainer/contract_files.py's,
# re-exported here: copied next to your program, this module imports its copy there.
try:
    from trainer.contract_files import (  # noqa: F401 - re-exported
        LEASE_FILE, LEASES, SPEND, Fenced, files_of, local_path, newer_lease, progress_state, read_json,
        record_spend, sha256, storage_now, take_lease, write_json,
    )  # fmt: skip
except ImportError:  # copied next to your program: contract.py and contract_files.py side by side
    from contract_files import (  # noqa: F401 - re-exported
        LEASE_FILE, LEASES, SPEND, Fenced, files_of, local_path, newer_lease, progress_state, read_json,
        record_spend, sha256, storage_now, take_lease, write_json,
    )  # fmt: skip

__all__ = [
    "BUDGET_EXIT_CODE", "FENCED_EXIT_CODE", "PREEMPTED_EXIT_CODE", "STORAGE_EXIT_CODE", "Checkpoint",
    "Fenced", "JobEnv", "Signals", "commit_checkpoint", "die_with_agent", "job_env", "latest_checkpoint",
    "progress", "simulate_preemption", "step_path", "take_lease",
]  # fmt: skip

# -- exit codes (trainer/config/job_config.py's; tests/trainer/test_contract.py holds this copy to them) ----
PREEMPTED_EXIT_CODE = 75
"""Saved the step it was on after SIGTERM: the operator relaunches the group from that checkpoint."""
STORAGE_EXIT_CODE = 74
"""A checkpoint could not be written (a full disk, no permission): the task fails, nothing is relaunched."""
BUDGET_EXIT_CODE = 77
"""Stopped at the job's dollar cap with the step saved: the task succeeds with ``stopped: "budget"``."""
FENCED_EXIT_CODE = 78
"""Another group took over the checkpoint directory (a newer writer lease): the task fails, not relaunched."""
# 76 (a worker was lost) is the torchrun agent's to report for a process a signal killed, never a program's.

# -- the checkpoint directory's layout (trainer/checkpoint/directory.py's) ----------------------------------
MANIFEST = "manifest.json"
PROGRESS = "progress.json"
BEST = "BEST"
STEP_DIR = re.compile(r"^step-(\d{8})$")
_HISTORY_POINTS = 1000


def _step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


# -- the job's environment -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobEnv:
    """What the operator tells every process (``job_env()``)."""

    checkpoint_uri: str
    """Where checkpoints, progress.json and this attempt's spend file go ("" when the job keeps none)."""
    steps: int
    """Optimizer steps of the whole job; a resumed attempt trains on up to it."""
    job: str = ""
    """The job's name; manifests record it."""
    checkpoint_every: int = 0
    """Save every N steps; 0: only at the end, on SIGTERM and on SIGUSR1."""
    grace_period_s: float = 110.0
    """Seconds from SIGTERM to SIGKILL: a preemption save must fit in them."""
    simulate_preemption_at_step: int = 0
    """Tests and demos: rank 0 SIGTERMs the group once after this step (0: never)."""
    attempt: str = ""
    """This attempt's name in the spend ledger (its pod group's)."""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    def checkpoint_due(self, step: int) -> bool:
        """Whether ``step`` is one to save at: every ``checkpoint_every`` steps, and the last."""
        return step == self.steps or (self.checkpoint_every > 0 and step % self.checkpoint_every == 0)


def _int(environ: Any, name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ValueError(
                f"{name}: not set (FSDPTrainOperator sets it; under a plain torchrun set it yourself)"
            )
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{name}: must be >= 0, got {value!r}")
    return number


def job_env(environ: Any = None) -> JobEnv:
    """The job's settings from the DTRAIN_* environment (``os.environ`` by default).

    Raises ValueError naming the variable and the value when one is missing or malformed.
    """
    environ = os.environ if environ is None else environ
    grace = environ.get("DTRAIN_GRACE_PERIOD_S") or "110"
    try:
        grace_s = float(grace)
    except ValueError:
        raise ValueError(f"DTRAIN_GRACE_PERIOD_S: expected a number of seconds, got {grace!r}") from None
    return JobEnv(
        checkpoint_uri=environ.get("DTRAIN_CHECKPOINT_URI", ""),
        steps=_int(environ, "DTRAIN_STEPS"),
        job=environ.get("DTRAIN_JOB", ""),
        checkpoint_every=_int(environ, "DTRAIN_CHECKPOINT_EVERY", 0),
        grace_period_s=grace_s,
        simulate_preemption_at_step=_int(environ, "DTRAIN_SIMULATE_PREEMPTION_AT_STEP", 0),
        attempt=environ.get("DTRAIN_GROUP_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        rank=_int(environ, "RANK", 0),
        local_rank=_int(environ, "LOCAL_RANK", 0),
        world_size=_int(environ, "WORLD_SIZE", 1),
    )


# -- signals -------------------------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1


def die_with_agent() -> None:
    """Under torchrun on Linux: get SIGTERM when the agent that started this process dies, even by SIGKILL,
    so an orphaned worker saves and stops instead of training on beside the group that replaces it (forked
    from the agent's fork server: when that dies, as it does with the agent)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    agent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != agent or agent == 1:  # the agent died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


class Signals:
    """Flags set by the signals the operator sends; act on them at a step boundary.

    ``stop`` (SIGTERM, SIGINT): save the step reached and exit ``PREEMPTED_EXIT_CODE``.
    ``checkpoint_now`` (SIGUSR1): save at the next boundary and carry on (``take_checkpoint_now``
    clears it). A signal may reach only some ranks (one node's): agree over your process group
    (an all-reduce of the flags with MAX) before acting, so every rank saves the same step.

    Install it first thing, before importing torch: a signal that comes before its handler kills
    the process (SIGUSR1's default action is to terminate).

    :param stop_when_orphaned: also get SIGTERM when the torchrun agent dies (``die_with_agent()``).
    """

    def __init__(self, *, stop_when_orphaned: bool = True) -> None:
        self.stop = False
        self.checkpoint_now = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_checkpoint_now)
        if stop_when_orphaned:
            die_with_agent()

    def _on_stop(self, signum, frame) -> None:
        self.stop = True

    def _on_checkpoint_now(self, signum, frame) -> None:
        self.checkpoint_now = True

    @property
    def requested(self) -> bool:
        """Whether a save was asked for (to stop, or to carry on)."""
        return self.stop or self.checkpoint_now

    def take_checkpoint_now(self) -> bool:
        """Whether SIGUSR1 came since the last call (taken before your all-reduce: one that lands during it
        is kept for the next boundary)."""
        asked, self.checkpoint_now = self.checkpoint_now, False
        return asked

    def ignore_further(self) -> None:
        """Once stopping: ignore further SIGTERMs. When the first rank exits, torchrun SIGTERMs the rest, and
        Python restores the fatal default while it shuts down, which would turn their exit 75 into a death."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def simulate_preemption(
    step: int, *, resumed_from: int | None = None, signals: Signals | None = None, env: JobEnv | None = None
) -> bool:
    """For tests and demos: after step DTRAIN_SIMULATE_PREEMPTION_AT_STEP, rank 0 sends the SIGTERM a spot
    reclaim would, to the torchrun agent (which forwards it to every worker), once: never again in an
    attempt resumed at or past that step. Returns whether it did; ``signals.stop`` is set at once, so this
    rank stops at this boundary rather than whenever the forwarded signal lands."""
    env = env or job_env()
    k = env.simulate_preemption_at_step
    if env.rank != 0 or k == 0 or step != k or (resumed_from is not None and resumed_from >= k):
        return False
    if signals is not None:
        signals.stop = True
    # the agent: trainer.launch names it (a worker forked from its fork server is not its child)
    agent = int(os.environ.get("DTRAIN_AGENT_PID") or os.getppid())
    target = agent if "TORCHELASTIC_RUN_ID" in os.environ else os.getpid()
    # one write: the node's ranks share its log (print writes the text and the newline apart)
    sys.stderr.write(f"[contract] step {step}: simulating preemption, SIGTERM to pid {target}\n")
    os.kill(target, signal.SIGTERM)
    return True


# -- checkpoints ---------------------------------------------------------------------------------------------
class Checkpoint(NamedTuple):
    step: int
    path: str


def step_path(uri: str, step: int, *, create: bool = False) -> str:
    """The step directory of ``step`` under ``uri`` (``create``: make it, as each rank may before writing)."""
    path = os.path.join(os.path.abspath(local_path(uri)), _step_dir_name(step))
    if create:
        os.makedirs(path, exist_ok=True)
    return path


def _step_dirs(root: str) -> list[Checkpoint]:
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(
        Checkpoint(int(m.group(1)), os.path.join(root, n)) for n in names if (m := STEP_DIR.match(n))
    )


def latest_checkpoint(uri: str) -> Checkpoint | None:
    """The newest committed checkpoint (a step directory with a manifest) under ``uri``, or None.
    An interrupted save above it is skipped."""
    for checkpoint in reversed(_step_dirs(os.path.abspath(local_path(uri)))):
        if os.path.isfile(os.path.join(checkpoint.path, MANIFEST)):
            return checkpoint
    return None


def commit_checkpoint(
    uri: str,
    step: int,
    *,
    format: str = "torch",
    world_size: int | None = None,
    job: str | None = None,
    lease: int | None = None,
    files: dict[str, dict] | None = None,
    tokens_seen: int = 0,
    wall_time_s: float = 0.0,
    keep: int | None = None,
    **fields: Any,
) -> str:
    """Commit ``step``: write its ``manifest.json``, last; returns the step directory.

    Call it on rank 0 once every rank has written its files (a barrier first). The manifest records
    the step, the format, the job, the world size and every file's size and sha256 (``files``, default:
    every file in the step directory), which ``CheckpointValidationOperator`` checks; ``fields`` go
    in as they are (``step_time_s``: measured seconds per step, which the budget's relaunch decision
    uses; ``config_hash``; anything of yours). ``format="dcp"`` (a torch.distributed.checkpoint save)
    also has the validation load DCP's metadata and check a sample of tensors for NaN/Inf.

    :param lease: your token from ``take_lease``: raises ``Fenced`` instead of committing when a newer one
        exists (exit ``FENCED_EXIT_CODE`` then).
    :param keep: retention: keep the newest ``keep`` committed checkpoints (and any marked best), remove older
        ones and interrupted saves below this one; None: remove nothing.
    """
    root = os.path.abspath(local_path(uri))
    path = step_path(root, step)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"commit_checkpoint: {path} does not exist: write the step's files first")
    if lease is not None and (newer := newer_lease(root, lease)) is not None:
        raise Fenced(
            f"another group took over the checkpoint directory {root}: writer lease {newer} is newer than "
            f"this one's {lease}; step {step} is not committed"
        )
    env = dict(os.environ)
    manifest = {
        "step": step,
        "format": format,
        "job": env.get("DTRAIN_JOB", "") if job is None else job,
        "owner": env.get("DTRAIN_OWNER", ""),
        **({"lease": lease} if lease is not None else {}),
        "world_size": int(env.get("WORLD_SIZE", "1")) if world_size is None else world_size,
        "flavor": fields.pop("flavor", "own"),
        "config_hash": fields.pop("config_hash", ""),
        "program": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "",
        "group": env.get("DTRAIN_GROUP_NAME"),
        "tokens_seen": tokens_seen,
        "wall_time_s": round(wall_time_s, 3),
        **fields,
        "files": files_of(path, skip=(MANIFEST, BEST)) if files is None else files,
        "created_at": time.time(),
    }
    write_json(os.path.join(path, MANIFEST), manifest)  # the commit point
    if keep is not None:
        _prune(root, keep, step)
    return path


def _prune(root: str, keep: int, committed_step: int) -> None:
    steps = _step_dirs(root)
    committed = [c for c in steps if os.path.isfile(os.path.join(c.path, MANIFEST))]
    drop = (
        [c for c in committed[:-keep] if not os.path.exists(os.path.join(c.path, BEST))] if keep > 0 else []
    )
    drop += [c for c in steps if c.step < committed_step and c not in committed]
    for c in drop:
        try:  # the manifest first: a half-removed checkpoint never looks committed
            os.remove(os.path.join(c.path, MANIFEST))
        except FileNotFoundError:
            pass
        shutil.rmtree(c.path, ignore_errors=True)


# -- progress and spend --------------------------------------------------------------------------------------
def progress(
    step: int,
    *,
    status: str = "running",
    loss: float | None = None,
    tokens_seen: int | None = None,
    latest_checkpoint: str | None = None,
    step_time_s: float | None = None,
    env: JobEnv | None = None,
) -> dict[str, Any] | None:
    """Record the job's live status in ``<uri>/progress.json`` (rank 0; other ranks' calls do nothing).

    Call it once right after resuming (``step``: the checkpoint's step, 0 for a fresh start), then at
    steps you like, after every commit (``latest_checkpoint``), and at the end: ``status="completed"``
    at the last step (what the operator requires of a finished job), or ``"preempted"`` after a
    preemption save. Counters carry over from the previous attempt (it is another DTRAIN_GROUP_NAME):
    ``attempt``, ``wall_time_s``, and ``steps_lost`` (steps it trained past the checkpoint resumed from).
    It also keeps this attempt's spend file (``spend/<attempt>.json``, opened by the operator at the
    launch) billed up to now, every few seconds and at every status change.

    :param step_time_s: measured seconds per optimizer step, for the budget's relaunch decision.
    :return: what was written (None on ranks other than 0, or without a checkpoint URI).
    """
    env = env or job_env()
    if env.rank != 0 or not env.checkpoint_uri:
        return None
    root = os.path.abspath(local_path(env.checkpoint_uri))
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, PROGRESS)
    now = storage_now(root)  # the operator's clock, which its spend file is on, whatever this node's says
    state, changed = progress_state(
        read_json(path), env, step, status, now, loss=loss, tokens_seen=tokens_seen,
        latest_checkpoint=latest_checkpoint, history_points=_HISTORY_POINTS,
    )  # fmt: skip
    write_json(path, state, durable=changed, indent=None)
    record_spend(root, env.attempt, now, force=changed, step_time_s=step_time_s)
    return state
