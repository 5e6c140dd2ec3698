"""kill -9 in the middle of a save: the previous checkpoint stays, the run resumes from it, and ends with
the same weights as the reference run. Split from test_checkpoint_durability.py (a fault trial)."""

import os
import signal
import subprocess
import tempfile
import time

import pytest
import torch

from trainer.testing.faults import activate as activate_faults

from checkpoint_reference import STEPS, reference  # noqa: F401 - reference: a fixture
from conftest import (
    FAST,
    REPO,
    load_checkpoint_tensors,
    read_json,
    run_trainer,
    trainer_cmd,
    trainer_env,
    worker_pids,
)


def _wait_until_gone(pids, timeout: float = 30) -> None:
    """The agent is reaped by us; its killed workers (orphans) are reaped by init a moment later."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while os.path.exists(f"/proc/{pid}") and "State:\tZ" not in _status(pid):
            assert time.monotonic() < deadline, f"worker {pid} still alive after SIGKILL"
            time.sleep(0.05)


def _status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return "State:\tZ"


# --------------------------------------------------------------------------- kill -9 during a save


def _kill_9_while_step_4_is_written(args: list[str], data_dir: str) -> None:
    """Train on 2 ranks until step 4's files are written (not yet committed), then kill -9 every process."""
    # The test hook holds rank 0 after the files of step 4 are written, before its manifest.
    env = activate_faults({**trainer_env(data_dir), "DTRAIN_TEST_COMMIT_DELAY": "4:300"})
    stderr = tempfile.NamedTemporaryFile(mode="w+", delete=False)
    proc = subprocess.Popen(
        trainer_cmd(args, 2),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while "test hook: step 4 files written" not in open(stderr.name).read():
            assert proc.poll() is None and time.monotonic() < deadline, open(stderr.name).read()[-3000:]
            time.sleep(0.2)
        # kill -9 the agent and both ranks (torchrun starts each worker in a session of its own)
        workers = worker_pids(proc.pid)
        assert sorted(workers) == [0, 1]
        for pid in [*workers.values(), proc.pid]:
            os.kill(pid, signal.SIGKILL)
        proc.wait()
        _wait_until_gone(workers.values())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.unlink(stderr.name)


@pytest.mark.torchrun
@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_kill_9_during_a_save_leaves_the_previous_checkpoint_and_the_run_resumes_from_it(
    reference, data_dir, tmp_path
):
    from trainer.checkpoint.directory import CheckpointDir

    ckpt = tmp_path / "ckpt"
    args = [
        *FAST,
        "--steps",
        str(STEPS),
        "--checkpoint-uri",
        str(ckpt),
        "--checkpoint-every",
        "2",
        "--set",
        "checkpoint.keep=2",
    ]
    _kill_9_while_step_4_is_written(args, data_dir)

    step4 = ckpt / "step-00000004"
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= {p.name for p in step4.iterdir()}  # written...
    assert not (step4 / "manifest.json").exists()  # ...never committed
    assert CheckpointDir(str(ckpt)).committed() == [(2, str(ckpt / "step-00000002"))]
    before = read_json(ckpt / "progress.json")
    assert before["status"] == "running" and before["step"] >= 4

    CheckpointDir(str(ckpt)).mark_best(2)  # e.g. by the evaluation task: retention must keep it
    resumed = run_trainer(args, data_dir, nproc=2)
    assert resumed.returncode == 0, resumed
    assert resumed.of("resume")[0]["from_step"] == 2
    assert min(resumed.losses()) == 3
    progress = read_json(ckpt / "progress.json")
    assert (progress["status"], progress["attempt"], progress["steps_lost"]) == (
        "completed",
        2,
        before["step"] - 2,
    )
    # keep=2 plus the best one; the interrupted step 4 was redone and then retired
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000002", "step-00000006", "step-00000008"]

    ours = load_checkpoint_tensors(ckpt / "step-00000008")
    theirs = load_checkpoint_tensors(reference / "step-00000008")
    weights = [k for k in theirs if k.startswith(("model.", "optim."))]
    assert len(weights) > 30
    for k in weights:
        assert torch.equal(ours[k], theirs[k]), k
