"""Regenerate the trigger-form table of docs/pipeline.md from the field declarations.

    python scripts/update_readme.py          # rewrite docs/pipeline.md in place
    python scripts/update_readme.py --check  # exit 1 if docs/pipeline.md is out of date (tests do this)

The table sits between ``<!-- BEGIN params:train_llama -->`` and ``<!-- END params:train_llama -->``.
It lived in the README until the README was cut down to an overview; the script keeps its name.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- BEGIN params:train_llama -->", "<!-- END params:train_llama -->"
TARGET = REPO / "docs" / "pipeline.md"


def params_table() -> str:
    """The train_llama DAG's trigger form as a Markdown table."""
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="dtrain-readme-"))
    sys.path.insert(0, str(REPO))
    from airflow_dtrain.params import markdown_table

    spec = importlib.util.spec_from_file_location("train_llama_dag", REPO / "dags" / "train_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The registry default names this machine's AIRFLOW_HOME: show it as the variable.
    return markdown_table(module.dag.params).replace(str(Path(os.environ["AIRFLOW_HOME"])), "$AIRFLOW_HOME")


def render(page: str) -> str:
    """``page`` with the text between the markers replaced by the generated table."""
    head, sep, rest = page.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{TARGET.relative_to(REPO)} has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{params_table()}\n{END}{tail}"


if __name__ == "__main__":
    path = TARGET
    current = path.read_text()
    wanted = render(current)
    if "--check" in sys.argv:
        if current != wanted:
            name = path.relative_to(REPO)
            print(f"{name}'s trigger-form table is out of date: run python scripts/update_readme.py")
            sys.exit(1)
    else:
        path.write_text(wanted)
