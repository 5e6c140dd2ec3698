"""The limits object and job ownership (airflow_dtrain/trust/limits.py): what the admin, the DAG author and a
trigger may choose, and who owns a job's directory."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from airflow_dtrain.errors import SpecError
from trainer.money.deadline import budget_deadline
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.trust.limits import (
    ADMIN_DEFAULTS,
    WHO_SETS_WHAT,
    Limits,
    admin_limits,
    check_run,
    limits_for,
    limits_table,
)
from airflow_dtrain.trust.ownership import OwnershipError, check_job_dir, run_key
from tests.conftest import REPO, RecordingTI
from tests.pipeline.trust_helpers import tree


def test_the_security_pages_who_sets_what_table_is_the_limits_object():
    page = (REPO / "docs" / "security.md").read_text()
    assert limits_table() in page
    rows = re.findall(r"^\| `(\w+)` \| (admin[^|]*) \|", page, re.M)
    assert [name for name, _ in rows] == [f.name for f in dataclasses.fields(Limits)]
    assert set(WHO_SETS_WHAT) == {f.name for f in dataclasses.fields(Limits)}


def test_the_admins_limits_bound_every_dag_and_the_author_only_narrows_them(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__DTRAIN__LIMITS", json.dumps({"max_nodes": 4, "max_runtime_s": 600}))
    monkeypatch.setenv("AIRFLOW__DTRAIN__STORAGE_ROOTS", str(tmp_path / "team"))
    admin = admin_limits()
    assert admin.max_nodes == 4 and admin.max_runtime_s == 600
    assert admin.max_tokens_per_micro_batch == ADMIN_DEFAULTS.max_tokens_per_micro_batch
    assert str(tmp_path / "team") in admin.storage_roots and any(
        r.endswith("/dtrain") for r in admin.storage_roots
    )
    effective = limits_for({"max_nodes": 8, "max_steps": 10, "storage_roots": [str(tmp_path / "team" / "a")]})
    assert (effective.max_nodes, effective.max_steps, effective.max_runtime_s) == (4, 10, 600)
    assert effective.storage_roots == (str(tmp_path / "team" / "a"),)
    with pytest.raises(
        SpecError, match=r"limits.storage_roots: '/elsewhere' is outside the platform's storage roots"
    ):
        limits_for({"storage_roots": ["/elsewhere"]})
    monkeypatch.setenv("AIRFLOW__DTRAIN__LIMITS", "{not json")
    with pytest.raises(SpecError, match=r"\[dtrain\] limits: not JSON"):
        admin_limits()


@pytest.mark.parametrize(
    ("params", "refusal"),
    [
        ({"job": ""}, r"job: '' is not a job name"),
        (
            {"seq_len": 8192, "micro_batch_size": 64},
            r"seq_len x micro_batch_size: 8192 x 64 = 524288 tokens is above "
            r"the limit of 262144 \(limits.max_tokens_per_micro_batch\)",
        ),
        ({"local_spot_price": 1e12}, r"local_spot_price: 1e\+12 is above the limit of 500"),
        ({"price_per_hour": 501}, r"price_per_hour: 501 is above the limit of 500"),
        ({"learning_rates": [1e-3] * 17}, r"learning_rates: 17 is above the limit of 16"),
        ({"num_nodes": 9}, r"num_nodes: 9 is above the limit of 8"),
        ({"num_nodes": 4, "min_nodes": 1},
         r"min_nodes: 1 lets a group of 4 train 3 node\(s\) short, above the limit of 2 "
         r"\(limits.max_missing_nodes\)"),
        ({"registry_uri": "/etc/models"}, r"registry_uri: '/etc/models' is outside the storage roots"),
        ({"sweep_root": "/var/other-team"}, r"sweep_root: '/var/other-team' is outside the storage roots"),
    ],
)  # fmt: skip
def test_a_run_asking_beyond_the_limits_is_refused_naming_the_field(params, refusal):
    with pytest.raises(SpecError, match=refusal):
        check_run(params, {"max_nodes": 8, "max_sweep_members": 16, "max_missing_nodes": 2})


def test_a_job_without_a_budget_still_gets_a_deadline(tmp_path):
    spec = JobSpec.from_arguments(checkpoint_uri=str(tmp_path), max_runtime_s=900)
    assert spec.budget_usd is None
    deadline = budget_deadline(spec)
    assert deadline["seconds"] == 900 and deadline["by"] == "max_runtime_s"
    # with a budget that buys less, the budget's deadline is the earlier
    spec = JobSpec.from_arguments(checkpoint_uri=str(tmp_path), max_runtime_s=900, budget_usd=0.01,
                                  price_per_node_hour=1.0)  # fmt: skip
    assert budget_deadline(spec)["seconds"] < 900 and "by" not in budget_deadline(spec)


def test_the_operator_gives_a_budgetless_job_the_limits_runtime(tmp_path, airflow_home):
    from airflow_dtrain import FSDPTrainOperator

    op = FSDPTrainOperator(task_id="t", checkpoint_uri=str(tmp_path / "c"), limits={"max_runtime_s": 120},
                           local_state_dir=str(tmp_path / "s"))  # fmt: skip
    spec = op.job_spec()
    assert spec.budget_usd is None and spec.max_runtime_s == 120
    assert budget_deadline(spec)["seconds"] == 120
    with pytest.raises(SpecError, match=r"max_runtime_s: 999 is above the limit of 120"):
        FSDPTrainOperator(task_id="t", checkpoint_uri=str(tmp_path / "c"), max_runtime_s=999,
                          limits={"max_runtime_s": 120}).job_spec()  # fmt: skip


def _ctx(dag_id: str = "train_llama") -> dict:
    return {"ti": RecordingTI(dag_id=dag_id)}


def test_a_job_directory_belongs_to_its_owner_and_job(tmp_path, monkeypatch):
    d = str(tmp_path / "job")
    check_job_dir(d, owner="team-a", job="llama")
    assert json.loads((tmp_path / "job" / "owner.json").read_text()) == {
        "owner": "team-a",
        "job": "llama",
        "kind": "checkpoints",
    }
    check_job_dir(d, owner="team-a", job="llama")  # the same job again: its own
    before = tree(tmp_path)
    with pytest.raises(
        OwnershipError, match=r"belongs to job 'llama' of 'team-a', not to job 'llama' of 'team-b'"
    ):
        check_job_dir(d, owner="team-b", job="llama")
    with pytest.raises(
        OwnershipError, match=r"belongs to job 'llama' of 'team-a', not to job 'other' of 'team-a'"
    ):
        check_job_dir(d, owner="team-a", job="other")
    with pytest.raises(OwnershipError, match=r"job: '' is not a job name"):
        check_job_dir(str(tmp_path / "new"), owner="team-a", job="")
    assert tree(tmp_path) == before  # nothing written by a refusal


def test_an_unclaimed_directory_with_another_jobs_data_is_refused(tmp_path):
    step = tmp_path / "d" / "step-00000010"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(json.dumps({"step": 10, "job": "theirs", "files": {}}))
    before = tree(tmp_path)
    with pytest.raises(
        OwnershipError, match=r"already holds data of no recorded owner \(checkpoints of job theirs\)"
    ):
        check_job_dir(str(tmp_path / "d"), owner="team-a", job="mine")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "notes.txt").write_text("someone's files")
    before = tree(tmp_path)
    with pytest.raises(
        OwnershipError, match=r"already holds data of no recorded owner: refused for job 'mine'"
    ):
        check_job_dir(str(tmp_path / "e"), owner="team-a", job="mine")
    assert tree(tmp_path) == before
    check_job_dir(
        str(tmp_path / "d"), owner="team-a", job="theirs"
    )  # its own job's, from before owners: claimed
    assert json.loads((tmp_path / "d" / "owner.json").read_text())["job"] == "theirs"


def test_owners_map_users_and_dags_to_teams(monkeypatch):
    from airflow_dtrain.trust.ownership import owner_of

    class Run:
        triggering_user_name = "alice"

    assert owner_of(_ctx()) == "train_llama"
    monkeypatch.setenv(
        "AIRFLOW__DTRAIN__OWNERS", json.dumps({"users": {"alice": "team-a"}, "dags": {"train_llama": "ml"}})
    )
    assert owner_of({**_ctx(), "dag_run": Run()}) == "team-a"
    assert owner_of(_ctx()) == "ml"


def test_run_ids_map_to_directories_one_to_one():
    a, b = "manual__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00-00-00-00-00"
    assert run_key(a) != run_key(b)
    assert run_key(a) == run_key(a) and "/" not in run_key(a) and ":" not in run_key(a)


def test_a_new_directory_inside_another_jobs_directory_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    check_job_dir(str(theirs), owner="team-b", job="llama")
    before = tree(tmp_path)
    for inside, job in ((theirs / "registry", "llama"), (theirs / "sub" / "ckpt", "mine")):
        with pytest.raises(
            OwnershipError, match=r"lies inside .*theirs', the directory of job 'llama' of 'team-b'"
        ):
            check_job_dir(str(inside), owner="team-a", job=job)
    with pytest.raises(
        OwnershipError, match=r"the directory of job 'llama' of 'team-b': refused for job 'other'"
    ):
        check_job_dir(str(theirs / "x"), owner="team-b", job="other")
    assert tree(tmp_path) == before
    # a shared ledger (a sweep's, job None) holds its members' directories, of its owner
    sweep = tmp_path / "sweep"
    check_job_dir(str(sweep), owner="team-a", job=None, what="cost.ledger_uri")
    check_job_dir(str(sweep / "lr-0.001"), owner="team-a", job="member-0")
    with pytest.raises(OwnershipError, match=r"lies inside"):
        check_job_dir(str(sweep / "lr-0.003"), owner="team-b", job="member-1")
