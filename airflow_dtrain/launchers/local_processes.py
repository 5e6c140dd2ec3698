"""The processes of a local group on this machine: found by the tags each of them carries, signalled, killed.

Every process of a group (its supervisor's children, their torchrun workers and what those start) carries
``DTRAIN_GROUP_NAME`` and ``GROUP_DIR_ENV`` in its environment: a group name alone is not unique on a machine
(two state directories, e.g. two Airflow deployments or two test runs, can hold groups of the same name).
``LocalLauncher`` finds, stops and asks its groups to checkpoint through these functions.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from airflow_dtrain.launchers._local_supervisor import kill_tree
from airflow_dtrain.launchers.torchrun import LAUNCH_MODULE
from trainer.elastic.workers import worker_pids

GROUP_DIR_ENV = "DTRAIN_LOCAL_GROUP_DIR"
"""Set on every process of a local group: its group directory, which (with DTRAIN_GROUP_NAME) tells it from a
group of the same name in another state directory."""


def alive(record: dict[str, Any]) -> bool:
    """Whether the process of a pid record (``{"pid", "create_time"}``) still runs (not its pid's reuse)."""
    try:
        proc = psutil.Process(record["pid"])
        return proc.create_time() == record["create_time"] and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_processes(name: str, group_dir: Path) -> list[psutil.Process]:
    """Live processes of group ``name`` in ``group_dir``: tagged with its name and its directory (a process
    without the directory's tag, started by an earlier version, is matched by its name)."""
    where, live = str(group_dir.resolve()), []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
            if (
                env.get("DTRAIN_GROUP_NAME") == name
                and env.get(GROUP_DIR_ENV, where) == where
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                live.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return live


def agents(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The torchrun agents (``python -m trainer.launch``) among a group's ``processes``."""
    found = []
    for proc in processes:
        try:
            if LAUNCH_MODULE in proc.cmdline():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def signal_workers(processes: list[psutil.Process], sig: int = signal.SIGUSR1) -> int:
    """``sig`` to every worker of every node (``workers``), whatever program they run, never the agents
    themselves (for which SIGUSR1 is fatal) nor what the workers start in turn (data loader workers would die
    of it). Returns how many workers were signalled."""
    asked = 0
    for worker in workers(processes):
        try:
            worker.send_signal(sig)
            asked += 1
        except psutil.NoSuchProcess:
            continue
    return asked


def workers(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The training processes of a group's nodes (``trainer.elastic.workers.worker_pids`` of each torchrun
    agent):
    never the agents, their fork servers, nor what the workers start in turn."""
    found = []
    for agent in agents(processes):
        for pid in worker_pids(agent.pid):
            try:
                found.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
    return found


def sweep(group_dir: Path, processes: Callable[[], list[psutil.Process]]) -> None:
    """Kill whatever is left of a group: its supervisor, its nodes, then every tagged process."""
    supervisor = group_dir / "supervisor.json"
    if supervisor.exists() and alive(record := json.loads(supervisor.read_text())):
        kill_tree(record["pid"])
    nodes = group_dir / "nodes.json"
    if nodes.exists():
        for record in json.loads(nodes.read_text()).values():
            if alive(record):
                kill_tree(record["pid"])
    for proc in processes():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
