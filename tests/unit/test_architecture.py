"""The architecture the README describes holds: one place for each vocabulary, no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

SOURCES = [p for d in ("airflow_dtrain", "trainer", "dags") for p in sorted((REPO / d).rglob("*.py"))]


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string literal that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


CAPACITY_WORDS = {"spot", "on_demand", "on-demand", "ondemand", "any"}
NOT_A_CAPACITY = {("dags/train_llama.py", "spot"): "the DAG's tag"}


def test_the_capacity_words_are_spelled_only_in_trainer_capacity():
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in SOURCES if path != REPO / "trainer" / "capacity.py"
        for line, value in _string_literals(path)
        if value in CAPACITY_WORDS and (str(path.relative_to(REPO)), value) not in NOT_A_CAPACITY
    ]  # fmt: skip
    assert not found, "capacity spelled outside trainer/capacity.py:\n" + "\n".join(found)


# trainer/contract.py spells its own copy: a program of your own may copy the file without the package
# (tests/trainer/test_contract.py holds the copy to trainer/checkpoint_dir.py's names).
LAYOUT_COPIES = {REPO / "trainer" / "checkpoint_dir.py", REPO / "trainer" / "contract.py"}


def test_the_checkpoint_layout_is_spelled_only_in_trainer_checkpoint_dir():
    names = ("manifest.json", "progress.json", "summary.json", "best.json", "report.png", "step-")
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in SOURCES if path not in LAYOUT_COPIES
        for line, value in _string_literals(path)
        if any(name in value for name in names)
    ]  # fmt: skip
    assert not found, "checkpoint layout spelled outside trainer/checkpoint_dir.py:\n" + "\n".join(found)


def test_the_launcher_interface_imports_no_concrete_launcher():
    tree = ast.parse((REPO / "airflow_dtrain" / "launchers" / "base.py").read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }  # fmt: skip
    concrete = {m for m in imported if m and (m.startswith("airflow_dtrain.launchers.") or "kubernetes" in m)}
    assert not concrete, f"launchers/base.py imports {sorted(concrete)}"
