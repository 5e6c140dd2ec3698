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

from airflow_dtrain.launchers._local_elastic import ElasticNodes, append_node_change
from airflow_dtrain.launchers._local_outcome import outcome
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local_memory import OUT_OF_MEMORY, MemoryLimit

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
    starter = _Starter(group_dir, group, env, sink, lock, memory, said)
    if group.get("rdzv_store"):  # an elastic group's store, outside every node (rdzv_store); ended below
        starter.start_store(group["rdzv_store"])
    nodes = [starter.start(index) for index in range(len(group["node_commands"]))]
    starter.record(nodes)
    if group.get("elastic"):
        append_node_change(group_dir, len(nodes), "launch")
    watch = _Watch(group_dir, group, nodes, stop_requested, starter)
    while watch.tick(time.monotonic()):
        time.sleep(0.2)

    for child in psutil.Process().children(recursive=True):  # orphans reparented to us
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    for pump in starter.pumps:
        pump.join(timeout=5)
    sink.close()
    codes = {i: n.returncode for i, n in enumerate(nodes)}
    state, message = outcome(watch, codes, memory.ran_out(said) if memory else None)
    result = {
        "state": state.value,
        "message": message,
        "node_exit_codes": {str(i): c for i, c in codes.items()},
        "finished_at": time.time(),
    }
    if watch.elastic is not None:
        result["replacements"] = watch.elastic.replacements
    write_json_atomic(group_dir / "result.json", result)
    return 0


class _Starter:
    """Starts one node's torchrun agent (in a session of its own, its output pumped into the group's log),
    at launch and, in an elastic group, again as the replacement of a lost node."""

    def __init__(self, group_dir: Path, group: dict, env: dict[str, str], sink, lock: threading.Lock,
                 memory: MemoryLimit | None, said: dict[int, tuple[float, str]]) -> None:  # fmt: skip
        self.group_dir, self.group, self.env, self.sink, self.lock = group_dir, group, env, sink, lock
        self.memory, self.said = memory, said
        self.pumps: list[threading.Thread] = []

    def start(self, index: int) -> subprocess.Popen:
        memory = self.memory
        node = subprocess.Popen(
            self.group["node_commands"][index],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_node_env(self.env, self.group, index),
            cwd=self.group.get("cwd") or None,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid(), partial(memory.enter, index) if memory else None),
        )
        prefix = f"[node{index}]".encode()
        args = (node.stdout, prefix, self.sink, self.lock, self.said, index)
        pump = threading.Thread(target=_pump, args=args)
        pump.start()
        self.pumps.append(pump)
        return node

    def start_store(self, argv: list[str]) -> None:
        """Start the group's rendezvous store (its output in the group's log as ``[rdzv]``); the agents, its
        clients, wait for it to listen. It ends with the supervisor's other children."""
        store = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env=self.env, cwd=self.group.get("cwd") or None,
                                 start_new_session=True, preexec_fn=_die_with(os.getpid()))  # fmt: skip
        pump = threading.Thread(target=_pump, args=(store.stdout, b"[rdzv]", self.sink, self.lock, {}, -1))
        pump.start()
        self.pumps.append(pump)

    def record(self, nodes: list[subprocess.Popen]) -> None:
        """``nodes.json``: each node's current agent (pid and start time), rewritten at every replacement."""
        records = {}
        for i, n in enumerate(nodes):
            try:
                records[str(i)] = {"pid": n.pid, "create_time": psutil.Process(n.pid).create_time()}
            except psutil.NoSuchProcess:  # ended already: its record can match no live process
                records[str(i)] = {"pid": n.pid, "create_time": 0.0}
        write_json_atomic(self.group_dir / "nodes.json", records)

    def say(self, line: str) -> None:
        """A line of the supervisor's own in the group's log."""
        with self.lock:
            self.sink.write(f"[supervisor] {line}\n".encode())


class _Watch:
    """The supervisor's watch over a running group, one ``tick`` every 0.2 s: the budget deadline (as moved
    since), a stop request, and a node that ended badly, each ending the rest in time."""

    def __init__(self, group_dir: Path, group: dict, nodes: list[subprocess.Popen],
                 stop_requested: threading.Event, starter: _Starter | None = None) -> None:  # fmt: skip
        self.group_dir, self.nodes, self.stop_requested, self.starter = (
            group_dir,
            nodes,
            stop_requested,
            starter,
        )
        self.elastic = None  # an elastic group: its peers go on without a lost node, which is replaced
        if group.get("elastic") and starter is not None:
            self.elastic = ElasticNodes(group_dir, group["elastic"], self._replace, starter.say,
                                        standalone_store=bool(group.get("rdzv_store")))  # fmt: skip
        self.peer_grace = float(group.get("peer_exit_grace_s", 30.0))
        self.budget = group.get("budget_deadline")  # launchers.base.budget_deadline, with "at" (wall clock)
        # LocalLauncher.move_deadline writes a moved one here (repriced_deadline): earlier when the spot price
        # rose, later when the group spent less than its launch deadline assumed
        self.moved, self.moved_seen = group_dir / "budget_deadline.json", 0.0
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
        if self.first_bad_exit is None and any(c not in (None, 0) and not self._absorbed(i, c)
                                               for i, c in codes.items()):  # fmt: skip
            # Peers of a preempted node are saving the same checkpoint and exit on their own;
            # peers of a crashed node hang in a collective until we end them.
            self.first_bad_exit = now
        if self.elastic is not None and self.stop_deadline is None and self.first_bad_exit is None:
            self.elastic.note(len(running))  # a loss, then its replacement: two lines, even in one tick
            self.elastic.note(len(running) + self.elastic.replace(len(running)))
        expired = (self.first_bad_exit is not None and now - self.first_bad_exit > self.peer_grace) or (
            self.stop_deadline is not None and now > self.stop_deadline
        )
        if expired:
            for i in running:
                self.collateral.add(i)
                kill_tree(self.nodes[i].pid)
        return True

    def _absorbed(self, index: int, code: int) -> bool:
        """Whether an elastic group goes on without node ``index``, whose agent ended with ``code`` (never
        once the group is being stopped or has a node that ended badly)."""
        if self.elastic is None:
            return False
        if index in self.elastic.absorbed:
            return True
        return self.stop_deadline is None and self.first_bad_exit is None and self.elastic.absorb(index, code)

    def _replace(self, index: int) -> None:
        """Start node ``index``'s agent again (an elastic group's replacement of a lost node)."""
        self.nodes[index] = self.starter.start(index)
        self.starter.record(self.nodes)

    def _reprice(self, now: float) -> None:
        """Every second: take the budget deadline moved since (``budget_deadline.json``)."""
        if not self.budget or self.at_budget or now - self.moved_seen < 1.0:
            return
        self.moved_seen = now
        try:
            moved = json.loads(self.moved.read_text())
            moved["at"] = float(moved["at"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return
        self.budget = moved

    def _terminate(self, running: list[int], deadline: float) -> None:
        """SIGTERM to the running nodes; what still runs at ``deadline`` is killed."""
        self.stop_deadline = deadline
        for i in running:
            self.nodes[i].send_signal(signal.SIGTERM)


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
