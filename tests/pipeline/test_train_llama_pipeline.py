"""The train_llama pipeline end to end through a real Airflow (dag.test(), sqlite), real torchrun
processes, and a real UDP statsd listener."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from airflow.exceptions import ParamValidationError
from airflow.utils.state import DagRunState, TaskInstanceState

from airflow_dtrain import metrics as orchestration
from airflow_dtrain.trust.ownership import job_key, owner_for
from tests.statsd_listener import StatsdListener
from trainer.checkpoint.directory import CheckpointDir
from trainer.base.statsd import parse_line

pytestmark = pytest.mark.torchrun


def _states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


STATUS = re.compile(
    r"^(\S+Z) .*status: step (\d+)/60 · "
    r"(?:[\d.]+ s/step · [\d.]+k? tok/s · ETA \w+|s/step – · tok/s – · ETA –) · "
    r"\$[\d.]+ of \$5\.00 · (?:last ckpt step \d+ \(\w+ ago\)|no checkpoint yet)"
)


def _a_best_model_on_another_evaluation_set(registry: Path) -> tuple[Path, str]:
    """The job's best model on another evaluation set (other data): a lower loss measured here must not
    replace it. Returns the set's directory and its best.json text."""
    # dag.test() runs are triggered by "dag_test": the job's entry lies in that user's part of the registry
    entry = registry / job_key(owner_for("dag_test", "train_llama"), "train-llama", "train_llama")
    other_set = entry / "eval-0123456789ab"
    other_set.mkdir(parents=True)
    (entry / "owner.json").write_text(
        json.dumps({"owner": "user:dag_test", "job": "train-llama", "kind": "registry"})
    )
    other_best = json.dumps({"loss": 5.0, "step": 1000, "export": str(other_set / "run" / "step-00001000")})
    (other_set / "best.json").write_text(other_best)
    return other_set, other_best


def _assert_status_lines(out: str) -> None:
    """The task log's one-line status: at least two, every field, no more than 30 s apart."""
    # The task log says where the job stands in one line, with every field, at least every 30 s.
    status = [m for m in map(STATUS.match, out.splitlines()) if m]
    assert len(status) >= 2, [line for line in out.splitlines() if "status:" in line]
    times = [datetime.fromisoformat(m.group(1).replace("Z", "+00:00")) for m in status]
    assert max((b - a).total_seconds() for a, b in zip(times, times[1:])) <= 30
    assert any(" s/step · " in m.group(0) and "last ckpt step" in m.group(0) for m in status)


def _assert_the_promoted_model_and_its_reports(ckpt: Path, registry: Path, other_set: Path, other_best: str):
    """The registry's best for this evaluation set, the reports and the curves; returns the best entry."""
    # the job's entry on this run's evaluation set; the other set's best is untouched though its loss is
    # higher
    (best_file,) = [p for p in registry.glob("**/eval-*/best.json") if p.parent != other_set]
    best = json.loads(best_file.read_text())
    assert best["step"] == 60 and best["loss"] < 3.0
    assert (other_set / "best.json").read_text() == other_best
    assert (ckpt / "report.png").stat().st_size > 10_000
    # beside it, the HTML report: the image and the run's summary, the preemption counted
    report = (ckpt / "report.html").read_text()
    assert '<img src="report.png"' in report and "<th>preemptions</th><td>1</td>" in report
    assert "<th>step</th><td>60 of 60</td>" in report and " of $5.00</td>" in report
    assert "<th>time the saves took from training</th><td>" in report and " % of it)</td>" in report
    evaluation = json.loads((ckpt / "evals" / "latest.json").read_text())
    train_steps = [point[0] for point in evaluation["train_curve"]]
    # the whole run's loss curve, across the preemption, each step once
    assert train_steps == list(range(1, 61)), train_steps
    assert [point[0] for point in evaluation["eval_curve"]][-1] == 60
    assert (Path(best["checkpoint"]) / "BEST").is_file()
    return best


def _assert_the_metrics(listener, run) -> None:
    """Every gauge the run should send arrived, and every line carries the run's tags."""
    seen = listener.names()
    # (train.mfu and the gpu.* gauges need a GPU with a known peak: absent on this CPU run)
    for name in ("train.loss", "train.tokens_per_s", "train.grad_norm", "checkpoint.seconds",
                 "cost.dollars", "cost.budget_dollars", "spot.price_dollars_per_hour", "budget.decision.spot",
                 "group.launches", "group.preemptions", "group.recovery_seconds", "eval.loss",
                 "checkpoint.promotions"):  # fmt: skip
        assert f"dtrain.{name}" in seen, f"dtrain.{name} never arrived; got {sorted(seen)}"
    # every line, the trainer's and every task's, says which run and job it belongs to
    for line in listener.lines:
        name, _, _, tags = parse_line(line)
        assert (tags["dag_id"], tags["run_id"], tags["job"]) == ("train_llama", run.run_id, "train-llama"), (
            line
        )


