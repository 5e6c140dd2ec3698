"""The README's examples are run, so that they cannot go stale: every ```python block builds its
operators (which validates their arguments as a DAG file would), and every `airflow dags trigger
train_llama` conf is one the DAG's trigger form and its check_conf task accept."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex

import pytest

from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def _blocks(language: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block of ``language``."""
    out, lines = [], README.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            start, body = i + 1, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append((start + 1, "\n".join(body)))
        i += 1
    return out


PYTHON = _blocks("python")


def test_the_readme_has_python_examples():
    assert len(PYTHON) >= 3


@pytest.mark.parametrize(("line", "code"), PYTHON, ids=[f"README.md:{line}" for line, _ in PYTHON])
def test_every_python_example_builds(line, code, monkeypatch):
    from airflow.sdk import DAG

    # the examples' checkpoints live on the PVC /mnt/ckpt: a deployment's [dtrain] storage_roots names it
    monkeypatch.setenv(
        "AIRFLOW__DTRAIN__STORAGE_ROOTS", os.environ["AIRFLOW__DTRAIN__STORAGE_ROOTS"] + ",/mnt/ckpt"
    )

    namespace: dict = {}
    # The examples build tasks as they would inside `with DAG(...)`; earlier blocks' imports carry over.
    prelude = "\n".join(row for ln, c in PYTHON if ln < line for row in c.splitlines()
                        if row.startswith(("from ", "import ")))  # fmt: skip
    with DAG(dag_id=f"readme_{line}", schedule=None):
        exec(compile(prelude + "\n" + code, f"README.md:{line}", "exec"), namespace)  # noqa: S102 - the README's own code


def _trigger_confs() -> list[tuple[int, dict]]:
    confs = []
    for number, text in enumerate(README.splitlines(), 1):
        for match in re.finditer(r"airflow dags trigger train_llama (?:--conf|-c) ('[^']*')", text):
            confs.append((number, json.loads(shlex.split(match.group(1))[0])))
    return confs


CONFS = _trigger_confs()


def test_the_readme_has_trigger_examples():
    assert len(CONFS) >= 4


@pytest.mark.parametrize(("line", "conf"), CONFS, ids=[f"README.md:{line}" for line, _ in CONFS])
def test_every_trigger_example_passes_the_form_and_check_conf(line, conf, airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    from airflow_dtrain.params import reject_unknown_conf

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["train_llama"]
    reject_unknown_conf(conf, dag.params)
    params = copy.deepcopy(dag.params)
    for key, value in conf.items():
        params[key] = value
    params.validate()
