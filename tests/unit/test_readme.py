"""The README's trigger-form table is the one the field declarations generate."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_readme_trigger_form_table_is_generated_from_the_field_declarations(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "update_readme.py"), "--check"],
        capture_output=True, text=True, env={"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
