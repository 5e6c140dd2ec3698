"""trainer/testing/faults.py, the faults a test or a benchmark injects through the DTRAIN_FAULTS seam: a slow
disk under an async save (``DTRAIN_TEST_SLOW_FSYNC``), on the real trainer under torchrun."""

import pytest

from tests.trainer.conftest import FAST, run_trainer
from trainer.testing.faults import SLOW_FSYNC_ENV, activate, slow_fsync


def test_a_slow_fsync_names_its_step_and_rank_and_refuses_what_it_cannot_read():
    assert slow_fsync("", 5, 0) is None
    assert slow_fsync("5:2.5", 5, 0) == 2.5 and slow_fsync("5:2.5", 5, 1) == 2.5  # every rank
    assert slow_fsync("5:2.5:1", 5, 1) == 2.5 and slow_fsync("5:2.5:1", 5, 0) is None
    assert slow_fsync("5:2.5", 10, 0) is None
    for bad in ("5", "five:2", "5:-1", "5:2:1:0", "5:x"):
        with pytest.raises(
            ValueError, match=f"{SLOW_FSYNC_ENV}: expected STEP:SECONDS\\[:RANK\\], got '{bad}'"
        ):
            slow_fsync(bad, 5, 0)


def test_training_goes_on_while_a_slow_disk_holds_an_async_save_and_the_save_commits_late(data_dir, tmp_path):
    """Rank 1's files of step 2 take 3 s more to sync: steps 3 and 4 train meanwhile (step 4's save waits
    for step 2's), step 2 commits after those 3 s, and the run finishes with every save committed."""
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2", "--steps", "6"]
    run = run_trainer(args, data_dir, nproc=2, env=activate({SLOW_FSYNC_ENV: "2:3:1"}))
    assert run.returncode == 0, run
    saves = {e["step"]: e for e in run.of("checkpoint")}
    assert sorted(saves) == [2, 4, 6], run
    assert saves[2]["async"] and saves[2]["seconds"] >= 3 and saves[2]["overlap_steps"] == 2, saves[2]
    assert saves[4]["waited_s"] > 0.5, saves[4]
    assert run.stderr.count(f"{SLOW_FSYNC_ENV}:") == 1 and "takes 3.0s more to sync" in run.stderr, run.stderr
    assert all((ckpt / f"step-{s:08d}" / "manifest.json").exists() for s in (2, 4, 6))
