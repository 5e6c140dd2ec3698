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
from pathlib import Path

import psutil

from airflow_dtrain.launchers.base import PREEMPTED_EXIT_CODE, GroupState, deadline_words
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


def _die_with(parent: int):
    """A preexec_fn: the child gets SIGTERM when ``parent`` dies (None off Linux).

    The signal follows the death of the forking *thread*: the supervisor starts its nodes from
    its main thread, which lives as long as it does. If the parent died before the prctl, the
    child has been reparented already: it stops itself.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, before the fork

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _pump(stream, prefix: bytes, sink, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
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
            return GroupState.FAILED, (f"node {i} exited {code}: another group took over the checkpoint directory "
                                       "(a newer writer lease); this group stopped without committing")
    for i, code in sorted(own.items()):
        if code == STORAGE_EXIT_CODE:
            return GroupState.FAILED, (f"node {i} exited {code}: a checkpoint could not be written (a full disk, no "
                                       "permission or a read-only location; the [trainer] line in the log names the "
                                       "path and the cause); the older checkpoints are intact")
    for i, code in sorted(own.items()):
        if code == PREEMPTED_EXIT_CODE:
            return GroupState.PREEMPTED, f"node {i} exited {code} (preempted, resumable)"
    for i, code in sorted(own.items()):
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            return GroupState.PREEMPTED, f"node {i} was killed by {name} (node lost; resumable)"
    for i, code in sorted(own.items()):
        if code == BUDGET_EXIT_CODE:
            return GroupState.FAILED, f"node {i} exited {code} (stopped at the job's dollar cap, checkpoint saved)"
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
            preexec_fn=_die_with(os.getpid()),
        )
        pump = threading.Thread(target=_pump, args=(node.stdout, f"[node{index}]".encode(), sink, lock))
        pump.start()
        nodes.append(node)
        pumps.append(pump)
    write_json_atomic(
        group_dir / "nodes.json",
        {str(i): {"pid": n.pid, "create_time": psutil.Process(n.pid).create_time()} for i, n in enumerate(nodes)},
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
    if at_budget and not stop_requested.is_set() and state != GroupState.SUCCEEDED:
        if collateral:  # still running at the end of the grace period (a hung trainer): SIGKILL
            how = (f"SIGTERM, then SIGKILL after the {budget['grace_s']}s grace period to node(s) "
                   f"{', '.join(map(str, sorted(collateral)))}, still running: what they trained since their last "
                   f"checkpoint is lost")  # fmt: skip
        else:
            how = "SIGTERM: each rank saved its step within the grace period"
        state, message = GroupState.AT_BUDGET, (
            f"stopped at the job's dollar cap by its supervisor: the group reached its "
            f"{deadline_words(budget, 'deadline')} ({how}); {message}"
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
            {"state": GroupState.FAILED.value, "message": f"supervisor error: {err!r}", "node_exit_codes": {}},
        )
        code = 1
    os._exit(code)


if __name__ == "__main__":
    sys.exit(_daemonize_and_run(Path(sys.argv[1])))
