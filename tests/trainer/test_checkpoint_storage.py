"""A checkpoint the storage refuses (a full disk) stops the run clearly: exit 74, one line naming the
path and the cause, the partial step directory removed, the older checkpoints intact and resumable.

Two ways to fill the disk: the test hook (DTRAIN_TEST_ENOSPC_AT_STEP through trainer/testing/faults.py, a
writer that fails with ENOSPC part-way through a shard) and, where this process may mount one, a real tmpfs
too small for the next checkpoint."""

import shutil
import subprocess

import pytest
from conftest import FAST, run_trainer

from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import STORAGE_EXIT_CODE
from trainer.testing.faults import activate as activate_faults
from trainer.validate import validate_checkpoint


def _committed(ckpt) -> list[int]:
    return [c.step for c in CheckpointDir(str(ckpt)).committed()]


@pytest.mark.parametrize(
    "nproc,at,every,steps",
    [pytest.param(2, "6:1", 2, 8, marks=pytest.mark.fault_trial), (None, "4", 2, 4)],
    ids=["async-interval-save-rank1", "final-save-one-process"],
)
def test_a_full_disk_exits_74_naming_the_path_and_the_older_checkpoints_resume(
    data_dir, tmp_path, nproc, at, every, steps
):
    ckpt = tmp_path / "ckpt"
    args = [
        *FAST,
        "--steps",
        str(steps),
        "--checkpoint-uri",
        str(ckpt),
        "--checkpoint-every",
        str(every),
        "--set",
        "checkpoint.keep=10",
    ]
    failed_step = int(at.split(":")[0])

    run = run_trainer(args, data_dir, nproc=nproc, env=activate_faults({"DTRAIN_TEST_ENOSPC_AT_STEP": at}))

    assert run.returncode == STORAGE_EXIT_CODE, run
    step_dir = ckpt / f"step-{failed_step:08d}"
    older = list(range(every, failed_step, every))
    line = f"checkpoint step {failed_step} could not be written to {step_dir}"
    assert line in run.stderr and "[Errno 28] No space left on device" in run.stderr, run.stderr[-3000:]
    assert f"the older checkpoints (step {', '.join(map(str, older))}) are intact" in run.stderr
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    if nproc:
        assert f"[trainer.launch] exit {STORAGE_EXIT_CODE}" in run.stderr
    assert not step_dir.exists(), "the partial step directory is removed"
    assert _committed(ckpt) == older
    for step in older:
        assert validate_checkpoint(str(ckpt / f"step-{step:08d}"))["valid"]

    # the disk has room again: the same command resumes from the last committed checkpoint and finishes
    again = run_trainer(args, data_dir, nproc=nproc)
    assert again.returncode == 0, again
    assert again.of("resume")[0]["from_step"] == older[-1]
    assert max(again.losses()) == steps
    assert _committed(ckpt)[-1] == steps


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real filesystem with room for two debug checkpoints (39 MB each) and not a third."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_a_real_full_tmpfs_exits_74_and_resumes_once_it_has_room(data_dir, small_tmpfs):
    ckpt = small_tmpfs / "ckpt"
    args = [
        *FAST,
        "--steps",
        "8",
        "--checkpoint-uri",
        str(ckpt),
        "--checkpoint-every",
        "2",
        "--set",
        "checkpoint.keep=10",
    ]

    run = run_trainer(args, data_dir, nproc=2)

    assert run.returncode == STORAGE_EXIT_CODE, run
    committed = _committed(ckpt)
    assert committed == [2, 4], committed  # 2 x 39 MB fit in 100 MB, the third did not
    assert f"checkpoint step 6 could not be written to {ckpt / 'step-00000006'}" in run.stderr, run.stderr[
        -3000:
    ]
    assert "No space left on device" in run.stderr
    assert "the older checkpoints (step 2, 4) are intact" in run.stderr
    assert not (ckpt / "step-00000006").exists()
    for step in committed:
        assert validate_checkpoint(str(ckpt / f"step-{step:08d}"))["valid"]

    subprocess.run(["mount", "-o", "remount,size=400m", str(small_tmpfs)], check=True)  # space freed
    again = run_trainer(args, data_dir, nproc=2)
    assert again.returncode == 0, again
    assert again.of("resume")[0]["from_step"] == 4
    assert _committed(ckpt)[-1] == 8
