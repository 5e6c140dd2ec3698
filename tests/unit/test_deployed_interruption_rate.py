"""[dtrain] interruption_rate_per_hour: the deployment's spot market, for train_llama's budget estimates."""

from __future__ import annotations

import importlib.util

import pytest

from airflow_dtrain.deployed import deployed_interruption_rate
from tests.conftest import REPO


def _train_llama():
    loader = importlib.util.spec_from_file_location("train_llama_rate", REPO / "dags" / "train_llama.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module.dag


def test_the_deployed_rate_reaches_the_budget_task(monkeypatch):
    monkeypatch.delenv("AIRFLOW__DTRAIN__INTERRUPTION_RATE_PER_HOUR", raising=False)
    assert deployed_interruption_rate() is None
    assert _train_llama().get_task("budget").interruption_rate_per_hour == 0.05  # the operator's default

    monkeypatch.setenv("AIRFLOW__DTRAIN__INTERRUPTION_RATE_PER_HOUR", " 1.5 ")
    assert deployed_interruption_rate() == 1.5
    budget = _train_llama().get_task("budget")
    assert budget.interruption_rate_per_hour == 1.5
    # a market property, not the run's: the trigger form does not offer it
    assert not any("rate_per_hour" in key for key in _train_llama().params)


@pytest.mark.parametrize("raw", ["-1", "often", "nan", "inf"])
def test_a_bad_rate_fails_the_parse_naming_the_option_and_the_value(monkeypatch, raw):
    monkeypatch.setenv("AIRFLOW__DTRAIN__INTERRUPTION_RATE_PER_HOUR", raw)
    with pytest.raises(ValueError, match=rf"\[dtrain\] interruption_rate_per_hour: .* got '{raw}'"):
        _train_llama()
