"""Supervisor of one local pod group.

``python -m airflow_dtrain.launchers._local_supervisor GROUP_DIR`` is started,
detached, by ``LocalLauncher.launch``. It outlives the Airflow worker that
started it (that is what lets a restarted task reattach), starts one torchrun
agent per node, copies their output into ``group.log`` with a ``[nodeN]``
prefix, ends the group when one node ends badly, and writes ``result.json``
last. It is a child subreaper, so torchrun workers orphaned by a dead agent are
reparented to it and never outlive the group.

If the supervisor itself dies (kill -9, the OOM killer), its agents get SIGTERM from the
kernel (PR_SET_PDEATHSIG): they forward it to their workers, which save their step and
exit 75, as on a preemption; workers whose agent is killed outright get the same from
their own parent-death signal (trainer/__main__.py). Nothing of a dead supervisor's group
trains on beside the group an Airflow retry launches next.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psutil

from airflow_dtrain.launchers.base import PREEMPTED_EXIT_CODE, GroupState, deadline_words
from trainer.config import BUDGET_EXIT_CODE, FENCED_EXIT_CODE, STORAGE_EXIT_CODE

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
_OUT_OF_MEMORY = re.compile(
    r"(?<![A-Za-z])MemoryError|std::bad_alloc|[Cc]annot allocate memory|can't allocate memory"
)
"""What a process says when an allocation failed (under RLIMIT_DATA, malloc and mmap fail with ENOMEM):
Python's MemoryError, C++'s std::bad_alloc, torch's CPU allocator, an OSError of errno 12 (ENOMEM). Never a
GPU's (``torch.OutOfMemoryError: CUDA out of memory``): the limit is the host's."""


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid`` and all its descendants (torchrun workers live in their own sessions)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _die_with(parent: int, then: Callable[[], None] | None = None):
    """A preexec_fn: the child gets SIGTERM when ``parent`` dies, then runs ``then`` (off Linux: ``then``).

    The signal follows the death of the forking *thread*: the supervisor starts its nodes from
    its main thread, which lives as long as it does. If the parent died before the prctl, the
    child has been reparented already: it stops itself.
    """
    if not sys.platform.startswith("linux"):
        return then
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, before the fork

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        if then is not None:
            then()

    return preexec


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def _cgroup_parent() -> Path | None:
    """Where this process may make cgroups (v2) that have the memory controller: its own cgroup or the one
    above it (a cgroup delegated to the Airflow worker, or root's), when the machine has cgroup v2 with memory
    enabled there and lets this process write it; None otherwise (cgroup v1, a read-only /sys/fs/cgroup in a
    container, no delegation)."""
    try:
        cgroups = Path("/proc/self/cgroup").read_text().splitlines()
        own = next(line[3:] for line in cgroups if line.startswith("0::"))
        # "<id> <parent> <dev> <root> <mount point> <options> ... - <fstype> <source> <options>"
        mounts = (line.partition(" - ") for line in Path("/proc/self/mountinfo").read_text().splitlines())
        mount = next(Path(head.split()[4]) for head, _, tail in mounts if tail.split()[:1] == ["cgroup2"])
    except (OSError, StopIteration, IndexError):
        return None
    here = Path(os.path.normpath(mount / own.lstrip("/")))
    for candidate in (here, here.parent):
        try:
            if (
                mount in (candidate, *candidate.parents)
                and os.access(candidate, os.W_OK)
                and "memory" in (candidate / "cgroup.subtree_control").read_text().split()
            ):
                return candidate
        except OSError:
            continue
    return None


def _join(cgroup: Path) -> None:
    """Move the calling process into ``cgroup`` (in a child, before it execs)."""
    with open(cgroup / "cgroup.procs", "w") as procs:
        procs.write(str(os.getpid()))


class MemoryLimit:
    """Each node's memory limit (``group.json``'s ``memory_limit``, from ``local.memory_limit``) as this
    machine enforces it, and whether a node ran out of it.

    * **cgroup v2**, where this process may make cgroups with the memory controller (``_cgroup_parent``): one
      per node, ``memory.max`` the limit and no swap, so that all the node's processes together stay within
      it, page cache and /dev/shm included, as a pod's on Kubernetes. Past it the kernel's OOM killer ends one
      of them (SIGKILL), which the cgroup's ``memory.events`` counts.
    * else **RLIMIT_DATA**, set in each node's first process (its torchrun agent) before it starts and
      inherited by every process it starts: a cap *per process*, the node's limit shared out among its
      ``procs_per_node`` workers (the agent, about 0.2 GiB, takes a share of its own: the node's processes
      together may use up to one share more than the limit). It counts a process's private writable memory:
      the heap and anonymous mappings, where tensors and Python objects live; about the resident set of a
      torch worker (one of the tiny debug group, measured: 435 MiB of it at its peak, 455 MiB resident; it
      trains under a limit of 450 MiB, not under 400). Not counted: file mappings, stacks, shared memory
      (/dev/shm, DataLoader workers' shared tensors). Past it an allocation fails: the process says so
      (MemoryError, std::bad_alloc, torch's "can't allocate memory": ``_OUT_OF_MEMORY``) and exits. A process
      running as root may raise its own limit: a guard against a job that asks for too much, not against a
      hostile program. RLIMIT_AS (the address space) is not used: the same worker needs 1.3 GiB of it (three
      times its resident set, more with every thread), and under it fails where a thread cannot start (in a
      checkpoint's save), saying nothing of memory.
    """

    def __init__(self, limit: dict, nodes: int, tag: str) -> None:
        self.bytes, self.source = int(limit["bytes"]), str(limit["source"])
        # Never above a limit the worker already runs under (only root may raise one), nor above 2**62 (as
        # good as none; setrlimit refuses what exceeds 64 bits).
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        ceiling = 2**62 if hard == resource.RLIM_INFINITY else hard
        self.per_process = min(ceiling, max(1, self.bytes // max(1, int(limit.get("procs_per_node", 1)))))
        self.cgroups = self._make_cgroups(nodes, tag)

    def _make_cgroups(self, nodes: int, tag: str) -> list[Path] | None:
        parent = _cgroup_parent()
        if parent is None:
            return None
        made: list[Path] = []
        try:
            for index in range(nodes):
                cgroup = parent / f"{tag}-node{index}"
                cgroup.mkdir()
                made.append(cgroup)
                (cgroup / "memory.max").write_text(str(self.bytes))
                if (cgroup / "memory.swap.max").exists():
                    (cgroup / "memory.swap.max").write_text("0")  # past the limit it fails, never swaps
            # Can a child of ours join one? Moving a process needs write access to the common parent of the
            # cgroup it leaves and the one it joins: try it with a process that does nothing.
            subprocess.run(["true"], preexec_fn=lambda: _join(made[0]), check=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            _remove(made)
            return None
        return made

    def words(self) -> str:
        """How much, from where, and how it is enforced: ``4.0 GiB (resources.memory), 2.0 GiB per process
        under RLIMIT_DATA``."""
        how = (
            "in a cgroup per node (memory.max)" if self.cgroups
            else f"{_gib(self.per_process)} per process under RLIMIT_DATA"
        )  # fmt: skip
        return f"{_gib(self.bytes)} ({self.source}), {how}"

    def enter(self, index: int) -> None:
        """In node ``index``'s first process, before it execs (its preexec_fn)."""
        if self.cgroups:
            _join(self.cgroups[index])
        else:
            resource.setrlimit(resource.RLIMIT_DATA, (self.per_process, self.per_process))

    def ran_out(self, said: dict[int, tuple[float, str]]) -> str | None:
        """Why the group ended, when a node ran out of its limit: the message; None otherwise.

        :param said: per node, the first line of its output that says an allocation failed, and when.
        """
        if self.cgroups:
            killed = {i: _read_events(c / "memory.events").get("oom_kill", 0)
                      for i, c in enumerate(self.cgroups)}  # fmt: skip
            index = next((i for i, n in killed.items() if n), None)
            if index is None:
                return None
            evidence = f"the kernel killed {killed[index]} of its processes (SIGKILL)"
        elif said:
            index, (_, evidence) = min(said.items(), key=lambda item: item[1][0])  # the first to say so
        else:
            return None
        return f"node {index} ran out of its memory limit of {self.words()}: {evidence[:300]}"

    def close(self) -> None:
        """Remove the nodes' cgroups (once their processes have ended)."""
        _remove(self.cgroups or [])


def _remove(cgroups: list[Path]) -> None:
    for cgroup in cgroups:
        try:
            cgroup.rmdir()
        except OSError:
            pass


def _read_events(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, _, v in (line.partition(" ") for line in path.read_text().splitlines())}
    except (OSError, ValueError):
        return {}


def _pump(stream, prefix: bytes, sink, lock: threading.Lock, said: dict[int, tuple[float, str]],
          index: int) -> None:  # fmt: skip
    """Copy one node's output into the group's log, noting its first line that says an allocation failed."""
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        if index not in said and _OUT_OF_MEMORY.search(text := line.decode("utf-8", "replace")):
            said[index] = (time.monotonic(), text.strip())
        with lock:
            sink.write(prefix + line)
    stream.close()


def classify(codes: dict[int, int], collateral: set[int], stopped: bool) -> tuple[GroupState, str]:
    """Turn node exit codes into a group state.

    ``collateral`` are nodes this supervisor killed because a peer had already
    ended: their exit codes say nothing about the cause.
    """
    if stopped:
        return GroupState.STOPPED, "stopped on request"
    if all(code == 0 for code in codes.values()):
        return GroupState.SUCCEEDED, "all nodes exited 0"
    own = {i: c for i, c in codes.items() if i not in collateral and c != 0}
    for i, code in sorted(own.items()):
        if code == FENCED_EXIT_CODE:
            return GroupState.FAILED, (
                f"node {i} exited {code}: another group took over the checkpoint directory "
                "(a newer writer lease); this group stopped without committing"
            )
    for i, code in sorted(own.items()):
        if code == STORAGE_EXIT_CODE:
            return GroupState.FAILED, (
                f"node {i} exited {code}: a checkpoint could not be written (a full disk, no "
                "permission or a read-only location; the [trainer] line in the log names the "
                "path and the cause); the older checkpoints are intact"
            )
    for i, code in sorted(own.items()):
        if code == PREEMPTED_EXIT_CODE:
            return GroupState.PREEMPTED, f"node {i} exited {code} (preempted, resumable)"
    for i, code in sorted(own.items()):
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            return GroupState.PREEMPTED, f"node {i} was killed by {name} (node lost; resumable)"
    for i, code in sorted(own.items()):
        if code == BUDGET_EXIT_CODE:
            return (
                GroupState.FAILED,
                f"node {i} exited {code} (stopped at the job's dollar cap, checkpoint saved)",
            )
    if own:
        i, code = sorted(own.items())[0]
        return GroupState.FAILED, f"node {i} exited {code}"
    return GroupState.FAILED, "nodes were stopped after a peer ended"


def _node_env(env: dict[str, str], group: dict, index: int) -> dict[str, str]:
    per_node = group.get("node_env") or []
    return {**env, **(per_node[index] if index < len(per_node) else {})}


def main(group_dir: Path) -> int:
    group = json.loads((group_dir / "group.json").read_text())
    _become_subreaper()
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: stop_requested.set())

    env = {**os.environ, **group["env"]}
    lock = threading.Lock()
    sink = open(group_dir / "group.log", "ab", buffering=0)  # noqa: SIM115 - lives as long as the group
    memory = None
    if group.get("memory_limit"):  # a group.json of an earlier version has none
        tag = f"dtrain-{group['name']}-{os.getpid()}"  # what its cgroups, if any, are called
        memory = MemoryLimit(group["memory_limit"], len(group["node_commands"]), tag)
        sink.write(f"[supervisor] memory limit of each node: {memory.words()}\n".encode())
    try:
        return _run(group_dir, group, env, sink, lock, stop_requested, memory)
    finally:
        if memory is not None:
            memory.close()


def _run(
    group_dir: Path,
    group: dict,
    env: dict[str, str],
    sink,
    lock: threading.Lock,
    stop_requested: threading.Event,
    memory: MemoryLimit | None,
) -> int:
    """Start the nodes, watch them to their end, write ``result.json``."""
    nodes: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    said: dict[int, tuple[float, str]] = {}  # per node: its first line that says an allocation failed
    for index, command in enumerate(group["node_commands"]):
        node = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_node_env(env, group, index),
            cwd=group.get("cwd") or None,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid(), partial(memory.enter, index) if memory else None),
        )
        prefix = f"[node{index}]".encode()
        pump = threading.Thread(target=_pump, args=(node.stdout, prefix, sink, lock, said, index))
        pump.start()
        nodes.append(node)
        pumps.append(pump)
    write_json_atomic(
        group_dir / "nodes.json",
        {
            str(i): {"pid": n.pid, "create_time": psutil.Process(n.pid).create_time()}
            for i, n in enumerate(nodes)
        },
    )

    peer_grace = float(group.get("peer_exit_grace_s", 30.0))
    budget = group.get("budget_deadline")  # launchers.base.budget_deadline, with "at" (wall clock)
    # LocalLauncher.shorten_deadline writes an earlier one here when the spot price rose (repriced_deadline)
    earlier, earlier_seen = group_dir / "budget_deadline.json", 0.0
    at_budget = False
    collateral: set[int] = set()
    first_bad_exit: float | None = None
    stop_deadline: float | None = None
    while True:
        codes = {i: n.poll() for i, n in enumerate(nodes)}
        running = [i for i, c in codes.items() if c is None]
        if not running:
            break
        now = time.monotonic()
        if budget and not at_budget and now - earlier_seen >= 1.0:
            earlier_seen = now
            try:
                repriced = json.loads(earlier.read_text())
                if repriced["at"] < budget["at"]:
                    budget = repriced
            except (FileNotFoundError, ValueError, KeyError):
                pass
        if budget and not at_budget and stop_deadline is None and time.time() >= budget["at"]:
            # The money left is spent but for the final save's grace and the exit's margin: as the Job
            # controller does at activeDeadlineSeconds, SIGTERM (each rank saves its step), then after the grace
            # SIGKILL, so that what is left running is killed, and its end seen, within the budget.
            at_budget = True
            stop_deadline = now + budget["grace_s"]
            for i in running:
                nodes[i].send_signal(signal.SIGTERM)
        if stop_requested.is_set() and stop_deadline is None:
            request = group_dir / "stop_request.json"
            grace = json.loads(request.read_text())["grace_period_s"] if request.exists() else 30.0
            stop_deadline = now + grace
            for i in running:  # the agent forwards SIGTERM to its workers, which checkpoint and exit
                nodes[i].send_signal(signal.SIGTERM)
        if first_bad_exit is None and any(c not in (None, 0) for c in codes.values()):
            # Peers of a preempted node are saving the same checkpoint and exit on their own;
            # peers of a crashed node hang in a collective until we end them.
            first_bad_exit = now
        expired = (first_bad_exit is not None and now - first_bad_exit > peer_grace) or (
            stop_deadline is not None and now > stop_deadline
        )
        if expired:
            for i in running:
                collateral.add(i)
                kill_tree(nodes[i].pid)
        time.sleep(0.2)

    for child in psutil.Process().children(recursive=True):  # orphans reparented to us
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    for pump in pumps:
        pump.join(timeout=5)
    sink.close()
    codes = {i: n.returncode for i, n in enumerate(nodes)}
    state, message = classify(codes, collateral, stop_requested.is_set())
    ran_out = memory.ran_out(said) if memory else None
    if (ran_out and not stop_requested.is_set() and not at_budget
            and state in (GroupState.FAILED, GroupState.PREEMPTED)
            and not {FENCED_EXIT_CODE, STORAGE_EXIT_CODE} & set(codes.values())):  # fmt: skip
        # its peers then failed in a collective, were stopped by their agent or by us: not the cause
        state, message = GroupState.FAILED, ran_out
    if at_budget and not stop_requested.is_set() and state != GroupState.SUCCEEDED:
        if collateral:  # still running at the end of the grace period (a hung trainer): SIGKILL
            how = (f"SIGTERM, then SIGKILL after the {budget['grace_s']}s grace period to node(s) "
                   f"{', '.join(map(str, sorted(collateral)))}, still running: what they trained since their last "
                   f"checkpoint is lost")  # fmt: skip
        else:
            how = "SIGTERM: each rank saved its step within the grace period"
        state, message = (
            GroupState.AT_BUDGET,
            (
                f"stopped at the job's dollar cap by its supervisor: the group reached its "
                f"{deadline_words(budget, 'deadline')} ({how}); {message}"
            ),
        )
    write_json_atomic(
        group_dir / "result.json",
        {
            "state": state.value,
            "message": message,
            "node_exit_codes": {str(i): c for i, c in codes.items()},
            "finished_at": time.time(),
        },
    )
    return 0


def _daemonize_and_run(group_dir: Path) -> int:
    # Double fork: the launcher reaps the intermediate at once, so the supervisor is
    # nobody's zombie-to-be and survives the Airflow worker that started it.
    if os.fork() > 0:
        return 0
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    me = psutil.Process()
    write_json_atomic(group_dir / "supervisor.json", {"pid": me.pid, "create_time": me.create_time()})
    try:
        code = main(group_dir)
    except BaseException as err:  # noqa: BLE001 - the result must say why the group ended
        for child in psutil.Process().children(recursive=True):
            child.kill()
        write_json_atomic(
            group_dir / "result.json",
            {
                "state": GroupState.FAILED.value,
                "message": f"supervisor error: {err!r}",
                "node_exit_codes": {},
            },
        )
        code = 1
    os._exit(code)


if __name__ == "__main__":
    sys.exit(_daemonize_and_run(Path(sys.argv[1])))
