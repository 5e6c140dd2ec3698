"""One writer per checkpoint directory, with real trainer processes: a second group fences the
first off (exit 78, nothing committed after the newer lease), and a run refuses another job's
checkpoints. The lease's own races: tests/trainer/test_checkpoint_dir.py."""

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import FAST, REPO, run_trainer, trainer_cmd, trainer_env

from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import FENCED_EXIT_CODE
from trainer.testing.faults import activate as activate_faults


def _manifests(ckpt: Path) -> dict[int, dict]:
    return {
        int(p.parent.name.split("-")[1]): json.loads(p.read_text()) for p in ckpt.glob("step-*/manifest.json")
    }


@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_a_second_writer_fences_the_first_off_and_finishes(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [
        *FAST,
        "--steps",
        "8",
        "--checkpoint-uri",
        str(ckpt),
        "--checkpoint-every",
        "1",
        "--set",
        "checkpoint.keep=100",
        "--job",
        "llm",
    ]
    # A (2 ranks under torchrun): rank 0 is held after the files of step 3 are written, before its manifest
    # (until B has finished, at most 120 s: B starts, takes its lease and saves its own step 3 meanwhile).
    release = tmp_path / "release-a"
    env_a = activate_faults(
        {
            **trainer_env(data_dir),
            "DTRAIN_TEST_COMMIT_DELAY": f"3:120:{release}",
            "DTRAIN_GROUP_NAME": "group-a",
        }
    )
    stderr_a = tempfile.NamedTemporaryFile(mode="w+", delete=False)
    a = subprocess.Popen(
        trainer_cmd(args, 2),
        cwd=REPO,
        env=env_a,
        stdout=subprocess.DEVNULL,
        stderr=stderr_a,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while "test hook: step 3 files written" not in open(stderr_a.name).read():
            assert a.poll() is None and time.monotonic() < deadline, open(stderr_a.name).read()[-3000:]
            time.sleep(0.2)
        lease_a = CheckpointDir(str(ckpt)).newest_lease()
        assert lease_a.info["group"] == "group-a"

        # B: the same job on the same directory while A is still alive (e.g. a retry beside an orphan)
        b = run_trainer(args, data_dir, env={"DTRAIN_GROUP_NAME": "group-b"})
        release.touch()
        assert a.wait(timeout=120) == FENCED_EXIT_CODE, open(stderr_a.name).read()[-3000:]
        log_a = open(stderr_a.name).read()
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
        os.unlink(stderr_a.name)

    assert b.returncode == 0, b
    _assert_b_fenced_a_off(ckpt, b, lease_a, log_a)


def _assert_b_fenced_a_off(ckpt, b, lease_a, log_a: str) -> None:
    """B took the next lease and wrote steps 3 to 8; A was told so, exited fenced, and overwrote nothing."""
    lease_b = CheckpointDir(str(ckpt)).newest_lease()
    assert lease_b.token == lease_a.token + 1 and lease_b.info["group"] == "group-b"
    assert "another group took over the checkpoint directory" in log_a, log_a[-3000:]
    assert "group group-b" in log_a and f"exit {FENCED_EXIT_CODE}" in log_a, log_a[-3000:]

    manifests = _manifests(ckpt)
    assert sorted(manifests) == list(range(1, 9))  # A committed 1 and 2; B resumed from 2 and saved 3 to 8
    assert {s: m["lease"] for s, m in manifests.items()} == {
        s: lease_a.token if s <= 2 else lease_b.token for s in range(1, 9)
    }
    assert all(m["job"] == "llm" for m in manifests.values())
    # A's held commit of step 3 ran after B's lease and B's own step 3: it was refused, not written over B's
    acquired_b = lease_b.info["acquired_at"]
    assert all(m["created_at"] < acquired_b for m in manifests.values() if m["lease"] == lease_a.token)
    assert b.of("resume")[0]["from_step"] == 2
    assert max(b.losses()) == 8


def test_a_run_refuses_a_directory_holding_another_jobs_checkpoints(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    step = ckpt / "step-00000004"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(
        json.dumps({"step": 4, "job": "llama-a", "flavor": "debug", "files": {}})
    )

    run = run_trainer([*FAST, "--steps", "2", "--checkpoint-uri", str(ckpt), "--job", "llama-b"], data_dir)

    assert run.returncode == 2, run
    assert "'llama-b'" in run.stderr and "'llama-a'" in run.stderr and str(ckpt) in run.stderr, run.stderr[
        -2000:
    ]
    assert "checkpoint.continue_job='llama-a'" in run.stderr
    assert not (
        ckpt / "lease"
    ).exists()  # no lease taken: the other job's writer is not fenced off by a refusal
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000004"]
