"""The statsd tags of the orchestration side, and how the train task hands its own to the trainer."""

from __future__ import annotations

import types

import pytest

from airflow_dtrain import metrics
from airflow_dtrain.operators.fsdp_train import _with_statsd_defaults
from trainer.base.statsd import RUN_TAGS, format_tags, line, parse_line, parse_tags, tag_value


def test_a_line_round_trips_and_no_value_can_break_it():
    tags = {"dag_id": "d", "run_id": "manual__2026-05-01T09:30:00+00:00", "job": "a,b|c#d e"}
    text = line("dtrain.train.loss", 2.5, "g", tags)
    assert text == "dtrain.train.loss:2.5|g|#dag_id:d,run_id:manual__2026-05-01T09:30:00+00:00,job:a_b_c_d_e"
    assert parse_line(text) == ("dtrain.train.loss", 2.5, "g", {**tags, "job": "a_b_c_d_e"})
    assert tag_value("") == tag_value(None) == "none"  # statsd_exporter drops an empty tag: keep the key
    with pytest.raises(ValueError, match="statsd tag key 'run id'"):
        format_tags({"run id": "x"})


def test_orchestration_metrics_carry_the_task_instance_and_the_runs_job(statsd_listener):
    ti = types.SimpleNamespace(dag_id="train_llama", run_id="scheduled__2026-05-01T00:00:00+00:00",
                               task_id="budget", map_index=-1)  # fmt: skip
    context = {"ti": ti, "params": {"job": "llama-1b"}, "task": object()}
    metrics.gauge("budget.remaining_dollars", 12.5, tags=metrics.task_tags(context))
    metrics.incr("group.launches", tags={"run_id": "r"})  # what it is not told is "none", never missing
    metrics.timing("group.recovery_seconds", 2.0)  # outside a task: every tag "none"
    statsd_listener.wait_for("dtrain.group.recovery_seconds:2000.0|ms")
    got = {name: (value, kind, tags) for name, value, kind, tags in map(parse_line, statsd_listener.lines)}
    assert got["dtrain.budget.remaining_dollars"] == (12.5, "g", {
        "dag_id": "train_llama", "run_id": "scheduled__2026-05-01T00:00:00+00:00", "task_id": "budget",
        "map_index": "-1", "job": "llama-1b"})  # fmt: skip
    assert got["dtrain.group.launches"][2] == {**dict.fromkeys(RUN_TAGS, "none"), "run_id": "r"}
    assert got["dtrain.group.recovery_seconds"][2] == dict.fromkeys(RUN_TAGS, "none")


def test_the_train_task_tags_its_trainer_and_keeps_the_configs_own_tags(monkeypatch):
    monkeypatch.delenv("AIRFLOW__DTRAIN__STATSD_HOST", raising=False)
    ours = "dag_id:d,run_id:r,task_id:t,map_index:-1,job:demo"
    config = _with_statsd_defaults({"metrics": {"statsd_tags": "team:nlp,job:theirs"}, "steps": 5}, ours)
    assert parse_tags(config["metrics"]["statsd_tags"]) == {"team": "nlp", **parse_tags(ours)}
    flat = _with_statsd_defaults({"metrics.statsd_tags": "team:nlp"}, ours)
    assert "metrics.statsd_tags" not in flat and parse_tags(flat["metrics"]["statsd_tags"])["team"] == "nlp"
    assert _with_statsd_defaults({"steps": 5}, "") == {"steps": 5}  # no statsd, no tags: the config as given
