"""A trigger reaches only its own job: hostile trigger-form inputs through dag.test() of the bundled DAGs.
Each is refused naming the field, with nothing written where it pointed (every file's hash compared
before and after)."""

from __future__ import annotations

import json
import os

import pytest
from airflow.exceptions import ParamValidationError
from airflow.utils.state import DagRunState, TaskInstanceState

from tests.pipeline.trust_helpers import tree

TRAIN_TASKS = ("train_spot", "train_on_demand")


def _states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def _refused(run, task: str) -> None:
    states = _states(run)
    assert run.state == DagRunState.FAILED, states
    assert states[task] == TaskInstanceState.FAILED, states
    assert all(states[t] != TaskInstanceState.SUCCESS for t in TRAIN_TASKS), states


def _their_job(root, owner: str | None, job: str) -> None:
    """A directory of another team's job: a committed checkpoint (and, if ``owner``, its owner.json)."""
    step = root / "step-00000020"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(json.dumps({"step": 20, "job": job, "files": {}}))
    (root / "spend").mkdir()
    (root / "spend" / "theirs-r0.json").write_text(json.dumps({"dollars": 1.0}))
    if owner:
        (root / "owner.json").write_text(json.dumps({"owner": owner, "job": job}))


@pytest.mark.parametrize(
    ("owner", "refusal"),
    [("team-b", "belongs to job 'shared' of 'team-b', not to job 'shared' of 'user:dag_test'"),
     (None, "holds data of no recorded owner (checkpoints of job other)")],
    ids=["another owner's job", "a foreign directory"],
)  # fmt: skip
def test_another_owners_job_or_a_foreign_directory_is_refused_with_nothing_written(
    dags, tmp_path, owner, refusal, monkeypatch, capfd
):
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(tmp_path / "groups"))
    theirs = tmp_path / "theirs"
    _their_job(theirs, owner, "shared" if owner else "other")
    before = tree(theirs)
    # a trigger-set local price of 1e12 would stop their next run if it reached their ledger: it is refused
    # too
    run = dags["train_llama"].test(
        run_conf={"job": "shared", "checkpoint_uri": str(theirs), "local_spot_price": 499}
    )
    _refused(run, "budget")
    out = capfd.readouterr()
    assert refusal in out.out + out.err
    assert tree(theirs) == before, "no spend file, lease, owner record or retention in their directory"
    assert not (tmp_path / "groups").exists(), "no group launched"


def test_an_empty_job_is_refused_by_the_form(dags, tmp_path, monkeypatch):
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(tmp_path / "groups"))
    home = os.environ["AIRFLOW_HOME"]
    before = tree(f"{home}/dtrain/checkpoints") if os.path.isdir(f"{home}/dtrain/checkpoints") else {}
    with pytest.raises(ParamValidationError, match="job"):
        dags["train_llama"].test(run_conf={"job": ""})
    after = tree(f"{home}/dtrain/checkpoints") if os.path.isdir(f"{home}/dtrain/checkpoints") else {}
    assert after == before and not (tmp_path / "groups").exists()


@pytest.mark.parametrize(
    ("conf", "refusal"),
    [
        (
            {"registry_uri": "/srv/other-team/models"},
            "registry_uri: '/srv/other-team/models' is outside the storage roots",
        ),
        ({"seq_len": 65536, "micro_batch_size": 64}, "4194304 tokens is above the limit of 262144"),
        (
            {"checkpoint_uri": "/srv/other-team/ckpt"},
            "checkpoint_uri: '/srv/other-team/ckpt' is outside the storage roots",
        ),
    ],
    ids=["registry outside the roots", "tokens per micro-batch", "checkpoints outside the roots"],
)
def test_a_run_beyond_the_limits_is_refused_before_any_task(
    dags, tmp_path, monkeypatch, capfd, conf, refusal
):
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(tmp_path / "groups"))
    monkeypatch.setenv("AIRFLOW__DTRAIN__STORAGE_ROOTS", str(tmp_path))  # the platform's: not /srv/other-team
    run = dags["train_llama"].test(run_conf={"checkpoint_uri": str(tmp_path / "ckpt"), **conf})
    _refused(run, "check_conf")
    out = capfd.readouterr()
    assert refusal in out.out + out.err
    assert _states(run)["prepare_data"] == TaskInstanceState.UPSTREAM_FAILED
    assert not (tmp_path / "groups").exists() and not os.path.exists("/srv/other-team")


def test_the_sweeps_limits_are_the_train_limits(dags, tmp_path, monkeypatch):
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(tmp_path / "groups"))
    train, sweep = dags["train_llama"].params, dags["sweep_llama"].params
    for name in ("num_nodes", "procs_per_node", "steps"):
        assert sweep.get_param(name).schema["maximum"] == train.get_param(name).schema["maximum"], name
    assert (
        sweep.get_param("price_per_hour").schema["maximum"]
        == train.get_param("local_spot_price").schema["maximum"]
    )
    for conf, field in (
        ({"learning_rates": [1e-3 * (i + 1) for i in range(17)]}, "learning_rates"),
        ({"num_nodes": 9}, "num_nodes"),
        ({"price_per_hour": 1e12}, "price_per_hour"),
    ):
        with pytest.raises(ParamValidationError, match=field):
            dags["sweep_llama"].test(run_conf={"sweep_root": str(tmp_path), **conf})
    assert not (tmp_path / "groups").exists()
    monkeypatch.setenv("AIRFLOW__DTRAIN__STORAGE_ROOTS", str(tmp_path / "mine"))
    run = dags["sweep_llama"].test(run_conf={"sweep_root": "/srv/other-team/sweeps"})
    assert _states(run)["check_conf"] == TaskInstanceState.FAILED and not os.path.exists("/srv/other-team")


def test_a_forged_checkpoint_runs_nothing_when_a_run_resumes_validates_and_evaluates(
    dags, tmp_path, monkeypatch
):
    """The job's directory holds a checkpoint whose .metadata would run a command when unpickled (its
    manifest's checksums match): the run resumes past it, validates and evaluates; the command never runs."""
    from tests.trainer.conftest import FAST, run_trainer
    from tests.trainer.test_forged_checkpoint import _forge_metadata

    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(tmp_path / "groups"))
    ckpt, marker = tmp_path / "ckpt", tmp_path / "MARKER"
    trained = run_trainer([*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2", "--steps", "6",
                           "--set", "job=train-llama"], os.environ["DTRAIN_DATA_DIR"])  # fmt: skip
    assert trained.returncode == 0, trained
    _forge_metadata(ckpt / "step-00000006", marker)
    run = dags["train_llama"].test(run_conf={
        "checkpoint_uri": str(ckpt), "registry_uri": str(tmp_path / "registry"), "steps": 8, "num_nodes": 1,
        "seq_len": 32, "global_batch_size": 8, "micro_batch_size": 4, "checkpoint_every": 2,
        "simulate_preemption_at_step": 0,
    })  # fmt: skip
    states = _states(run)
    assert run.state == DagRunState.SUCCESS, states
    assert not marker.exists(), "the forged pickle ran"
    summary = json.loads((ckpt / "summary.json").read_text())
    assert summary["final_step"] == 8
    validated = run.get_task_instance("validate").xcom_pull(task_ids="validate")
    assert validated["step"] == 8
