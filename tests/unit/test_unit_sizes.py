"""Small units: no module over 400 lines, no function over 60, declarative tables aside.

A function counts from its ``def`` line to its last line, docstring included. Declarative tables are
data, read as tables, and may be as long as they need: a function whose body, after its docstring and
imports, is one ``return`` of a literal (a dict, list or tuple display: ``get_provider_info``), a
decorator's table (``pytest.mark.parametrize``'s cases) and a module-level literal. Anything else over the
limits is named in ``ALLOWED`` with its reason, and that list stays short.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
TREES = ("airflow_dtrain", "trainer", "dags", "benchmarks", "scripts", "tests", "examples")

ALLOWED: dict[str, str] = {}
"""``path`` or ``path::function`` over the limits, and why. Keep it short."""


def _is_table(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    while body and isinstance(body[0], (ast.Import, ast.ImportFrom)):
        body = body[1:]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, (ast.Dict, ast.List, ast.Tuple))
    )


def oversized(path: Path, text: str) -> list[str]:
    """What in one module is over the limits, as ``ALLOWED`` would name it, with its size."""
    name = path.relative_to(REPO).as_posix() if path.is_absolute() else path.as_posix()
    found = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{name} ({lines} lines)")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_table(node):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}::{node.name} ({length} lines)")
    return found


def _sources() -> list[Path]:
    return [p for tree in TREES for p in sorted((REPO / tree).rglob("*.py")) if "__pycache__" not in p.parts]


def test_the_size_check_finds_a_long_function_and_a_long_module_but_not_a_table():
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert oversized(Path("m.py"), long_function) == [f"m.py::f ({MAX_FUNCTION_LINES + 1} lines)"]
    table = (
        'def info():\n    """A table."""\n    import os\n\n    return {\n'
        + '        "k": 1,\n' * 200
        + "    }\n"
    )
    assert oversized(Path("t.py"), table) == []
    cases = "@pytest.mark.parametrize('n', [\n" + "    1,\n" * 200 + "])\ndef test_n(n):\n    assert n\n"
    assert oversized(Path("c.py"), cases) == []
    not_a_table = "def info():\n    x = 1\n    return {\n" + '        "k": x,\n' * 60 + "    }\n"
    assert oversized(Path("n.py"), not_a_table) == ["n.py::info (64 lines)"]
    long_module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    assert oversized(Path("big.py"), long_module) == [f"big.py ({MAX_MODULE_LINES + 1} lines)"]


def test_no_module_over_400_lines_and_no_function_over_60():
    found = [item for path in _sources() for item in oversized(path, path.read_text())]
    over = [item for item in found if item.split(" (")[0] not in ALLOWED]
    assert not over, (
        "over the size limits (split them, or name them in ALLOWED with a reason):\n" + "\n".join(over)
    )


def test_each_allowed_exception_is_still_needed():
    stale = []
    for name in sorted(ALLOWED):
        path = REPO / name.split("::")[0]
        found = (
            {item.split(" (")[0] for item in oversized(path, path.read_text())} if path.exists() else set()
        )
        if name not in found:
            stale.append(name)
    assert not stale, f"within the limits now, or gone: drop them from ALLOWED: {stale}"
