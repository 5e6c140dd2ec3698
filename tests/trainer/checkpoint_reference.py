"""The reference checkpoint directory of the checkpoint durability tests: one 2-rank run, steps 2-8 kept.

A fixture of its own module so that test_checkpoint_durability.py and test_checkpoint_kill_9.py share its
code; each module that uses it runs it once (module scope), and the kill -9 test runs only with the fault
trials, so ``make test`` still runs it once.
"""

import pytest

from conftest import FAST, run_trainer

STEPS = 8


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """2 ranks, STEPS steps, async interval saves every 2 steps, all kept: steps 2, 4, 6, 8."""
    ckpt = tmp_path_factory.mktemp("reference")
    run = run_trainer(
        [
            *FAST,
            "--steps",
            str(STEPS),
            "--checkpoint-uri",
            str(ckpt),
            "--checkpoint-every",
            "2",
            "--set",
            "checkpoint.keep=4",
        ],
        data_dir,
        nproc=2,
    )
    assert run.returncode == 0, run
    assert [(e["step"], e["reason"]) for e in run.of("checkpoint")] == [
        (2, "interval"),
        (4, "interval"),
        (6, "interval"),
        (8, "final"),
    ]
    return ckpt
