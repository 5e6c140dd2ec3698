"""The Training jobs pages' readers and app, without a browser: what a job's row and page say of jobs that
trained, of missing, torn and forged directories (and that a forged pickle runs nothing), that the jobs page
reads only what changed, that another DAG's job is refused before a file of it is read, on local and s3://
storage; and that `airflow plugins` lists the plugin."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from airflow_dtrain import jobs_index
from airflow_dtrain.ui import app as ui_app, read
from airflow_dtrain.ui.read import Reads, RowCache, job_detail, read_row
from tests.conftest import REPO
from tests.ui.synthetic_jobs import write_job
from trainer.checkpoint.directory import PROGRESS

VENDOR = REPO / "airflow_dtrain" / "ui" / "static" / "vendor"


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A job index of the test's own."""
    monkeypatch.setenv("AIRFLOW__DTRAIN__JOBS_INDEX", str(tmp_path / "index"))
    return tmp_path / "index"


def _entry(job: str, owner: str = "user:alice", dag_id: str = "train_llama") -> dict:
    return jobs_index.read_entry(dag_id, jobs_index.entry_id(owner, job))


def test_a_jobs_row_and_page_say_what_its_files_say(tmp_path, index):
    write_job(tmp_path, "alpha", dollars=1.25, budget_usd=5.0, preempted_at=30)
    row = read_row(_entry("alpha"))
    assert (row.state, row.step, row.steps, row.owner) == ("finished", 60, 60, "user:alice")
    assert (row.preemptions, row.steps_lost, row.spent_usd, row.budget_usd) == (1, 0, 1.25, 5.0)
    assert row.best == {"eval-0123456789ab": 2.25} and row.checkpoint_step == 60 and not row.problems
    page = job_detail(_entry("alpha"))
    assert [c["step"] for c in page["checkpoints"]] == [30, 60] and all(
        c["valid"] for c in page["checkpoints"]
    )
    assert [a["billed_s"] for a in page["attempts"]] == [280.0, 280.0]
    loss = page["charts"]["loss"]["layer"]
    markers = [m for layer in loss if layer["mark"]["type"] == "rule" for m in layer["data"]["values"]]
    assert {"step": 30, "event": "preemption", "label": "preemption at step 30"} in markers
    assert page["charts"]["spend"]["layer"][1]["data"]["values"][0]["usd"] == 5.0  # the cap


def test_missing_torn_and_forged_directories_each_say_what_is_wrong(tmp_path, index):
    gone = write_job(tmp_path, "gone")
    for path in sorted(gone.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    gone.rmdir()
    (write_job(tmp_path, "torn") / PROGRESS).write_text('{"status": "running", "step": 4')
    (write_job(tmp_path, "forged") / PROGRESS).write_text(json.dumps({"step": "$(rm -rf /)", "events": "x"}))
    jobs_index.record("train_llama", "user:alice", "outside", state="running", checkpoint_uri="/etc")
    problems = {job: read_row(_entry(job)).problems for job in ("gone", "torn", "forged", "outside")}
    assert problems["gone"] == [f"checkpoint directory {gone} is missing"]
    assert problems["torn"] == [f"{PROGRESS} cannot be read (half-written or not JSON: JSONDecodeError)"]
    assert problems["forged"] == [f"{PROGRESS}: step is '$(rm -rf /)', not a number"]
    assert problems["outside"] == ["checkpoint directory '/etc' is outside the storage roots"]
    for job in ("gone", "torn", "forged", "outside"):
        assert job_detail(_entry(job))["row"]["problems"] == problems[job]  # the page renders, with them


class _Marker:
    """Unpickled, writes its marker: what a forged checkpoint file would run."""

    path = ""

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "ran"))


def test_a_forged_pickle_in_a_checkpoint_runs_nothing_and_a_forged_manifest_is_refused(tmp_path, index):
    ckpt = write_job(tmp_path, "pickled")
    marker = tmp_path / "MARKER"
    _Marker.path = str(marker)
    for step_dir in ckpt.glob("step-*"):
        (step_dir / ".metadata").write_bytes(pickle.dumps(_Marker()))
        (step_dir / "__0_0.distcp").write_bytes(pickle.dumps(_Marker()))
    (ckpt / "step-00000060" / "manifest.json").write_text(json.dumps({"step": 61}))
    page = job_detail(_entry("pickled"))
    assert not marker.exists(), "a file of the checkpoint was unpickled"
    assert page["checkpoints"][0]["valid"] and not page["checkpoints"][1]["valid"]
    assert "lacks world_size" in page["checkpoints"][1]["why"]


