"""The Training jobs pages in Airflow's own UI, in a real browser, behind a real login.

A real api-server (Airflow's SimpleAuthManager in multi-team mode: two teams, each with its own DAG
bundle, and a viewer in each) serves the plugin. A real ``train_llama`` run, triggered by alice of team_a,
trains through a preemption first (``dag.test()``, writing into the job index the api-server reads). Then,
through Playwright and Debian's chromium, with each user's own login:

* alice opens "Training jobs" in the UI's navigation and sees her job with its spend bar, 1 preemption and
  0 steps lost; she opens the job's page and sees the loss curve with the preemption marked;
* bob (team_b) sees no job of team_a's DAG, and his request of alice's job's URL gets 403.

Screenshots of each page are saved in the test's directory (their paths are printed), and one is copied to
``$DTRAIN_UI_SCREENSHOTS`` when that is set (docs/images/, for docs/ui.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from airflow.utils.state import DagRunState

from airflow_dtrain import jobs_index
from tests.airflow_server import REPO, Airflow, wait_for
from tests.pipeline.conftest import dags  # noqa: F401 - the fixture
from tests.pipeline.trust_helpers import as_user

pytestmark = pytest.mark.browser

UI_TIMEOUT_MS = 30_000
TEAM_B_DAG = """
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("team_b_notes", schedule=None):
    EmptyOperator(task_id="noop")
"""


def _bundles(tmp_path: Path) -> str:
    team_b = tmp_path / "team_b_dags"
    team_b.mkdir()
    (team_b / "team_b_notes.py").write_text(TEAM_B_DAG)
    local, bundled = "airflow.dag_processing.bundles.local.LocalDagBundle", str(REPO / "dags")
    return json.dumps([
        {"name": "team_a_dags", "classpath": local, "kwargs": {"path": bundled}, "team_name": "team_a"},
        {"name": "team_b_dags", "classpath": local, "kwargs": {"path": str(team_b)}, "team_name": "team_b"},
    ])  # fmt: skip


@pytest.fixture
def two_teams(tmp_path: Path, monkeypatch) -> Iterator[Airflow]:
    """An api-server with a login for alice (team_a: train_llama) and bob (team_b: team_b_notes), reading
    the job index this test's runs write to."""
    index = tmp_path / "jobs-index"
    monkeypatch.setenv("AIRFLOW__DTRAIN__JOBS_INDEX", str(index))
    server = Airflow(tmp_path, command=("api-server",))
    server.env.pop("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", None)
    server.env.update({
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "alice:viewer:team_a,bob:viewer:team_b",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": _bundles(tmp_path),
        "AIRFLOW__DTRAIN__JOBS_INDEX": str(index),
        "AIRFLOW__DTRAIN__STORAGE_ROOTS": str(tmp_path),
    })  # fmt: skip
    try:
        server.cli("db", "migrate", timeout=300)
        for team in ("team_a", "team_b"):
            server.cli("teams", "create", team)
        server.cli("dags", "reserialize", timeout=300)
        server.start()

        def healthy() -> bool:
            response = server.get("/api/v2/monitor/health")
            return response is not None and response.status_code == 200

        wait_for("the api-server to answer", server, 180, healthy, interval=1.0)
        yield server
    finally:
        server.stop()


def _token(server: Airflow, user: str) -> str:
    passwords = json.loads((server.home / "simple_auth_manager_passwords.json.generated").read_text())
    response = httpx.post(f"{server.url}/auth/token", json={"username": user, "password": passwords[user]})
    assert response.status_code == 201, response.text
    return response.json()["access_token"]


def _logged_in(browser, server: Airflow, user: str):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_cookies([{"name": "_token", "value": _token(server, user), "url": server.url}])
    context.set_default_timeout(UI_TIMEOUT_MS)
    return context


