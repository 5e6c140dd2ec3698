"""The examples of the README and of docs/ are run, so that they cannot go stale: every ```python block
builds its operators (which validates their arguments as a DAG file would), and every `airflow dags trigger
train_llama` conf is one the DAG's trigger form and its check_conf task accept.

A block that is a program of another framework (torchtitan, LLM Foundry) is marked on the line before its
fence with ``<!-- not run: why -->``, and only read."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUN = "<!-- not run:"


def _blocks(page, language: str) -> list[tuple[str, int, str]]:
    """(page, line number, code) of every fenced block of ``language`` in ``page`` not marked not run."""
    out, lines = [], page.read_text().splitlines()
    name = str(page.relative_to(REPO))
    i = 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            start, body = i + 1, []
            marked = i > 0 and lines[i - 1].strip().startswith(NOT_RUN)
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if not marked:
                out.append((name, start + 1, "\n".join(body)))
        i += 1
    return out


PYTHON = [block for page in PAGES for block in _blocks(page, "python")]


def test_the_readme_and_docs_have_python_examples():
    assert len(PYTHON) >= 3
    assert any(name == "README.md" for name, _, _ in PYTHON)


@pytest.mark.parametrize(("name", "line", "code"), PYTHON, ids=[f"{n}:{ln}" for n, ln, _ in PYTHON])
def test_every_python_example_builds(name, line, code, monkeypatch):
    from airflow.sdk import DAG

    # the examples' checkpoints live on the PVC /mnt/ckpt: a deployment's [dtrain] storage_roots names it
    monkeypatch.setenv(
        "AIRFLOW__DTRAIN__STORAGE_ROOTS", os.environ["AIRFLOW__DTRAIN__STORAGE_ROOTS"] + ",/mnt/ckpt"
    )

    namespace: dict = {}
    # The examples build tasks as they would inside `with DAG(...)`; earlier blocks' imports carry over
    # (within one page).
    prelude = "\n".join(row for n, ln, c in PYTHON if n == name and ln < line for row in c.splitlines()
                        if row.startswith(("from ", "import ")))  # fmt: skip
    with DAG(dag_id=f"example_{line}", schedule=None):
        exec(compile(prelude + "\n" + code, f"{name}:{line}", "exec"), namespace)  # noqa: S102 - the docs' own code


def _trigger_confs() -> list[tuple[str, int, dict]]:
    """(page, line, conf) of every `airflow dags trigger train_llama` with a conf in the README and docs/."""
    confs = []
    for page in PAGES:
        for number, text in enumerate(page.read_text().splitlines(), 1):
            for match in re.finditer(r"airflow dags trigger train_llama (?:--conf|-c) ('[^']*')", text):
                confs.append(
                    (str(page.relative_to(REPO)), number, json.loads(shlex.split(match.group(1))[0]))
                )
    return confs


CONFS = _trigger_confs()


def test_the_readme_and_docs_have_trigger_examples():
    assert len(CONFS) >= 4
    assert any(name == "README.md" for name, _, _ in CONFS)


@pytest.mark.parametrize(("name", "line", "conf"), CONFS, ids=[f"{n}:{ln}" for n, ln, _ in CONFS])
def test_every_trigger_example_passes_the_form_and_check_conf(name, line, conf, airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    from airflow_dtrain.params import reject_unknown_conf

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["train_llama"]
    reject_unknown_conf(conf, dag.params)
    params = copy.deepcopy(dag.params)
    for key, value in conf.items():
        params[key] = value
    params.validate()
