"""The ``local`` backend: a pod group as processes on this machine.

Every node is its own torchrun agent (``python -m trainer.launch``, torchrun with
exit codes that say "preempted"), so ``num_nodes=2, procs_per_node=1`` is a real
two-node c10d rendezvous over 127.0.0.1. A detached supervisor per group
(``_local_supervisor``) owns the processes; this class only reads and writes the
group's directory, so any process on the machine -- a restarted worker, the
triggerer -- can find, watch and stop a group by name.

Group directory ``<state_dir>/<name>/``: ``group.json`` (what to run),
``train_config.json``, ``supervisor.json`` and ``nodes.json`` (pids),
``capacity.json`` and ``nodes.jsonl`` (an elastic group's capacity and node count over time),
``group.log`` (every process's output, ``[nodeN][rankR]:`` prefixed, for people to read),
``events/rank-<R>.jsonl`` (each rank's events, what programs read: ``trainer/events.py``, ``events()``)
and ``result.json`` (written last: the group has ended).

Each node runs under a memory limit (``memory_limit``), so that a job that asks for
too much fails, saying which limit it ran out of, instead of taking the machine and
the Airflow worker on it down.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from airflow_dtrain.launchers._local_elastic import CAPACITY_FILE, elastic_terms, read_node_changes
from airflow_dtrain.launchers._local_supervisor import write_json_atomic
from airflow_dtrain.launchers.ports import free_port as _free_port
from airflow_dtrain.launchers.base import GroupState, GroupStatus, LogChunk, PodGroupLauncher, deadline_moves
from trainer.money.deadline import budget_deadline
from airflow_dtrain.launchers.local_memory import memory_limit
from airflow_dtrain.launchers.local_processes import (
    GROUP_DIR_ENV,
    alive,
    group_processes,
    signal_workers,
    sweep,
)
from airflow_dtrain.launchers.state_dir import compile_cache_env, default_state_dir
from airflow_dtrain.launchers.torchrun import agent_env, node_command
from trainer.events import EVENTS_DIR_ENV, EventCursor
from trainer.elastic.rdzv_round import CAPACITY_FILE_ENV

if TYPE_CHECKING:
    from airflow_dtrain.job.spec import JobSpec

EVENTS_SUBDIR = "events"
"""The group's events directory, under its group directory (``DTRAIN_EVENTS_DIR`` of its ranks)."""
_MAX_LOG_CHUNK = 1 << 20
PREDECESSOR_WAIT_CAP_S = 600.0
"""The longest a launch waits for an earlier group's processes, whatever the spec's grace period."""


