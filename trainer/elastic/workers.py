"""A node's training processes, seen from outside: which of its torchrun agent's processes they are, and
their ranks. Standard library only (the provider, the tests and the benchmarks read it too).

``trainer.launch`` forks the trainer's processes from a fork server that has already imported torch and
the trainer (``trainer.elastic.forked_worker``): they skip the interpreter's start-up and imports at every
start and restart. So they carry the fork server's command line and environment, not ``python -m trainer`` and
their ``RANK``: each names itself ``dtrain-r<rank>`` (``/proc/<pid>/comm``: what ``ps`` and ``top`` show). A
program of your own is started as a command, as torchrun does, with ``RANK`` in its environment.
"""

from __future__ import annotations

import os
from pathlib import Path

FORK_ENV = "DTRAIN_FORK_WORKERS"
"""``0``: the agent starts every worker as its own ``python -m trainer`` command, as torchrun does (by
default ``trainer.launch`` forks them from its fork server)."""
AGENT_PID_ENV = "DTRAIN_AGENT_PID"
"""The agent's pid, which ``trainer.launch`` gives its workers: a forked one is not the agent's child
(``trainer.contract.simulate_preemption`` signals the agent)."""
RANK_NAME = "dtrain-r"
"""A forked training process's name: ``dtrain-r<rank>`` (15 characters at most: ranks up to 9,999,999)."""
NOT_WORKERS = ("dtrain-p", "dtrain-h")
"""Names of an elastic group's proxies (what its agent forks, ``dtrain-p<rank>``) and of its hosts while
they wait for a round (``dtrain-h<local rank>``): ``trainer/elastic/worker_host.py``. A host that trains is
``dtrain-r<rank>``."""
_HELPERS = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker")
"""Command-line words of the agent's own helper processes, which are not workers."""


def name_this_process(rank: int, prefix: str = RANK_NAME) -> None:
    """Name this process ``dtrain-r<rank>`` (``prctl(PR_SET_NAME)``); best effort, Linux only. An elastic
    group's proxies and idle hosts (``trainer/elastic/worker_host.py``) name themselves with
    ``NOT_WORKERS``."""
    try:
        Path("/proc/self/comm").write_text(f"{prefix}{rank}")
    except OSError:
        pass


def rank_of(pid: int) -> int | None:
    """The rank of training process ``pid``: from its name (forked) or its environment's ``RANK`` (a
    command); None for any other process or one that is gone."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        if name.startswith(RANK_NAME) and name[len(RANK_NAME) :].isdigit():
            return int(name[len(RANK_NAME) :])
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"RANK="):
                return int(item[5:])
    except (OSError, ValueError):
        return None
    return None


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def worker_pids(agent: int) -> list[int]:
    """The training processes of the torchrun agent ``agent``: its children, or where it forks them, its fork
    server's; never the agent's helpers (fork server, resource tracker), an elastic group's proxies and idle
    hosts (``NOT_WORKERS``), nor what the workers start in turn (data loader workers)."""
    found = []
    for child in _children(agent):
        cmdline = _cmdline(child)
        if _HELPERS[0] in cmdline:
            found.extend(pid for pid in _children(child) if not _name(pid).startswith(NOT_WORKERS))
        elif _HELPERS[1] not in cmdline:
            found.append(child)
    return found


STOPPED_FILE_ENV = "DTRAIN_NODE_STOPPED_FILE"
"""Set by ``trainer.launch`` where torch's agent cannot be told to restart its workers only for a resumable
exit (``trainer.torch_private``, hook ``agent_restarts_only_resumable``): a file that a worker writes its
exit code to when it stops for good (a crash, the dollar cap, a fence, a full disk). A worker that the agent
restarts after that finds it and exits with the same code at once, before it builds or spends anything."""
RESUMABLE_CODES = frozenset({0, 75, 76})
"""Exits after which the group goes on: done, saved and stopped (preempted), lost a peer."""


def remember_stops_for_restarts() -> None:
    """Set ``STOPPED_FILE_ENV`` in this agent's environment (its workers' to be), once; removed at exit."""
    import atexit
    import shutil
    import tempfile

    if not os.environ.get(STOPPED_FILE_ENV):
        os.environ[STOPPED_FILE_ENV] = path = os.path.join(tempfile.mkdtemp(prefix="dtrain-node-"), "stopped")
        atexit.register(shutil.rmtree, os.path.dirname(path), True)


def stopped_for_good(environ=None) -> int | None:
    """The exit code an earlier worker of this node stopped for good with, None if none did."""
    path = (os.environ if environ is None else environ).get(STOPPED_FILE_ENV)
    try:
        return int(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        return None


def remember_a_stop(code: int, environ=None) -> None:
    """Note ``code`` for the workers the agent restarts next, if it stops this node for good."""
    path = (os.environ if environ is None else environ).get(STOPPED_FILE_ENV)
    if path and code not in RESUMABLE_CODES and stopped_for_good(environ) is None:
        tmp = f"{path}.{os.getpid()}"
        Path(tmp).write_text(str(code))
        os.replace(tmp, path)
