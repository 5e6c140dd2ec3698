"""A real browser (Playwright driving Debian's chromium) and a real Airflow api-server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow_server import Airflow, wait_for

# Playwright's own browser download is not used (nor reachable in CI): the system's chromium is.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
STARTUP_TIMEOUT_S = 180
SETUP_TIMEOUT_S = 300


def chromium_path() -> str | None:
    explicit = os.environ.get("DTRAIN_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for candidate in CHROMIUM_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def browser():
    """A headless chromium, or a skip that says what to install. Module-scoped: Playwright's sync API runs an
    event loop in this thread until it stops, and the tests run after this module's call asyncio.run()."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(
            "the python package playwright is not installed: "
            "pip install -e '.[test]' (or pip install playwright)"
        )
    executable = chromium_path()
    if executable is None:
        pytest.skip(
            "no chromium found (looked at $DTRAIN_CHROMIUM, " + ", ".join(CHROMIUM_CANDIDATES) + ", PATH): "
            "install Debian's chromium (apt-get install chromium), or point DTRAIN_CHROMIUM at one"
        )
    with sync_playwright() as playwright:
        try:
            # --no-sandbox: as root (CI containers) chromium's sandbox refuses to start
            instance = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except Exception as err:  # noqa: BLE001 - a chromium that does not start is an environment problem
            pytest.skip(f"chromium at {executable} does not start under Playwright: {err}")
        yield instance
        instance.close()


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[Airflow]:
    """Only the api-server (no scheduler: a triggered run stays queued), in a fresh Airflow home.

    Its database is migrated and the bundled DAGs are serialized into it first, which is what the
    UI reads: without a dag-processor the DAGs are in the database only through ``reserialize``.
    """
    instance = Airflow(tmp_path, command=("api-server",))
    try:
        instance.cli("db", "migrate", timeout=SETUP_TIMEOUT_S)
        instance.cli("dags", "reserialize", timeout=SETUP_TIMEOUT_S)
        instance.start()

        def healthy() -> bool:
            response = instance.get("/api/v2/monitor/health")
            return response is not None and response.status_code == 200

        wait_for("the api-server to answer", instance, STARTUP_TIMEOUT_S, healthy, interval=1.0)
        yield instance
    finally:
        instance.stop()
        leftovers = instance.leftover_processes()
        assert not leftovers, f"processes outlived the test: {leftovers}"