def test_the_jobs_page_of_1000_jobs_reads_an_ended_job_once_and_a_live_one_when_it_changes(
    tmp_path, index, monkeypatch
):
    """The bound's time is measured in benchmarks/ui_jobs.py; here, what each request reads."""
    for i in range(999):
        write_job(tmp_path, f"done-{i:03d}", dollars=0.01 * i)
    live = write_job(tmp_path, "live", state="running", step=10, dollars=50.0)  # first by spend
    client = _client(monkeypatch, {"train_llama"})

    def page() -> tuple[dict, int]:
        before = Reads.count
        answer = client.get("/api/jobs", params={"sort": "spent_usd", "per_page": 50})
        assert answer.status_code == 200, answer.text
        return answer.json(), Reads.count - before

    first, read_first = page()
    assert first["total"] == 1000 and len(first["rows"]) == 50
    assert read_first >= 1000 * 3  # entry, progress, spend files, best of each job
    again, read_again = page()
    assert read_again == 0 and again == first, "nothing changed: nothing is read"

    monkeypatch.setattr(read, "LIVE_REFRESH_S", 0.0)
    progress = json.loads((live / PROGRESS).read_text())
    (live / PROGRESS).write_text(json.dumps({**progress, "step": 11}))
    rows, read_live = page()
    assert {r["job"]: r["step"] for r in rows["rows"]}.get("live") == 11
    assert 0 < read_live <= 6, "only the live job's files are read again, none of the 999 ended ones"


def _client(monkeypatch, readable: set[str]) -> TestClient:
    from airflow.api_fastapi.core_api.security import get_user

    app = ui_app.create_app()
    app.dependency_overrides[get_user] = lambda: "someone"
    monkeypatch.setattr(ui_app, "readable_dags", lambda user: readable)
    return TestClient(app)


def test_another_dags_job_is_refused_before_any_file_of_it_is_read(tmp_path, index, monkeypatch):
    write_job(tmp_path, "theirs", dag_id="team_b_train", owner="user:bob")
    write_job(tmp_path, "mine")
    client = _client(monkeypatch, {"train_llama"})
    listed = client.get("/api/jobs").json()
    assert [r["job"] for r in listed["rows"]] == ["mine"] and listed["dags"] == ["train_llama"]
    read_entries = []
    monkeypatch.setattr(jobs_index, "read_entry", lambda *a, **k: read_entries.append(a))
    before = Reads.count
    entry = jobs_index.entry_id("user:bob", "theirs")
    for url in (f"/api/jobs/team_b_train/{entry}", f"/jobs/team_b_train/{entry}", "/ti/team_b_train/r/t"):
        response = client.get(url)
        assert response.status_code == 403, (url, response.text)
    assert read_entries == [] and Reads.count == before
    assert client.get("/api/jobs/train_llama/..%2F..%2Fetc").status_code == 404  # no path from a request


def test_the_jobs_page_sorts_filters_and_pages(tmp_path, index, monkeypatch):
    for i in range(7):
        write_job(tmp_path, f"job-{i}", owner="user:alice" if i % 2 else "user:carol", dollars=float(i))
    client = _client(monkeypatch, {"train_llama"})
    page = client.get(
        "/api/jobs", params={"sort": "spent_usd", "desc": "false", "per_page": 3, "page": 2}
    ).json()
    assert page["total"] == 7 and [r["job"] for r in page["rows"]] == ["job-3", "job-4", "job-5"]
    carol = client.get("/api/jobs", params={"owner": "user:carol"}).json()
    assert {r["job"] for r in carol["rows"]} == {"job-0", "job-2", "job-4", "job-6"}
    assert client.get("/api/jobs", params={"sort": "rm -rf"}).status_code == 422


def test_a_job_on_s3_reads_as_one_on_a_local_disk(tmp_path, moto_endpoint, monkeypatch):
    import boto3

    for name, value in {
        "AWS_ENDPOINT_URL_S3": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3").create_bucket(Bucket="ui-jobs")
    local = write_job(tmp_path, "on-s3")
    s3 = boto3.client("s3")
    for path in local.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "ui-jobs", f"ckpt/on-s3/{path.relative_to(local)}")
    monkeypatch.setenv("AIRFLOW__DTRAIN__JOBS_INDEX", "s3://ui-jobs/index")
    jobs_index.record(
        "train_llama",
        "user:alice",
        "on-s3",
        state="finished",
        checkpoint_uri="s3://ui-jobs/ckpt/on-s3",
        steps=60,
        budget_usd=5.0,
    )
    (row,) = RowCache().rows(["train_llama"])
    assert (row.step, row.preemptions, row.spent_usd, row.problems) == (60, 1, 1.25, [])
    assert [c["step"] for c in job_detail(_entry("on-s3"))["checkpoints"]] == [30, 60]


def test_airflow_lists_the_plugin_and_its_vendored_scripts_are_the_released_ones():
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "plugins", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    plugins = {p["name"]: p for p in json.loads(result.stdout.strip().splitlines()[-1])}
    ours = plugins["airflow_dtrain"]
    assert ours["fastapi_apps"][0]["url_prefix"] == "/dtrain"
    assert {v["destination"] for v in ours["external_views"]} == {"nav", "task_instance"}
    for line in (VENDOR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