def test_default_run_trains_through_a_preemption_promotes_and_reports_metrics(
    dags, tmp_path, monkeypatch, capfd
):
    listener = StatsdListener()
    monkeypatch.setenv("AIRFLOW__DTRAIN__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__DTRAIN__STATSD_PORT", str(listener.port))
    orchestration.reset()
    ckpt, registry = tmp_path / "ckpt", tmp_path / "registry"
    other_set, other_best = _a_best_model_on_another_evaluation_set(registry)
    try:
        # the defaults, but our own directories (the default ones are shared by the session)
        run = dags["train_llama"].test(run_conf={"checkpoint_uri": str(ckpt), "registry_uri": str(registry)})
    finally:
        listener.close()
        orchestration.reset()

    states = _states(run)
    assert run.state == DagRunState.SUCCESS, states
    assert states["train_spot"] == TaskInstanceState.SUCCESS
    _assert_status_lines(capfd.readouterr().out)
    assert states["train_on_demand"] == TaskInstanceState.SKIPPED
    assert states["wait"] == states["stop"] == TaskInstanceState.SKIPPED
    assert states["spot_watch"] == TaskInstanceState.SKIPPED  # local backend: no instances to watch
    assert states["validate"] == states["evaluate"] == TaskInstanceState.SUCCESS

    summary = json.loads((ckpt / "summary.json").read_text())
    assert summary["final_step"] == 60
    assert summary["preemptions"] == 1 and summary["steps_lost"] == 0
    assert summary["startup_s"] > 0, "what the two attempts spent before their first steps"
    import torch

    # the torch it trained on; no private-hook fallback in force on a tested torch (trainer/torch_private/)
    assert summary["torch"]["version"] == torch.__version__.split("+")[0]
    assert summary["torch"]["fallbacks_in_force"] == {}, summary["torch"]
    assert summary["dollars"] > 0, "the local price is charged to the ledger"
    best = _assert_the_promoted_model_and_its_reports(ckpt, registry, other_set, other_best)

    # the promoted checkpoint loads, as a user would load it
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(best["export"])
    assert sum(p.numel() for p in model.parameters()) > 1_000_000
    _assert_the_metrics(listener, run)


def test_budget_too_small_ends_in_the_stop_branch_without_training(dags, tmp_path):
    run = dags["train_llama"].test(
        run_conf={
            "budget_usd": 0.0001,
            "checkpoint_uri": str(tmp_path / "ckpt"),
            "registry_uri": str(tmp_path / "r"),
        }
    )
    states = _states(run)
    assert states["stop"] == TaskInstanceState.SUCCESS
    assert (
        states["train_spot"] == states["train_on_demand"] == states["spot_watch"] == TaskInstanceState.SKIPPED
    )
    assert states["validate"] == states["evaluate"] == TaskInstanceState.SKIPPED
    decision = run.get_task_instance("budget").xcom_pull(task_ids="budget", key="decision")
    assert decision["choice"] == "stop" and "over budget" in decision["reason"]
    assert not (tmp_path / "ckpt").exists(), "nothing may train or be saved"


def test_price_above_the_maximum_waits(dags, tmp_path):
    run = dags["train_llama"].test(
        run_conf={
            "local_spot_price": 2.0,
            "max_price": 1.0,
            "checkpoint_uri": str(tmp_path / "ckpt"),
            "registry_uri": str(tmp_path / "r"),
        }  # fmt: skip
    )
    states = _states(run)
    assert states["wait"] == TaskInstanceState.SUCCESS
    assert states["train_spot"] == states["train_on_demand"] == states["stop"] == TaskInstanceState.SKIPPED
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"flavor": "tiny"}, "flavor"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"budget_usd": -1}, "budget_usd"),
        ({"checkpoint_uri": "ftp://host/ckpt"}, "checkpoint_uri"),
        ({"checkpoint_uri": "s3://"}, "checkpoint_uri"),
    ],
)
def test_bad_trigger_form_input_fails_before_any_process_starts(dags, tmp_path, monkeypatch, conf, field):
    state_dir = tmp_path / "groups"
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(state_dir))
    with pytest.raises(ParamValidationError, match=field):
        dags["train_llama"].test(run_conf=conf)
    assert not state_dir.exists(), "no group may be launched"