def _alices_run(dags, tmp_path: Path, monkeypatch) -> tuple[str, str]:  # noqa: F811 - dags is the fixture
    """A train_llama run by alice that is preempted at step 6 of 12 and trains on: its job's index entry, and
    the run's id."""
    as_user(monkeypatch, "alice")
    run = dags["train_llama"].test(run_conf={
        "job": "alice-llama", "checkpoint_uri": str(tmp_path / "ckpt"),
        "registry_uri": str(tmp_path / "registry"), "steps": 12, "checkpoint_every": 3,
        "simulate_preemption_at_step": 6, "num_nodes": 1,
    })  # fmt: skip
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.SUCCESS, states
    return jobs_index.entry_id("user:alice", "alice-llama"), run.run_id


def test_alice_sees_her_job_its_spend_and_preemption_and_bob_is_refused(
    browser,
    two_teams,
    dags,
    tmp_path,
    monkeypatch,  # noqa: F811
):
    from playwright.sync_api import expect

    entry, run_id = _alices_run(dags, tmp_path, monkeypatch)
    shots = tmp_path / "screenshots"
    shots.mkdir()

    alice = _logged_in(browser, two_teams, "alice")
    page = alice.new_page()
    page.goto(f"{two_teams.url}/")
    page.get_by_role("button", name="Browse").or_(page.get_by_text("Browse", exact=True)).first.click()
    page.get_by_role("menuitem", name="Training jobs").or_(page.get_by_text("Training jobs")).first.click()
    # the UI's route of the view; once the page in it has loaded, the UI appends that page's path to it
    expect(page).to_have_url(
        re.compile(re.escape(f"{two_teams.url}/plugin/training-jobs") + r"(/dtrain/jobs)?$")
    )
    frame = page.frame_locator("iframe").first
    row = frame.locator("#jobs tbody tr", has=frame.get_by_role("link", name="alice-llama"))
    expect(row).to_have_count(1)
    expect(row.get_by_role("meter", name="spend of budget")).to_be_visible()
    expect(row.locator(".preemptions")).to_have_text("1")
    expect(row.locator(".steps-lost")).to_have_text("0")
    expect(row.get_by_text("12 of 12")).to_be_visible()
    page.screenshot(path=str(shots / "jobs-alice.png"))

    row.get_by_role("link", name="alice-llama").click()
    job = page.frame_locator("iframe").first
    expect(job.locator("#title")).to_have_text("Training job alice-llama")
    loss = job.locator("#chart-loss svg")
    expect(loss).to_be_visible()
    expect(loss.locator("[aria-label*='preemption at step 6']").first).to_be_attached()
    expect(loss.locator("path[aria-roledescription='line mark']").first).to_be_attached()
    page.screenshot(path=str(shots / "job-alice.png"), full_page=True)
    # the task instance's "Training job" tab shows the job that task ran
    page.goto(f"{two_teams.url}/dtrain/ti/train_llama/{run_id}/train_spot")
    expect(page.locator("#title")).to_have_text("Training job alice-llama")
    alice.close()

    bob = _logged_in(browser, two_teams, "bob")
    page = bob.new_page()
    page.goto(f"{two_teams.url}/plugin/training-jobs")
    frame = page.frame_locator("iframe").first
    expect(frame.locator("#count")).to_have_text("0 jobs")
    expect(frame.get_by_text("alice-llama")).to_have_count(0)
    page.screenshot(path=str(shots / "jobs-bob.png"))
    for url in (f"/dtrain/jobs/train_llama/{entry}", f"/dtrain/api/jobs/train_llama/{entry}"):
        response = page.request.get(f"{two_teams.url}{url}")
        assert response.status == 403, (url, response.status, response.text())
    bob.close()
    print(f"screenshots: {sorted(str(p) for p in shots.iterdir())}")
    if os.environ.get("DTRAIN_UI_SCREENSHOTS"):
        for shot in shots.iterdir():
            shutil.copy(shot, Path(os.environ["DTRAIN_UI_SCREENSHOTS"]) / shot.name)
