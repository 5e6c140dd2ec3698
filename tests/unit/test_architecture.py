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


NOT_THE_LAYOUT = {"step-after"}  # Vega-Lite's step interpolation (airflow_dtrain/ui/charts.py)


def test_the_checkpoint_layout_is_spelled_only_in_trainer_checkpoint_dir():
    names = ("manifest.json", "progress.json", "summary.json", "best.json", "report.png", "step-")
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in SOURCES if path not in LAYOUT_COPIES
        for line, value in _string_literals(path)
        if any(name in value for name in names) and value not in NOT_THE_LAYOUT
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


# The import graph. An edge a -> b is an import of b written anywhere in a: at module level, inside a
# function or method (a lazy import still runs, and a circle of lazy imports is still a circle of
# dependencies), in try/except. Not counted: imports under ``if TYPE_CHECKING:``, which never run and
# exist for annotations only. ``import a.b.c`` and ``from a.b import c`` count as an import of the most
# specific module of ours they name (``a.b.c`` where it is a module, else ``a.b``); the parent packages a
# dotted import also runs are not edges, or every package ``__init__`` that re-exports its submodules
# would be a "circle" with each of them.
PACKAGES = ("airflow_dtrain", "trainer")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import that can run: ``from x import y`` gives ``x.y`` and ``x``."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                found.append((node.lineno, f"{target}.{alias.name}" if alias.name != "*" else target))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: line of the first such import}."""
    files = [p for d in PACKAGES for p in sorted((REPO / d).rglob("*.py"))]
    modules = {_module_name(p) for p in files}
    graph: dict[str, dict[str, int]] = {}
    for path in files:
        edges = graph.setdefault(_module_name(path), {})
        for line, name in _imports(path):
            while name and name not in modules:  # x.y where y is a name, not a module: x
                name = name.rpartition(".")[0]
            if name and name != _module_name(path):
                edges.setdefault(name, line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, {}):
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(components)


def test_the_strongly_connected_search_finds_a_circle():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}, "e": {"e": 1}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["e"]]


def test_the_import_graph_sees_lazy_relative_and_submodule_imports():
    graph = import_graph()
    assert "airflow_dtrain.__main__" in graph["airflow_dtrain.cli"]  # inside render_command
    assert "airflow_dtrain.launchers.factory" in graph["airflow_dtrain.launchers"]  # from x import name
    assert "airflow_dtrain.launchers.base" not in graph["airflow_dtrain.launchers.factory"]  # TYPE_CHECKING


def test_no_import_circle():
    graph = import_graph()
    circles = [
        " <-> ".join(component)
        + "\n"
        + "\n".join(
            f"    {a} imports {b} (line {graph[a][b]})"
            for a in component for b in component if b in graph[a]
        )
        for component in strongly_connected(graph)
    ]  # fmt: skip
    assert not circles, "import circles (imports inside functions count):\n" + "\n".join(circles)
