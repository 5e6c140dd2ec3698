"""The elastic group's settings are fields of the job spec, with their bounds, operator arguments and help,
and reach every node's agent as the wiring its readers take: set where not the default, unset otherwise."""

from __future__ import annotations

import pytest

from airflow_dtrain.errors import SpecError
from airflow_dtrain.launchers.torchrun import agent_env
from airflow_dtrain.operators.train_arguments import SPEC_ARGUMENTS
from airflow_dtrain.job.spec import JobSpec
from trainer.elastic import rdzv_round, warm_join, worker_host
from trainer.elastic.workers import FORK_ENV

SETTINGS = ("keep_workers", "warm_before_join", "fork_workers", "resize_poll_s")
READ = (worker_host.KEEP_ENV, warm_join.WARM_ENV, FORK_ENV, rdzv_round.POLL_ENV)


def test_the_defaults_set_nothing_and_are_the_trainers_own():
    env = agent_env(JobSpec.from_arguments(num_nodes=2, min_nodes=1))
    assert not set(READ) & set(env), "a default reaches the agents as no variable at all"
    assert JobSpec().resize_poll_s == rdzv_round.RESIZE_POLL_S


def test_each_setting_reaches_the_agents_as_its_reader_takes_it(monkeypatch):
    spec = JobSpec.from_arguments(
        num_nodes=2, min_nodes=1, keep_workers="false", warm_before_join=False, fork_workers="False",
        resize_poll_s="1",  # rendered templates are strings
    )  # fmt: skip
    env = agent_env(spec)
    assert {name: env[name] for name in READ} == {
        worker_host.KEEP_ENV: "0", warm_join.WARM_ENV: "0", FORK_ENV: "0", rdzv_round.POLL_ENV: "1",
    }  # fmt: skip
    for name in READ:
        monkeypatch.setenv(name, env[name])
    assert not warm_join.enabled()
    assert rdzv_round._poll_s(env[rdzv_round.POLL_ENV]) == 1.0


def test_each_setting_is_an_operator_argument_with_its_help():
    documented = {a.name: a.help for a in SPEC_ARGUMENTS}
    for name in SETTINGS:
        assert len(documented[name]) > 40, name


@pytest.mark.parametrize(
    ("argument", "value"),
    [("resize_poll_s", 0), ("resize_poll_s", 0.001), ("resize_poll_s", 60), ("keep_workers", "sometimes")],
)
def test_a_bad_setting_is_refused_naming_it_and_its_value(argument, value):
    with pytest.raises(SpecError, match=rf"{argument}.*{value}"):
        JobSpec.from_arguments(num_nodes=2, min_nodes=1, **{argument: value})
