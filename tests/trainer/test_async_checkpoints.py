"""Async checkpoints on the torch this suite runs with (``make test-torch-min``: the lowest supported).

torch 2.11's DCP stager broke at the second async save of a run (``KeyError: <class 'type'>``),
killing the default config; the trainer now hands DCP only tensors and plain values and, on
such a torch, a fresh stager per save.
"""

from __future__ import annotations

import torch

from tests.trainer.conftest import FAST, run_trainer


def test_three_async_saves_in_one_run_and_a_bitwise_resume_from_the_last(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2", "--set", "checkpoint.async_save=true"]
    first = run_trainer([*args, "--steps", "7"], data_dir, nproc=2)
    assert first.returncode == 0, first
    saves = [(e["step"], e["reason"]) for e in first.of("checkpoint")]
    assert saves == [(2, "interval"), (4, "interval"), (6, "interval"), (7, "final")], (torch.__version__, first)
    assert all(e["blocked_s"] < e["seconds"] for e in first.of("checkpoint")[:3]), "the interval saves ran async"

    # Take away the final (synchronous) save: the next run must resume from the last async one
    # and continue exactly as the first run did (RNG, optimizer and data position all restored).
    (ckpt / "step-00000007" / "manifest.json").unlink()
    second = run_trainer([*args, "--steps", "7"], data_dir, nproc=2)
    assert second.returncode == 0, second
    [resume] = second.of("resume")
    assert resume["from_step"] == 6
    assert second.losses()[7] == first.losses()[7], f"torch {torch.__version__}: the resumed step 7 differs"
