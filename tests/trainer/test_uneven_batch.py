"""An elastic group at a size that does not divide its global batch (#39): 3 processes share a batch of 8
sequences unevenly (2, 3, 3; micro-batches of 2, the short rank adds a zero-weight micro-step) and train the
same sequences at every step, with the same losses as 2 processes sharing it evenly, within the tolerance of a
resize (docs/checkpoints.md#elastic-groups: the sums are added in another order)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from conftest import FAST_DEFAULTS, run_trainer

STEPS = 4
ARGS = [*FAST_DEFAULTS, "--set", f"steps={STEPS}", "--set", "micro_batch_size=2"]
TOLERANCE = 1e-4  # relative, as across a resize


def _samples(run) -> dict[int, list[int]]:
    steps: dict[int, list[int]] = defaultdict(list)
    for event in run.of("samples"):
        steps[event["step"]] += event["samples"]
    return {step: sorted(s) for step, s in steps.items()}


@pytest.mark.torchrun
def test_three_ranks_share_a_batch_of_eight_unevenly_and_train_what_two_ranks_train(data_dir):
    env = {"DTRAIN_TRACE_SAMPLES": "1"}
    even = run_trainer(ARGS, data_dir, nproc=2, env=env)
    uneven = run_trainer([*ARGS, "--set", "parallel.uneven_batch=true"], data_dir, nproc=3, env=env)
    assert even.returncode == 0 and uneven.returncode == 0, (even, uneven)
    shares = sorted(len(e["samples"]) for e in uneven.of("samples") if e["step"] == 1)
    assert shares == [2, 3, 3]  # every sequence once: no rank repeats or skips one
    assert _samples(uneven) == _samples(even) and sorted(_samples(even)) == list(range(1, STEPS + 1))
    assert all(len(s) == 8 and len(set(s)) == 8 for s in _samples(uneven).values())
    got, want = uneven.losses(), even.losses()
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=TOLERANCE), (step, got, want)


@pytest.mark.torchrun
def test_without_uneven_batch_three_ranks_are_refused_before_training(data_dir):
    run = run_trainer(ARGS, data_dir, nproc=3)
    assert run.returncode != 0
    assert "global_batch_size 8 is not divisible by world size 3 × micro_batch_size 2" in run.stderr
