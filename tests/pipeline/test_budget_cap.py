"""The dollar budget as a cap, through train_llama (real Airflow, dag.test(), real torchrun
processes): a job admitted on a far too optimistic estimate stops at its cap, and a job that
waited is continued by its next run with its spend ledger intact."""

from __future__ import annotations

import json
import uuid

import pytest
from airflow.utils.state import DagRunState, TaskInstanceState

from trainer.checkpoint.directory import CheckpointDir

pytestmark = pytest.mark.torchrun


def _states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def _cap_conf(job: str, ckpt, tmp_path, budget: float) -> dict:
    """A 2-node spot run of ``job`` at $3.60/node-h whose step-time estimate is 100x and more too small."""
    return {
        "job": job,
        "checkpoint_uri": str(ckpt),
        "registry_uri": str(tmp_path / "r"),
        "steps": 5000,
        "checkpoint_every": 20,
        "simulate_preemption_at_step": 0,
        "seq_len": 32,
        # a step takes ~0.35-0.6 s here (slow_steps): the budget task's estimate is 100x and more too
        # small, so it admits a job that would cost $2-3 at $7.20/h (2 nodes x $3.60), 4x its budget and
        # more. The budget buys 240 billed seconds, of which the trainer holds back ~175 for its last
        # save and exit (cost.stop_margin_s, 30 s) before the platform's budget deadline, which keeps
        # back the 110 s grace period and 30 s more.
        "step_time_estimate_s": 0.0005,
        "local_spot_price": 3.6,
        "local_on_demand_price": 7.2,
        "max_price": 10.0,
        "budget_usd": budget,
    }


def _assert_stopped_at_the_cap(ckpt, budget: float) -> float:
    """The group stopped at the cap, not past it and not early, with its last step committed: its spend."""
    summary = json.loads((ckpt / "summary.json").read_text())
    assert summary["stopped"] == "budget", summary
    assert 0 < summary["final_step"] < 5000
    stop = summary["budget_stop"]
    assert stop["projected_usd"] > budget >= stop["spent_usd"], stop
    # Every billed second, from the group's launch to the moment its end was seen, stays under the cap...
    spend = CheckpointDir(str(ckpt)).spend()
    assert len(spend.attempts) == 1 and all(e["ended"] for e in spend.attempts.values())
    assert spend.total_dollars <= budget, spend
    # ...and the money left unspent is no more than what the guard held back for its last step, save and
    # exit (it did not stop early): the spend it saw plus that reserve passed the cap.
    reserve = stop["usd_per_hour"] / 3600 * stop["seconds_ahead"]
    assert spend.total_dollars >= stop["spent_usd"] > budget - reserve, (spend, stop)
    assert summary["dollars"] == pytest.approx(spend.total_dollars)
    # ...and the step it stopped at is committed: nothing trained is lost.
    assert CheckpointDir(str(ckpt)).latest().step == summary["final_step"]
    return spend.total_dollars


def test_a_step_time_estimate_100x_too_small_stops_at_the_cap_not_past_it(dags, tmp_path, slow_steps):
    ckpt = tmp_path / "ckpt"
    budget = 0.48
    run = dags["train_llama"].test(run_conf=_cap_conf(f"cap-{uuid.uuid4().hex[:8]}", ckpt, tmp_path, budget))
    states = _states(run)
    assert run.state == DagRunState.SUCCESS, states
    decision = run.get_task_instance("budget").xcom_pull(task_ids="budget", key="decision")
    assert decision["choice"] == "spot", decision  # admitted on the estimate
    assert states["train_spot"] == TaskInstanceState.SUCCESS
    # the last checkpoint is usable
    assert states["validate"] == states["evaluate"] == TaskInstanceState.SUCCESS
    spent = _assert_stopped_at_the_cap(ckpt, budget)

    # The next run of the same job sees the money gone and does not train.
    again = dags["train_llama"].test(run_conf=_cap_conf(run.conf["job"], ckpt, tmp_path, budget))
    states = _states(again)
    assert (
        states["stop"] == TaskInstanceState.SUCCESS and states["train_spot"] == TaskInstanceState.SKIPPED
    ), states
    assert CheckpointDir(str(ckpt)).spend().total_dollars == pytest.approx(spent)


def test_a_job_that_waited_is_continued_by_its_next_run_with_its_ledger(dags, tmp_path):
    job = f"wait-{uuid.uuid4().hex[:8]}"
    # (every run names its prices; each run starts from the DAG's declared params, tests/pipeline/conftest.py;
    # 32-token sequences: a quarter of the default step, enough for what is checked here)
    common = {
        "job": job,
        "registry_uri": str(tmp_path / "r"),
        "simulate_preemption_at_step": 0,
        "checkpoint_every": 5,
        "local_spot_price": 0.5,
        "max_price": 1.0,
        "num_nodes": 1,
        "seq_len": 32,
    }

    first = dags["train_llama"].test(run_conf={**common, "steps": 10})
    assert first.state == DagRunState.SUCCESS, _states(first)
    uri = first.get_task_instance("train_spot").xcom_pull(task_ids="train_spot")["latest_checkpoint"]
    ckpt, _ = CheckpointDir.split(uri)
    assert ckpt.root.endswith(f"/{job}"), "the default checkpoint directory is the job's, not the run's"
    spent_first = ckpt.spend().total_dollars
    assert spent_first > 0 and ckpt.latest().step == 10

    # The job asks for more steps, but spot is above the max price: this run waits and trains nothing.
    waited = dags["train_llama"].test(
        run_conf={**common, "steps": 20, "local_spot_price": 2.0, "max_price": 1.0}
    )
    states = _states(waited)
    assert (
        states["wait"] == TaskInstanceState.SUCCESS and states["train_spot"] == TaskInstanceState.SKIPPED
    ), states
    assert ckpt.spend().total_dollars == pytest.approx(spent_first) and ckpt.latest().step == 10

    # The next run finds the price acceptable: it continues the job from step 10, on the same ledger.
    second = dags["train_llama"].test(run_conf={**common, "steps": 20})
    assert second.state == DagRunState.SUCCESS, _states(second)
    decision = second.get_task_instance("budget").xcom_pull(task_ids="budget", key="decision")
    assert decision["ledger"]["step"] == 10 and decision["ledger"]["total_dollars"] == pytest.approx(
        spent_first
    )
    assert decision["choice"] == "spot", decision
    summary = second.get_task_instance("train_spot").xcom_pull(task_ids="train_spot")
    assert summary is not None, _states(second)
    progress = ckpt.progress()
    assert (summary["final_step"], progress["resumed_from_step"]) == (20, 10)
    spend = ckpt.spend()
    assert len(spend.attempts) == 2, spend.attempts  # one group per training run, both on the job's ledger
    assert spend.total_dollars > spent_first and summary["dollars"] == pytest.approx(spend.total_dollars)
