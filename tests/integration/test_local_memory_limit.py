"""A local group runs under a memory limit per node: one that asks for too much fails, saying which limit it
ran out of and where that came from, while the Airflow worker that launched it goes on and trains the next
group; a tiny group trains under the default limit."""

from __future__ import annotations

import re
from pathlib import Path

import psutil
import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.launchers.base import GroupState
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.launchers.local_memory import memory_limit, quantity_bytes
from airflow_dtrain.launchers.local_processes import workers
from airflow_dtrain.session.group import GroupFailed
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import RecordingTI
from tests.integration.helpers import SMALL, progress, wait_for, wait_terminal

pytestmark = pytest.mark.torchrun

HOG = '''"""Takes 64 MiB at a time up to argv[1] MiB, saying how far it got; exits 0 if it gets there."""
import sys

chunks = []
while len(chunks) * 64 < int(sys.argv[1]):
    chunks.append(bytearray(64 << 20))  # zero-filled: resident, not only reserved
    print(f"holding {len(chunks) * 64} MiB", flush=True)
'''
LIMIT_LINE = re.compile(r"\[supervisor\] memory limit of each node: (.*)")


def _operator(tmp_path: Path, **arguments) -> FSDPTrainOperator:
    return FSDPTrainOperator(**{
        "task_id": "train", "num_nodes": 1, "procs_per_node": 1, "checkpoint_uri": str(tmp_path / "ckpt"),
        "local_state_dir": str(tmp_path / "groups"), "poll_interval": 0.5, "deferrable": False, **arguments,
    })  # fmt: skip


def test_a_group_past_its_memory_limit_fails_naming_the_limit_and_the_worker_trains_the_next(tmp_path):
    hog = tmp_path / "hog.py"
    hog.write_text(HOG)
    # Unlimited, it would hold 2 GiB and exit 0; its node may use 1 GiB.
    hogs = _operator(tmp_path, entrypoint=[str(hog), "2048"], job="hog", steps=1,
                     node_resources={"memory": "1Gi"})  # fmt: skip

    said = r"node 0 ran out of its memory limit of 1\.0 GiB \(resources\.memory\)"
    with pytest.raises(GroupFailed, match=said):
        hogs.execute({"ti": RecordingTI(run_id="hog")})

    launcher = LocalLauncher(tmp_path / "groups")
    [group] = launcher.find("")  # failed, not relaunched: it would run out again
    status = launcher.status(group)
    assert status.state == GroupState.FAILED, status
    log = (tmp_path / "groups" / group / "group.log").read_text()
    held = [int(m) for m in re.findall(r"holding (\d+) MiB", log)]
    assert held and max(held) <= 1024, held  # it never held more than its limit
    assert launcher.processes(group) == []

    # The worker (this process) goes on: its next task trains.
    after = _operator(tmp_path, **SMALL, job="after", steps=2, checkpoint_uri=str(tmp_path / "after"))
    summary = after.execute({"ti": RecordingTI(run_id="after")})
    assert summary["final_step"] == 2 and progress(tmp_path / "after")["status"] == "completed"


def test_a_tiny_group_trains_under_the_default_limit_which_its_processes_run_under(tmp_path):
    spec = JobSpec.from_arguments(**SMALL, steps=4, num_nodes=1, procs_per_node=2,
                                  checkpoint_uri=str(tmp_path / "ckpt"))  # fmt: skip
    assert memory_limit(spec) == {
        "bytes": 8 * 2**30,
        "source": "the default, 4Gi per process; set resources.memory or [dtrain] local_memory_per_node",
    }
    launcher = LocalLauncher(tmp_path / "groups")
    launcher.launch("tiny-r0", spec)
    log = tmp_path / "groups" / "tiny-r0" / "group.log"
    words = wait_for(lambda: log.exists() and LIMIT_LINE.search(log.read_text()), 60, "the limit's line")[1]

    def workers_limits() -> list[int]:
        limits = []
        for proc in workers(launcher.processes("tiny-r0")):  # the two workers, not their agent
            try:
                limits.append(_limit(proc, cgroup="cgroup" in words))
            except psutil.NoSuchProcess:
                continue
        return limits if len(limits) == 2 else []

    # RLIMIT_DATA: the node's 8 GiB shared out, 4 GiB each; a cgroup: the node's 8 GiB for both together
    expected = 4 * 2**30 if "RLIMIT_DATA" in words else 8 * 2**30
    assert wait_for(workers_limits, 60, "both workers", interval=0.05) == [expected, expected], words
    status = wait_terminal(launcher, "tiny-r0")
    assert status.state == GroupState.SUCCEEDED, (status, log.read_text()[-3000:])
    assert progress(tmp_path / "ckpt")["status"] == "completed"


def _limit(proc: psutil.Process, cgroup: bool) -> int:
    """The memory limit ``proc`` runs under: its RLIMIT_DATA, or its cgroup's memory.max."""
    if not cgroup:
        return proc.rlimit(psutil.RLIMIT_DATA)[0]
    path = Path(f"/proc/{proc.pid}/cgroup").read_text().split("0::", 1)[1].split()[0]
    return int(Path("/sys/fs/cgroup", path.lstrip("/"), "memory.max").read_text())


def test_the_limit_comes_from_resources_memory_then_the_admin_option_then_the_default(monkeypatch):
    def limit(**arguments):
        return memory_limit(JobSpec.from_arguments(checkpoint_uri="/tmp/ckpt", **arguments))

    monkeypatch.setenv("AIRFLOW__DTRAIN__LOCAL_MEMORY_PER_NODE", "1536Mi")
    assert limit(resources={"memory": "3G"}) == {"bytes": 3 * 10**9, "source": "resources.memory"}
    assert limit() == {"bytes": 1536 * 2**20, "source": "[dtrain] local_memory_per_node"}
    monkeypatch.setenv("AIRFLOW__DTRAIN__LOCAL_MEMORY_PER_NODE", "lots")
    with pytest.raises(
        ValueError, match=r"^\[dtrain\] local_memory_per_node: not a Kubernetes .*, got 'lots'$"
    ):
        limit()
    monkeypatch.delenv("AIRFLOW__DTRAIN__LOCAL_MEMORY_PER_NODE")
    assert limit(resources={"gpus_per_node": 2}, procs_per_node=2)["bytes"] == 64 * 2**30
    sizes = [quantity_bytes(q, "q") for q in ("1.5Gi", "512Mi", "2k", "1000", "1500m")]
    assert sizes == [3 * 2**29, 2**29, 2000, 1000, 1]
    with pytest.raises(ValueError, match="q: not a Kubernetes memory quantity"):
        quantity_bytes("5ki", "q")