def test_sweep_trains_every_config_behind_one_budget_check(dags, tmp_path):
    run = dags["sweep_llama"].test(
        run_conf={"learning_rates": [1e-3, 3e-3], "steps": 8, "sweep_root": str(tmp_path)}
    )
    assert run.state == DagRunState.SUCCESS, _states(run)
    result = run.get_task_instance("best").xcom_pull(task_ids="best")
    assert [r["lr"] for r in result["runs"]] == [1e-3, 3e-3]
    assert all(r["final_step"] == 8 for r in result["runs"])
    assert result["best"]["final_loss"] == min(r["final_loss"] for r in result["runs"])
    # One spend ledger for the sweep: a file per member, beside the members' directories.
    (sweep_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    spend = CheckpointDir(str(sweep_dir)).spend()
    assert len(spend.attempts) == 2 and spend.total_dollars > 0
    # each member's summary reports the sweep's spend as of its end: the last one, all of it
    assert max(r["dollars"] for r in result["runs"]) == pytest.approx(spend.total_dollars, rel=1e-6)
    assert min(r["dollars"] for r in result["runs"]) < spend.total_dollars


def test_a_sweep_with_a_repeated_rate_is_refused_before_any_member_starts(dags, tmp_path):
    run = dags["sweep_llama"].test(
        run_conf={"learning_rates": [1e-3, 0.001], "steps": 8, "sweep_root": str(tmp_path)}
    )
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["configs"] == TaskInstanceState.FAILED and states["train"] != TaskInstanceState.SUCCESS
    assert not any(tmp_path.iterdir()), "two members would have shared one directory"


def test_sweep_over_budget_as_a_whole_starts_nothing(dags, tmp_path):
    # one config would fit, the sweep of four does not: 4 × 200 steps × 0.5 s × $0.5/h = $0.056 > $0.03
    run = dags["sweep_llama"].test(
        run_conf={
            "learning_rates": [1e-3, 2e-3, 3e-3, 4e-3],
            "steps": 200,
            "budget_usd": 0.03,
            "sweep_root": str(tmp_path),
        }  # fmt: skip
    )
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["over_budget"] == TaskInstanceState.SUCCESS
    assert states["train"] == TaskInstanceState.SKIPPED
    assert not any(tmp_path.iterdir())


def test_unknown_dag_run_conf_keys_are_rejected_before_anything_launches(dags, tmp_path, monkeypatch):
    state_dir = tmp_path / "groups"
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(state_dir))
    run = dags["train_llama"].test(run_conf={"stepz": 10, "num_nodes": 1})
    states = _states(run)
    assert run.state == DagRunState.FAILED, states
    assert states["check_conf"] == TaskInstanceState.FAILED
    assert (
        states["spot_price"] != TaskInstanceState.SUCCESS
        and states["train_spot"] != TaskInstanceState.SUCCESS
    )
    assert not state_dir.exists(), "no group may be launched"
    from airflow_dtrain.params import UnknownConfKeys, reject_unknown_conf

    # what check_conf raised: the message names the key
    with pytest.raises(UnknownConfKeys, match=r"unknown key\(s\) 'stepz'; this DAG takes: .*num_nodes"):
        reject_unknown_conf({"stepz": 10, "num_nodes": 1}, dags["train_llama"].params)


def test_a_run_cannot_choose_the_program_the_group_runs(dags, tmp_path, monkeypatch):
    """entrypoint is the DAG author's (an operator argument, never templated, never a form param): a
    dag_run.conf that tries to set it fails the run by name before anything is launched."""
    state_dir = tmp_path / "groups"
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(state_dir))
    run = dags["train_llama"].test(run_conf={"entrypoint": ["/tmp/not-the-authors.py"], "steps": 10})
    states = _states(run)
    assert run.state == DagRunState.FAILED, states
    assert states["check_conf"] == TaskInstanceState.FAILED
    assert (
        states["train_spot"] != TaskInstanceState.SUCCESS
        and states["train_on_demand"] != TaskInstanceState.SUCCESS
    )
    assert not state_dir.exists(), "no group may be launched"
    from airflow_dtrain.params import UnknownConfKeys, reject_unknown_conf

    # what check_conf raised: the key by name, and why
    with pytest.raises(UnknownConfKeys, match=r"key 'entrypoint' is refused: .* set by the DAG author"):
        reject_unknown_conf(
            {"entrypoint": ["/tmp/not-the-authors.py"], "steps": 10}, dags["train_llama"].params
        )


def test_a_trigger_cannot_ask_for_more_nodes_than_the_dag_allows(dags, tmp_path, monkeypatch):
    state_dir = tmp_path / "groups"
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(state_dir))
    with pytest.raises(ParamValidationError, match="num_nodes"):  # the form's maximum comes from LIMITS
        dags["train_llama"].test(run_conf={"num_nodes": 64})
    assert not state_dir.exists()
