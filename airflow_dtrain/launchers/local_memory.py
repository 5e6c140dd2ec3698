"""The memory limit of each node of a local group: how much (``memory_limit``, on the launcher's side,
from the job's spec or the admin's option) and how this machine enforces it (``MemoryLimit``, in the group's
supervisor: a cgroup per node, else RLIMIT_DATA per process), and whether a node ran out of it.

One home for both sides, so what the launcher writes into ``group.json`` (``memory_limit``) and what the
supervisor reads back stay one contract. Standard library only; Airflow's config and the Kubernetes
backend's defaults are imported where they are read.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_dtrain.job.spec import JobSpec

MEMORY_OPTION = "local_memory_per_node"
"""``[dtrain] local_memory_per_node``: the memory limit of each node of a local group, unless its
``resources.memory`` sets one."""
DEFAULT_MEMORY_GI_PER_PROCESS = 4
"""Without either: what a CPU pod of the group gets on Kubernetes (``kubernetes/objects.py``), per process."""
OUT_OF_MEMORY = re.compile(
    r"(?<![A-Za-z])MemoryError|std::bad_alloc|[Cc]annot allocate memory|can't allocate memory"
)
"""What a process says when an allocation failed (under RLIMIT_DATA, malloc and mmap fail with ENOMEM):
Python's MemoryError, C++'s std::bad_alloc, torch's CPU allocator, an OSError of errno 12 (ENOMEM). Never a
GPU's (``torch.OutOfMemoryError: CUDA out of memory``): the limit is the host's."""

_QUANTITY_UNITS = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def quantity_bytes(value: str, where: str) -> int:
    """A Kubernetes memory quantity (``"64Gi"``, ``"1.5G"``, ``"512Mi"``, ``"1000000"``) in bytes, rounded
    down; ``ValueError`` naming ``where`` (the field or option it was read from) for anything else."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)", value.strip())
    if not match or match[2] not in _QUANTITY_UNITS or Fraction(match[1]) * _QUANTITY_UNITS[match[2]] < 1:
        raise ValueError(f"{where}: not a Kubernetes memory quantity such as '16Gi' or '512Mi', got "
                         f"{value!r}")  # fmt: skip
    return int(Fraction(match[1]) * _QUANTITY_UNITS[match[2]])


def memory_limit(spec: JobSpec) -> dict[str, Any]:
    """How much memory each node of a local group may use (``bytes``) and where the number comes from
    (``source``, for the message of a group that runs out of it): the job's ``resources.memory``, else the
    admin's ``[dtrain] local_memory_per_node`` (``AIRFLOW__DTRAIN__LOCAL_MEMORY_PER_NODE``), else the limit a
    pod of the group would get on Kubernetes: 32Gi per GPU, else 4Gi per process. The group's supervisor
    enforces it (``MemoryLimit``, below: a cgroup per node where the machine lets it make one, else
    RLIMIT_DATA per process, which counts differently: read there what it covers)."""
    if spec.resources.memory:
        field = "resources.memory"
        return {"bytes": quantity_bytes(spec.resources.memory, field), "source": field}
    option = f"[dtrain] {MEMORY_OPTION}"
    configured = _configured(MEMORY_OPTION)
    if configured:
        return {"bytes": quantity_bytes(configured, option), "source": option}
    from airflow_dtrain.kubernetes.container import DEFAULT_MEMORY_GI_PER_GPU

    gpus = spec.resources.gpus_per_node
    per, unit = (DEFAULT_MEMORY_GI_PER_GPU, "GPU") if gpus else (DEFAULT_MEMORY_GI_PER_PROCESS, "process")
    return {"bytes": per * (gpus or spec.procs_per_node) * 2**30,
            "source": f"the default, {per}Gi per {unit}; set resources.memory or {option}"}  # fmt: skip


def _configured(option: str) -> str:
    """``[dtrain] <option>`` of the Airflow deployment; "" when unset, or without Airflow (unit tests)."""
    try:
        from airflow.sdk import conf
    except ImportError:
        return ""
    return (conf.get("dtrain", option, fallback="") or "").strip()


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
    """Each node's memory limit (``group.json``'s ``memory_limit``, from ``memory_limit``) as this
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
      (MemoryError, std::bad_alloc, torch's "can't allocate memory": ``OUT_OF_MEMORY``) and exits. A process
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
            killed = {i: _read_counters(c / "memory.events").get("oom_kill", 0)
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


def _read_counters(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, _, v in (line.partition(" ") for line in path.read_text().splitlines())}
    except (OSError, ValueError):
        return {}
