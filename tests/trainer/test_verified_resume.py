"""Resume verifies what it loads, falls back past a corrupted checkpoint, and refuses an incompatible one."""

from __future__ import annotations

from tests.trainer.conftest import FAST, read_json, run_trainer


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_the_newest_shard_makes_resume_fall_back_one_checkpoint(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2", "--set", "checkpoint.keep=3"]
    first = run_trainer([*args, "--steps", "6"], data_dir)
    assert first.returncode == 0, first
    shard = max((ckpt / "step-00000006").glob("__0_*.distcp"), key=lambda p: p.stat().st_size)
    _flip_a_byte(shard)

    second = run_trainer([*args, "--steps", "8"], data_dir)
    assert second.returncode == 0, second
    [resume] = second.of("resume")
    assert resume["from_step"] == 4, "the corrupted step 6 must be skipped for the verified step 4"
    assert "step-00000006" in second.stderr and "checksum" in second.stderr, second.stderr[-2000:]
    # from step 4 the same data and RNG state: steps 5 and 6 repeat the first run's exactly
    assert [second.losses()[s] for s in (5, 6)] == [first.losses()[s] for s in (5, 6)]
    assert read_json(ckpt / "progress.json")["step"] == 8


def test_resuming_with_a_different_seq_len_is_refused_naming_it(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2"]
    assert run_trainer([*args, "--steps", "4"], data_dir).returncode == 0
    other = run_trainer([*args, "--steps", "6", "--set", "data.seq_len=16"], data_dir)
    assert other.returncode == 2, other
    assert "data.seq_len is 16 here but 32 in the checkpoint" in other.stderr, other.stderr[-2000:]
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000002", "step-00000004"], (
        "nothing was lost"
    )

    # a safe change (the learning rate) is allowed, and said
    ok = run_trainer([*args, "--steps", "6", "--set", "optim.lr=0.001"], data_dir)
    assert ok.returncode == 0, ok
    assert "changed settings: optim.lr 0.003 -> 0.001" in ok.stderr


def test_a_step_that_failed_verification_is_rewritten_when_training_reaches_it_again(data_dir, tmp_path):
    """The corrupted step 6 is committed (it has a manifest); reaching step 6 again must save it anew,
    not take it for already saved and leave the run's final checkpoint corrupted."""
    from trainer.validate import validate_checkpoint

    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2", "--steps", "6"]
    assert run_trainer(args, data_dir).returncode == 0
    shard = max((ckpt / "step-00000006").glob("__0_*.distcp"), key=lambda p: p.stat().st_size)
    _flip_a_byte(shard)

    again = run_trainer(args, data_dir)
    assert again.returncode == 0, again
    assert again.of("resume")[0]["from_step"] == 4
    assert [c["step"] for c in again.of("checkpoint")] == [6]
    assert validate_checkpoint(str(ckpt / "step-00000006"), sample_tensors=None)["valid"]
