"""What a load test throws at the runs while they train, on a seeded clock: SIGTERM to a random group's
torchrun agent (a spot reclaim of its node), and one restart of the scheduler; and what it measures
meanwhile: the peak memory of Airflow's processes and of the pod groups."""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from airflow_dtrain.launchers.local_processes import agents, group_processes
from trainer.elastic.workers import worker_pids

from .cluster import Cluster


def training_groups(groups: Path) -> dict[str, psutil.Process]:
    """{group name: its agent} of the groups under ``groups`` whose agent has a live rank (training, not
    starting or ending)."""
    found = {}
    # a group's name never starts with a dot: those are the launcher's own (its jobs' .compile-cache)
    for group in (
        sorted(p for p in groups.iterdir() if p.is_dir() and p.name[0] != ".") if groups.is_dir() else []
    ):
        for agent in agents(group_processes(group.name, group)):
            try:
                if worker_pids(agent.pid):
                    found[group.name] = agent
            except psutil.NoSuchProcess:
                continue
    return found


@dataclass
class Chaos:
    """Called every few seconds (``tick``): preempts one random training group every ``every_s`` until
    ``preemptions`` were sent, and restarts the scheduler once, ``restart_at_s`` after the start."""

    cluster: Cluster
    rng: random.Random
    preemptions: int
    restart_at_s: float
    every_s: float = 40.0
    started: float = field(default_factory=time.monotonic)
    sent: list[str] = field(default_factory=list)
    scheduler_restarted: bool = False
    next_at: float = 0.0

    def tick(self) -> None:
        now = time.monotonic() - self.started
        if not self.scheduler_restarted and now >= self.restart_at_s:
            rc = self.cluster.restart("scheduler")
            self.scheduler_restarted = True
            print(f"  [{now:5.0f}s] scheduler restarted (it exited {rc})", flush=True)
        if len(self.sent) < self.preemptions and now >= max(self.next_at, self.every_s / 2):
            training = training_groups(self.cluster.work / "groups")
            if not training:
                return
            name = self.rng.choice(sorted(training))
            try:
                training[name].send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                return
            self.sent.append(name)
            self.next_at = now + self.every_s
            print(f"  [{now:5.0f}s] SIGTERM to the agent of {name}", flush=True)


class MemorySampler:
    """Every ``interval`` s: the summed RSS of this Airflow home's processes, split into Airflow's
    (components, workers, supervisors of task runs) and the pod groups' (``DTRAIN_GROUP_NAME`` set);
    keeps the peaks."""

    def __init__(self, cluster: Cluster, interval: float = 2.0) -> None:
        self.cluster, self.interval = cluster, interval
        self.peak = {"airflow": 0, "groups": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> dict[str, int]:
        now = {"airflow": 0, "groups": 0}
        for proc in self.cluster.processes():
            try:
                kind = "groups" if "DTRAIN_GROUP_NAME" in proc.environ() else "airflow"
                now[kind] += proc.memory_info().rss
            except (psutil.Error, OSError):
                continue
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for kind, rss in self.sample().items():
                self.peak[kind] = max(self.peak[kind], rss)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.peak
