"""Safe by default for many teams: each run acts for its triggering user (or the team the admin maps it to),
and no trigger reaches another owner's files, roots or queues. Every case goes through the trigger form of
the bundled DAG in a real run (``dag.test()``) as a named triggering user, in the default configuration and
with two teams mapped; each is refused with every byte of the other owner's directory as it was."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from airflow.utils.state import DagRunState, TaskInstanceState

from airflow_dtrain.trust.ownership import check_job_dir, job_dir, owner_for
from tests.pipeline.trust_helpers import as_user, tree

TEAMS = {"users": {"alice": "team-a", "bob": "team-b"}}
TRAIN_TASKS = ("train_spot", "train_on_demand")


@pytest.fixture(params=["default", "two-teams"])
def teams(request, monkeypatch, tmp_path):
    """The configuration: none (each user is its own owner) or two teams mapped in [dtrain] owners."""
    monkeypatch.setenv("DTRAIN_LOCAL_STATE_DIR", str(tmp_path / "groups"))
    if request.param == "two-teams":
        monkeypatch.setenv("AIRFLOW__DTRAIN__OWNERS", json.dumps(TEAMS))
    else:
        monkeypatch.delenv("AIRFLOW__DTRAIN__OWNERS", raising=False)
    return request.param


class _Run:
    def __init__(self, user: str):
        self.triggering_user_name = user


class _Dag:
    dag_id = "train_llama"


def alices_job(home: Path, job: str = "alpha") -> Path:
    """alice's job of train_llama where its default path puts it, with a committed checkpoint and a spend
    file, claimed by her owner (as her first run left it)."""
    root = Path(job_dir(f"{home}/dtrain/checkpoints/train_llama", job, _Run("alice"), _Dag()))
    check_job_dir(str(root), owner=owner_for("alice", "train_llama"), job=job)
    step = root / "step-00000020"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(json.dumps({"step": 20, "job": job, "files": {}}))
    (root / "spend").mkdir()
    (root / "spend" / "alpha-r0.json").write_text(json.dumps({"dollars": 1.0}))
    return root


def alices_model(home: Path) -> Path:
    """alice's registry entry of job alpha, with an exported model in it."""
    entry = Path(job_dir(f"{home}/dtrain/models/train_llama", "alpha", _Run("alice"), _Dag()))
    check_job_dir(str(entry), owner=owner_for("alice", "train_llama"), job="alpha", what="registry_uri",
                  kind="registry")  # fmt: skip
    model = entry / "eval-abc" / "run-1"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    return model


def _refused(run, capfd, *words: str) -> str:
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.FAILED, states
    assert all(states[t] != TaskInstanceState.SUCCESS for t in TRAIN_TASKS), states
    out = capfd.readouterr()
    said = out.out + out.err
    for word in words:
        assert word in said, said[-3000:]
    return said


def test_each_user_is_its_own_owner_unless_the_admin_maps_a_team(teams):
    mapped = teams == "two-teams"
    assert owner_for("alice", "train_llama") == ("team-a" if mapped else "user:alice")
    assert owner_for("bob", "train_llama") == ("team-b" if mapped else "user:bob")
    assert owner_for(None, "train_llama") == "train_llama"  # a scheduled run: the DAG's owner
    paths = {job_dir("/r", "train-llama", _Run(u), _Dag()) for u in ("alice", "bob")}
    assert len(paths) == 2 and all(p.startswith("/r/owners/") for p in paths), paths
    assert job_dir("/r", "train-llama", None, _Dag()) == "/r/train-llama"  # the DAG's own default job


@pytest.mark.parametrize(
    "case", ["takeover by job name", "default-job squat", "registry-root squat", "cross-owner init_from",
             "cross-owner dataset"],
)  # fmt: skip
def test_a_trigger_never_reaches_another_owners_files(dags, teams, case, monkeypatch, capfd):
    home = Path(os.environ["AIRFLOW_HOME"])
    theirs = alices_job(home)
    model = alices_model(home)
    try:
        _bob_tries(dags, home, theirs, model, case, monkeypatch, capfd)
    finally:  # the session's AIRFLOW_HOME: alice's directories are this test's own
        shutil.rmtree(theirs)
        shutil.rmtree(model.parent.parent)


def _bob_tries(dags, home, theirs, model, case, monkeypatch, capfd) -> None:
    dag_job = home / "dtrain" / "checkpoints" / "train_llama" / "train-llama"  # the DAG's own default job
    registry = home / "dtrain" / "models" / "train_llama"
    before = {p: tree(p) for p in (theirs, registry)}
    as_user(monkeypatch, "bob")
    bob = owner_for("bob", "train_llama")
    conf, words = {
        "takeover by job name": ({"job": "alpha", "checkpoint_uri": str(theirs)},
                                 ("checkpoint_uri", "belongs to job 'alpha' of")),
        "default-job squat": ({"checkpoint_uri": str(dag_job)},
                              ("checkpoint_uri", "DAG 'train_llama''s own jobs")),
        "registry-root squat": ({"checkpoint_uri": str(registry)},
                                ("checkpoint_uri", "a directory the provider keeps")),
        "cross-owner init_from": ({"init_from": str(model)}, ("init_from", "a run reads only its owner's")),
        "cross-owner dataset": ({"dataset": str(theirs / "step-00000020")},
                                ("dataset", "a run reads only its")),
    }[case]  # fmt: skip
    run = dags["train_llama"].test(run_conf=conf)
    said = _refused(run, capfd, *words)
    assert bob in said or "owner" in said
    assert {p: tree(p) for p in (theirs, registry)} == before, "not a byte written in alice's directories"
    assert not dag_job.exists(), "the DAG's own job is not claimed"
    assert not (Path(os.environ["DTRAIN_LOCAL_STATE_DIR"])).exists(), "no group launched"