def _threads_per_process(processes: int) -> int:
    """CPU threads (``OMP_NUM_THREADS``) for each of a group's ``processes``: the machine's cores shared out
    among them, unless the Airflow worker's environment sets ``OMP_NUM_THREADS`` (an admin running several
    groups, or other work, on one machine): then that, so that groups started side by side do not each take
    every core (oversubscribed OpenMP threads spin, and a CPU run gets several times slower)."""
    explicit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not explicit:
        return max(1, (os.cpu_count() or 1) // processes)
    if not explicit.isdigit() or int(explicit) < 1:
        raise ValueError(f"OMP_NUM_THREADS: a whole number of threads, at least 1, got {explicit!r}")
    return int(explicit)


class LocalLauncher(PodGroupLauncher):
    """Runs pod groups as torchrun agents on this machine.

    :param state_dir: where group directories live; shared by worker and triggerer.
    :param python: interpreter for the agents (default: this one, which must have the trainer extra).
    :param peer_exit_grace_s: after one node ends badly, how long its peers get to exit on their own.
    """

    backend = "local"
    log = logging.getLogger(__name__)

    def __init__(
        self,
        state_dir: str | os.PathLike | None = None,
        python: str | None = None,
        peer_exit_grace_s: float = 30.0,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.python = python or sys.executable
        self.peer_exit_grace_s = peer_exit_grace_s

    def _dir(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"name: not a group name: {name!r}")
        return self.state_dir / name

    def launch(self, name: str, spec: JobSpec, *, spent_usd: float = 0.0) -> GroupStatus:
        if self.python == sys.executable and importlib.util.find_spec("torch") is None:
            raise RuntimeError(
                "the local backend runs the trainer on this machine and needs the trainer extra: "
                "pip install 'airflow-dtrain[trainer]'"
            )
        group_dir = self._dir(name)
        if (group_dir / "group.json").exists():
            raise ValueError(f"group {name!r} already exists in {self.state_dir}")
        threads = _threads_per_process(spec.num_nodes * spec.procs_per_node)
        memory = {**memory_limit(spec), "procs_per_node": spec.procs_per_node}
        self._end_predecessors(name, min(spec.train.checkpoint.grace_period_s + 15, PREDECESSOR_WAIT_CAP_S))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            group_dir.mkdir()
        except FileExistsError:
            raise ValueError(f"group {name!r} already exists in {self.state_dir}") from None
        group = self._group(name, spec, group_dir, threads)
        group["memory_limit"] = memory  # per node; the supervisor enforces it
        deadline = budget_deadline(spec, spent_usd)
        if deadline is not None:
            # The supervisor stops the group at the budget even with nobody watching (status: "at_budget").
            group["budget_deadline"] = {**deadline, "at": group["created_at"] + deadline["seconds"]}
        write_json_atomic(group_dir / "group.json", group)
        self._start_supervisor(name, group_dir)
        return self.status(name)

    def _group(self, name: str, spec: JobSpec, group_dir: Path, threads: int) -> dict[str, Any]:
        """``group.json``: what the supervisor runs (each node's command, environment and GPUs)."""
        config_path = group_dir / "train_config.json"
        config_path.write_text(json.dumps(spec.train.to_dict(), indent=1))
        num_nodes, gpus, port = spec.num_nodes, spec.resources.gpus_per_node, _free_port()
        commands = [
            node_command(
                name, spec,
                rdzv_endpoint=f"127.0.0.1:{port}",
                config_path=str(config_path),
                python=self.python,
                # all or nothing: node 0 hosts the rendezvous store, as pod 0 does on Kubernetes; an elastic
                # group's store is a process of its own (rdzv_store), which outlives any node's loss
                is_host=node == 0 and not spec.elastic,
                log_dir=str(group_dir / "torchelastic" / f"node{node}"),
            ).argv
            for node in range(num_nodes)
        ]  # fmt: skip
        # The group's processes are found by these two (a group name alone is not unique on a machine: two
        # state directories, e.g. two Airflow deployments or two test runs, can hold groups of the same name).
        env = {
            "DTRAIN_GROUP_NAME": name,
            GROUP_DIR_ENV: str(group_dir.resolve()),
            # each rank appends its events to <group dir>/events/rank-<RANK>.jsonl (trainer/events.py)
            EVENTS_DIR_ENV: str((group_dir / EVENTS_SUBDIR).resolve()),
            "OMP_NUM_THREADS": str(threads),
            **compile_cache_env(self.state_dir, spec.train.owner, spec.train.job),
            **agent_env(spec),
        }
        group = {
            "name": name,
            "backend": self.backend,
            "spec": spec.to_dict(),  # for people reading the directory; the supervisor needs the rest
            "node_commands": commands,
            "env": env,
            "rdzv_port": port,
            "peer_exit_grace_s": self.peer_exit_grace_s,
            "created_at": time.time(),
        }
        if spec.elastic:  # the supervisor goes on without a lost node and replaces it (_local_elastic)
            group["elastic"] = elastic_terms(spec)
            # a resize round awaits as many nodes as the capacity (trainer/elastic/rdzv_round.py): a
            # replacement
            # the supervisor starts at once joins the survivors' round
            env[CAPACITY_FILE_ENV] = str((group_dir / CAPACITY_FILE).resolve())
            group["rdzv_store"] = [
                self.python,
                "-m",
                "trainer.elastic.rdzv_store",
                "127.0.0.1",
                str(port),
            ]
        if gpus:
            # one GPU per process, consecutive ranges per node
            group["node_env"] = [
                {"CUDA_VISIBLE_DEVICES": ",".join(str(node * gpus + g) for g in range(gpus))}
                for node in range(num_nodes)
            ]
        return group

    def _start_supervisor(self, name: str, group_dir: Path) -> None:
        """Start the group's detached supervisor; wait (60 s at most) until it has written its pid."""
        with open(group_dir / "supervisor.log", "ab") as out:
            starter = subprocess.Popen(
                [self.python, "-m", "airflow_dtrain.launchers._local_supervisor", str(group_dir)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )
        starter.wait(timeout=60)
        deadline = time.monotonic() + 60
        while not (group_dir / "supervisor.json").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"group {name}: supervisor did not start; see {group_dir / 'supervisor.log'}"
                )
            time.sleep(0.05)

    def _end_predecessors(self, name: str, wait_s: float) -> None:
        """No process of an earlier group of this task may run beside ``name``: wait, then SIGKILL.

        An earlier group normally ends whole (its supervisor kills what is left before it writes
        result.json). One whose supervisor was killed leaves its agents and workers running on
        their own until the kernel's parent-death SIGTERM has them save and exit; this gives them
        ``wait_s`` (the spec's checkpoint grace period) to do so, then kills what is left, so two
        groups never write one checkpoint directory at once.
        """
        stem, sep, index = name.rpartition("-r")
        if not sep or not index.isdigit():
            return
        earlier = [g for g in self.find(stem + "-r") if g != name and g[len(stem) + 2 :].isdigit()]
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            alive = {g: procs for g in earlier if (procs := self.processes(g))}
            if not alive:
                if announced:
                    self.log.info("The earlier group's processes have exited; launching %s", name)
                return
            described = "; ".join(f"{g}: {len(p)} process(es) (pids {', '.join(str(x.pid) for x in p)})"
                                  for g, p in sorted(alive.items()))  # fmt: skip
            if time.monotonic() > deadline:
                self.log.warning("Processes of an earlier group are still running %.0fs later (%s): killing "
                                 "them (SIGKILL) before launching %s", wait_s, described, name)  # fmt: skip
                for group, procs in alive.items():
                    for proc in procs:
                        try:
                            proc.kill()
                        except psutil.NoSuchProcess:
                            pass
                    self._sweep(group)
                psutil.wait_procs([p for procs in alive.values() for p in procs], timeout=10)
                return
            if not announced:
                self.log.warning("Processes of an earlier group of this task are still running (%s): waiting "
                                 "up to %.0fs for them to save and exit before launching %s",
                                 described, wait_s, name)  # fmt: skip
                announced = True
            time.sleep(0.5)

    def move_deadline(self, name: str, deadline: dict[str, Any]) -> int | None:
        """Write the moved deadline where the group's supervisor looks for it every second
        (``budget_deadline.json`` beside ``group.json``)."""
        group_dir = self._dir(name)
        try:
            group = json.loads((group_dir / "group.json").read_text())
        except FileNotFoundError:
            return None
        current = _read_json(group_dir / "budget_deadline.json") or group.get("budget_deadline")
        if (
            current is None
            or (group_dir / "result.json").exists()
            or not deadline_moves(current["seconds"], deadline["seconds"])
        ):
            return None
        write_json_atomic(
            group_dir / "budget_deadline.json", {**deadline, "at": group["created_at"] + deadline["seconds"]}
        )
        return int(current["seconds"])

    def set_capacity(self, name: str, nodes: int) -> None:
        """The nodes group ``name`` may run from now on: the local stand-in for the spot market. Its
        supervisor starts a lost node's replacement only while fewer agents than this run (a running agent
        is never stopped for it); without a call, ``num_nodes``."""
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
            raise ValueError(f"nodes: a whole number of nodes, at least 0, got {nodes!r}")
        write_json_atomic(self._dir(name) / CAPACITY_FILE, {"nodes": nodes})

    def node_changes(self, name: str) -> list[tuple[float, int]]:
        """(wall-clock time, agents running from then on) of an elastic group, from its ``nodes.jsonl``;
        an all-or-nothing group: its launch with ``num_nodes``; [] for no such group."""
        group_dir = self._dir(name)
        changes = read_node_changes(group_dir)
        if changes:
            return changes
        group = _read_json(group_dir / "group.json")
        return [] if group is None else [(group["created_at"], len(group["node_commands"]))]

    def find(self, prefix: str) -> list[str]:
        if not self.state_dir.is_dir():
            return []
        found = [
            p for p in self.state_dir.iterdir() if p.name.startswith(prefix) and (p / "group.json").exists()
        ]
        return [
            p.name
            for p in sorted(found, key=lambda p: json.loads((p / "group.json").read_text())["created_at"])
        ]

    def status(self, name: str) -> GroupStatus:
        group_dir = self._dir(name)
        if not (group_dir / "group.json").exists():
            return GroupStatus(name, GroupState.NOT_FOUND, f"no group {name!r} in {self.state_dir}")
        result_path = group_dir / "result.json"
        if result_path.exists():
            result = json.loads(result_path.read_text())
            codes = {int(k): v for k, v in result.get("node_exit_codes", {}).items()}
            return GroupStatus(name, GroupState(result["state"]), result.get("message", ""), codes)
        supervisor = group_dir / "supervisor.json"
        if not supervisor.exists():
            return GroupStatus(name, GroupState.PENDING, "supervisor starting")
        if alive(json.loads(supervisor.read_text())):
            if not (group_dir / "nodes.json").exists():
                return GroupStatus(name, GroupState.PENDING, "starting nodes")
            return GroupStatus(name, GroupState.RUNNING, "")
        if result_path.exists():  # it finished between the two checks
            return self.status(name)
        return GroupStatus(name, GroupState.FAILED, "the group's supervisor died without a result (killed?)")

    def logs(self, name: str, cursor: Any = None) -> LogChunk:
        path = self._dir(name) / "group.log"
        offset = int(cursor or 0)
        if not path.exists():
            return LogChunk([], offset)
        with open(path, "rb") as log:
            log.seek(offset)
            data = log.read(_MAX_LOG_CHUNK)
        end = data.rfind(b"\n")
        if end < 0:
            return LogChunk([], offset)
        data = data[: end + 1]
        return LogChunk(data.decode("utf-8", "replace").splitlines(), offset + len(data))

    def events_dir(self, name: str) -> Path:
        """Where the ranks of group ``name`` append their events (``trainer/events.py``)."""
        return self._dir(name) / EVENTS_SUBDIR

    def events(self, name: str, cursor: dict[str, int] | None = None) -> tuple[list[dict[str, Any]], dict]:
        """The trainer's events of group ``name`` written since ``cursor`` (None: all), read from its events
        files, not scraped from ``group.log``; and the cursor for the next call (plain values)."""
        reader = EventCursor(self.events_dir(name), cursor)
        return reader.read(), reader.offsets

    def stop(self, name: str, grace_period_s: float = 30.0) -> GroupStatus:
        group_dir = self._dir(name)
        current = self.status(name)
        if current.state in (GroupState.PENDING, GroupState.RUNNING):
            write_json_atomic(group_dir / "stop_request.json", {"grace_period_s": grace_period_s})
            supervisor = group_dir / "supervisor.json"
            deadline = time.monotonic() + 60
            while not supervisor.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            record = json.loads(supervisor.read_text()) if supervisor.exists() else None
            if record and alive(record):
                os.kill(record["pid"], signal.SIGTERM)
            deadline = time.monotonic() + grace_period_s + 15
            while not (group_dir / "result.json").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        self._sweep(name)
        if not (group_dir / "result.json").exists() and (group_dir / "group.json").exists():
            write_json_atomic(
                group_dir / "result.json",
                {
                    "state": GroupState.STOPPED.value,
                    "message": "stopped on request (killed)",
                    "node_exit_codes": {},
                },
            )
        return self.status(name)

    def checkpoint_now(self, name: str) -> int:
        """SIGUSR1 to every worker of every node (``local_processes.signal_workers``)."""
        return signal_workers(self.processes(name))

    def _sweep(self, name: str) -> None:
        """Kill whatever is left of the group: the supervisor, its nodes and every tagged process."""
        sweep(self._dir(name), lambda: self.processes(name))

    def processes(self, name: str) -> list[psutil.Process]:
        """Live processes of group ``name`` of this state directory (for the launch's wait on an earlier
        group, the sweep, tests and troubleshooting): ``local_processes.group_processes``."""
        return group_processes(name, self._dir(name))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
