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
from airflow_dtrain.launchers.local_memory import OUT_OF_MEMORY, MemoryLimit
from trainer.config import BUDGET_EXIT_CODE, FENCED_EXIT_CODE, STORAGE_EXIT_CODE

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


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


def _pump(stream, prefix: bytes, sink, lock: threading.Lock, said: dict[int, tuple[float, str]],
          index: int) -> None:  # fmt: skip
    """Copy one node's output into the group's log, noting its first line that says an allocation failed."""
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        if index not in said and OUT_OF_MEMORY.search(text := line.decode("utf-8", "replace")):
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
    said: dict[int, tuple[float, str]] = {}  # per node: its first line that says an allocation failed
    nodes, pumps = _start_nodes(group, env, sink, lock, memory, said)
    write_json_atomic(
        group_dir / "nodes.json",
        {
            str(i): {"pid": n.pid, "create_time": psutil.Process(n.pid).create_time()}
            for i, n in enumerate(nodes)
        },
    )
    watch = _Watch(group_dir, group, nodes, stop_requested)
    while watch.tick(time.monotonic()):
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
    state, message = _outcome(watch, codes, memory.ran_out(said) if memory else None)
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


def _start_nodes(
    group: dict,
    env: dict[str, str],
    sink,
    lock: threading.Lock,
    memory: MemoryLimit | None,
    said: dict[int, tuple[float, str]],
) -> tuple[list[subprocess.Popen], list[threading.Thread]]:
    """One torchrun agent per node, in a session of its own, its output pumped into the group's log."""
    nodes: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
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
    return nodes, pumps


class _Watch:
    """The supervisor's watch over a running group, one ``tick`` every 0.2 s: the budget deadline (and an
    earlier one written since), a stop request, and a node that ended badly, each ending the rest in time."""

    def __init__(
        self, group_dir: Path, group: dict, nodes: list[subprocess.Popen], stop_requested: threading.Event
    ) -> None:
        self.group_dir, self.nodes, self.stop_requested = group_dir, nodes, stop_requested
        self.peer_grace = float(group.get("peer_exit_grace_s", 30.0))
        self.budget = group.get("budget_deadline")  # launchers.base.budget_deadline, with "at" (wall clock)
        # LocalLauncher.shorten_deadline writes an earlier one here when the spot price rose
        # (repriced_deadline)
        self.earlier, self.earlier_seen = group_dir / "budget_deadline.json", 0.0
        self.at_budget = False
        self.collateral: set[int] = set()
        self.first_bad_exit: float | None = None
        self.stop_deadline: float | None = None

    def tick(self, now: float) -> bool:
        """One look at the nodes at ``now`` (monotonic); False once none is running."""
        codes = {i: n.poll() for i, n in enumerate(self.nodes)}
        running = [i for i, c in codes.items() if c is None]
        if not running:
            return False
        self._reprice(now)
        if (
            self.budget
            and not self.at_budget
            and self.stop_deadline is None
            and time.time() >= self.budget["at"]
        ):
            # The money left is spent but for the final save's grace and the exit's margin: as the Job
            # controller does at activeDeadlineSeconds, SIGTERM (each rank saves its step), then after the
            # grace SIGKILL, so that what is left running is killed, and its end seen, within the budget.
            self.at_budget = True
            self._terminate(running, now + self.budget["grace_s"])
        if self.stop_requested.is_set() and self.stop_deadline is None:
            request = self.group_dir / "stop_request.json"
            grace = json.loads(request.read_text())["grace_period_s"] if request.exists() else 30.0
            self._terminate(running, now + grace)  # the agent forwards SIGTERM to its workers, which save
        if self.first_bad_exit is None and any(c not in (None, 0) for c in codes.values()):
            # Peers of a preempted node are saving the same checkpoint and exit on their own;
            # peers of a crashed node hang in a collective until we end them.
            self.first_bad_exit = now
        expired = (self.first_bad_exit is not None and now - self.first_bad_exit > self.peer_grace) or (
            self.stop_deadline is not None and now > self.stop_deadline
        )
        if expired:
            for i in running:
                self.collateral.add(i)
                kill_tree(self.nodes[i].pid)
        return True

    def _reprice(self, now: float) -> None:
        """Every second: take an earlier budget deadline written since (``budget_deadline.json``)."""
        if not self.budget or self.at_budget or now - self.earlier_seen < 1.0:
            return
        self.earlier_seen = now
        try:
            repriced = json.loads(self.earlier.read_text())
            if repriced["at"] < self.budget["at"]:
                self.budget = repriced
        except (FileNotFoundError, ValueError, KeyError):
            pass

    def _terminate(self, running: list[int], deadline: float) -> None:
        """SIGTERM to the running nodes; what still runs at ``deadline`` is killed."""
        self.stop_deadline = deadline
        for i in running:
            self.nodes[i].send_signal(signal.SIGTERM)


def _outcome(watch: _Watch, codes: dict[int, int], ran_out: str | None) -> tuple[GroupState, str]:
    """The group's end state and message: from its exit codes (``classify``), then what explains them better:
    a node that ran out of its memory limit, the budget deadline the supervisor stopped it at."""
    stopped = watch.stop_requested.is_set()
    state, message = classify(codes, watch.collateral, stopped)
    if (ran_out and not stopped and not watch.at_budget
            and state in (GroupState.FAILED, GroupState.PREEMPTED)
            and not {FENCED_EXIT_CODE, STORAGE_EXIT_CODE} & set(codes.values())):  # fmt: skip
        # its peers then failed in a collective, were stopped by their agent or by us: not the cause
        state, message = GroupState.FAILED, ran_out
    if not watch.at_budget or stopped or state == GroupState.SUCCEEDED:
        return state, message
    budget = watch.budget
    if watch.collateral:  # still running at the end of the grace period (a hung trainer): SIGKILL
        how = (f"SIGTERM, then SIGKILL after the {budget['grace_s']}s grace period to node(s) "
               f"{', '.join(map(str, sorted(watch.collateral)))}, still running: what they trained since "
               f"their last checkpoint is lost")  # fmt: skip
    else:
        how = "SIGTERM: each rank saved its step within the grace period"
    return GroupState.AT_BUDGET, (
        f"stopped at the job's dollar cap by its supervisor: the group reached its "
        f"{deadline_words(budget, 'deadline')} ({how}); {message}"
    )


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
