"""trainer.parallelize: the learning-rate schedule a user sees in the "lr" of train events."""

import pytest

from trainer.config import OptimConfig
from trainer.parallelize import lr_lambda


def test_linear_warmup_then_cosine_to_min_lr_on_the_last_step():
    f = lr_lambda(OptimConfig(warmup_steps=10, min_lr_ratio=0.1), total_steps=50)
    assert [f(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(9) == pytest.approx(1.0)  # peak at the end of warmup
    assert f(10) == pytest.approx(1.0)
    assert f(49) == pytest.approx(0.1)  # the last step (0-based 49) runs at lr * min_lr_ratio
    values = [f(s) for s in range(10, 50)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay
    assert f(29) == pytest.approx(0.1 + 0.9 * 0.5, abs=0.03)  # half-way down the cosine


def test_no_warmup_and_warmup_longer_than_the_run():
    assert lr_lambda(OptimConfig(warmup_steps=0), total_steps=10)(0) == pytest.approx(1.0)
    long = lr_lambda(OptimConfig(warmup_steps=100), total_steps=10)
    assert long(9) == pytest.approx(0.1)  # never reaches the peak
