"""The train_llama trigger form, in a real browser: Trigger with the defaults creates a queued run.

A real Airflow api-server (no scheduler) serves the UI from a fresh Airflow home into which the
bundled DAGs were serialized; Playwright drives the system's chromium. The test opens the DAG's
page, opens the Trigger form, presses Trigger without typing anything, and checks that a run was
created and shows as queued: in the UI (the run's page and the DAG's run list), through the
REST API and through ``airflow dags list-runs``.

The UI treats a param as required when its schema's ``type`` does not admit ``null``, and a
required field that is empty (``None`` or ``""``) keeps the Trigger button disabled: that is
what this test catches (tests/unit/test_dag_params.py says which param is to blame).

Skips, saying what to install, without the playwright package or a chromium. On failure a
screenshot is saved (its path is in the message).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.airflow_server import Airflow, json_output

DAG_ID = "train_llama"
UI_TIMEOUT_MS = 30_000
# After the form's fields are drawn, how long its own validation gets to disable the button.
FORM_SETTLE_MS = 1_500

pytestmark = pytest.mark.browser


def _ui_required_and_empty(params: dict) -> list[str]:
    """The params the UI reads as required and empty (its ``isRequired`` rule, on what it loads)."""
    blocking = []
    for name, param in params.items():
        kind = (param.get("schema") or {}).get("type")
        required = bool(kind) and not (isinstance(kind, list) and "null" in kind)
        if required and param.get("value") in (None, ""):
            blocking.append(f"{name} (type={kind!r}, default={param.get('value')!r})")
    return blocking


def _the_dag_before(api_server: Airflow) -> tuple[bool, dict]:
    """The DAG is serialized and has no run yet: whether it is paused, and its params."""
    dag = api_server.get(f"/api/v2/dags/{DAG_ID}")
    assert dag is not None and dag.status_code == 200, (
        f"{DAG_ID} is not in the database after `airflow dags reserialize`: {dag and dag.text}\n"
        f"{api_server.diagnostics()}"
    )
    paused_before = dag.json()["is_paused"]
    runs = api_server.get(f"/api/v2/dags/{DAG_ID}/dagRuns").json()
    assert runs["total_entries"] == 0, runs
    params = api_server.get(f"/api/v2/dags/{DAG_ID}/details").json()["params"]
    return paused_before, params


def _open_the_trigger_form(page, api_server: Airflow, params: dict):
    """The DAG's page, then its Trigger form with a field for every param: the dialog and its sections."""
    from playwright.sync_api import expect

    page.goto(f"{api_server.url}/dags/{DAG_ID}")
    page.get_by_test_id("trigger-dag-button").first.click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text(f"Trigger Dag - {DAG_ID}")).to_be_visible()

    # Every param has its field in the form (each widget carries element_<name> as id or name).
    form = dialog.get_by_test_id("config-form")
    expect(form).to_be_visible()
    for name in params:
        field = f'[id="element_{name}"], [name="element_{name}"], [id$=":element_{name}"]'
        expect(
            form.locator(field).first,
            f"param {name!r} has no field in the trigger form",
        ).to_be_attached()
    sections = form.locator('[data-part="item-trigger"]').all_inner_texts()
    # The form checks its required fields once drawn: time for it to disable the button.
    page.wait_for_timeout(FORM_SETTLE_MS)
    return dialog, sections


def _submit_with_the_defaults(page, dialog, params: dict, sections, paused_before: bool, screenshot: Path):
    """Press Trigger with nothing typed (failing, with a screenshot, where the button stays disabled)."""
    from playwright.sync_api import expect

    if paused_before:
        # A new DAG is paused; a manual run is created all the same. The form offers to unpause
        # it (checked by default) -- left as the form has it.
        expect(dialog.get_by_text(f"Unpause {DAG_ID} on trigger")).to_be_visible()

    submit = dialog.get_by_test_id("trigger-dag-submit")
    if not submit.is_enabled():
        page.screenshot(path=str(screenshot), full_page=True)
        pytest.fail(
            f"The Trigger button of {DAG_ID}'s trigger form stays disabled with the form's defaults "
            f"(nothing typed). Params the UI reads as required but whose default is empty: "
            f"{_ui_required_and_empty(params) or 'none (something else blocks the form)'}; "
            f"accordions of the form: {sections}. Screenshot: {screenshot}",
            pytrace=False,
        )
    submit.click()


def _the_run_queued_in_the_ui(page, api_server: Airflow) -> str:
    """The run's page and the DAG's run list show the new run queued; its run id."""
    from playwright.sync_api import expect

    # The UI confirms, and goes to the new run's page, where the run is queued (no scheduler).
    expect(page.get_by_text("Dag Run Triggered").first).to_be_visible()
    page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/[^/]+$"))
    run_id = unquote(page.url.rsplit("/runs/", 1)[1])
    expect(page.get_by_role("heading", name=run_id, exact=True)).to_be_visible()
    expect(page.get_by_test_id("state-badge").filter(has_text="Queued").first).to_be_visible()

    # The DAG's list of runs shows it queued too.
    page.goto(f"{api_server.url}/dags/{DAG_ID}/runs")
    row = page.get_by_role("row").filter(has_text=run_id)
    expect(row).to_have_count(1)
    expect(row.get_by_test_id("table-cell-state")).to_have_text("Queued")
    return run_id


def _assert_one_queued_run(api_server: Airflow, run_id: str) -> None:
    # Cross-checks outside the browser: the REST API and the CLI see the one run, queued.
    runs = api_server.get(f"/api/v2/dags/{DAG_ID}/dagRuns").json()
    assert [(r["dag_run_id"], r["state"], r["run_type"]) for r in runs["dag_runs"]] == [
        (run_id, "queued", "manual")
    ], runs
    listed = json_output(api_server.cli("dags", "list-runs", DAG_ID, "-o", "json").stdout)
    assert [(r["run_id"], r["state"]) for r in listed] == [(run_id, "queued")], listed


@pytest.mark.timeout(600)
def test_trigger_form_submits_train_llama_with_its_defaults(
    api_server: Airflow, browser, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    # expect()'s own default is 5 s, not the context's timeout: a page that takes longer to load on a busy
    # machine is slow, not wrong (a run's row once took more than 5 s to appear with the other tests running)
    expect.set_options(timeout=UI_TIMEOUT_MS)
    started = time.monotonic()
    paused_before, params = _the_dag_before(api_server)

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(UI_TIMEOUT_MS)
    page = context.new_page()
    screenshot = tmp_path / "trigger_form_failure.png"
    try:
        dialog, sections = _open_the_trigger_form(page, api_server, params)
        _submit_with_the_defaults(page, dialog, params, sections, paused_before, screenshot)
        run_id = _the_run_queued_in_the_ui(page, api_server)
    except BaseException:
        if not screenshot.exists():
            try:
                page.screenshot(path=str(screenshot), full_page=True)
            except Exception as err:  # noqa: BLE001 - the original failure matters more
                print(f"no screenshot: {err}")
        print(f"screenshot of the page at the failure: {screenshot}")
        raise
    finally:
        context.close()
    _assert_one_queued_run(api_server, run_id)
    paused_after = api_server.get(f"/api/v2/dags/{DAG_ID}").json()["is_paused"]

    print(
        f"{DAG_ID}: run {run_id} queued from the trigger form in {time.monotonic() - started:.1f}s; "
        f"form sections {sections}; paused before {paused_before}, after {paused_after}"
    )
