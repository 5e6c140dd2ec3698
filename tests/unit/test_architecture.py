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
        for path in SOURCES if path != REPO / "trainer" / "money" / "capacity.py"
        for line, value in _string_literals(path)
        if value in CAPACITY_WORDS and (str(path.relative_to(REPO)), value) not in NOT_A_CAPACITY
    ]  # fmt: skip
    assert not found, "capacity spelled outside trainer/money/capacity.py:\n" + "\n".join(found)


# trainer/contract.py spells its own copy: a program of your own may copy the file without the package
# (tests/trainer/test_contract.py holds the copy to trainer/checkpoint/directory.py's names).
LAYOUT_COPIES = {REPO / "trainer" / "checkpoint" / "directory.py", REPO / "trainer" / "contract.py"}


NOT_THE_LAYOUT = {"step-after"}  # Vega-Lite's step interpolation (airflow_dtrain/ui/charts.py)


def test_the_checkpoint_layout_is_spelled_only_in_trainer_checkpoint_dir():
    names = ("manifest.json", "progress.json", "summary.json", "best.json", "report.png", "step-")
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in SOURCES if path not in LAYOUT_COPIES
        for line, value in _string_literals(path)
        if any(name in value for name in names) and value not in NOT_THE_LAYOUT
    ]  # fmt: skip
    assert not found, "checkpoint layout spelled outside trainer/checkpoint/directory.py:\n" + "\n".join(
        found
    )


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


def _module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, dotted name) of every import that can run: ``from x import y`` gives ``x.y`` and ``x``."""
    module = _module_name(path, root)
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


def import_graph(root: Path = REPO) -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: line of the first such import}, for the packages under ``root``."""
    files = [p for d in PACKAGES for p in sorted((root / d).rglob("*.py"))]
    modules = {_module_name(p, root) for p in files}
    graph: dict[str, dict[str, int]] = {}
    for path in files:
        edges = graph.setdefault(_module_name(path, root), {})
        for line, name in _imports(path, root):
            while name and name not in modules:  # x.y where y is a name, not a module: x
                name = name.rpartition(".")[0]
            if name and name != _module_name(path, root):
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
    assert "airflow_dtrain.launchers.ports" in graph["airflow_dtrain.launchers.local"]  # from x import name
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


# The trainer's parts and what each may import besides itself (each package's docstring says the same). A
# module at the trainer's top level (an entry point, the training loop, the contract) may import any part.
LAYERS = {
    "base": set(),
    "config": {"base", "money"},  # money.capacity: the capacity vocabulary a config names
    "money": {"base"},
    "torch_private": {"base"},
    "data": {"base", "config", "events"},
    "model": {"base", "config", "data", "torch_private"},
    "checkpoint": {"base", "config", "data", "money", "report", "torch_private", "validate"},
    "report": {"base", "config", "checkpoint", "money", "step", "events"},
    "step": {"base", "config", "data", "model", "checkpoint", "money", "report", "torch_private", "contract"},
    "elastic": {"base", "config", "data", "model", "step", "report", "torch_private", "__main__", "contract"},
    "prepare_data": {"base", "config", "data"},
    "testing": {"base", "checkpoint", "report"},
}
ELASTIC_AGENT = "torch.distributed.elastic"
MAY_IMPORT_THE_AGENT = ("trainer.elastic", "trainer.torch_private", "trainer.launch")
"""Only these touch torch's elastic agent (its rendezvous, its workers, its exit codes)."""


def _part(module: str) -> str | None:
    """The trainer's part a module belongs to: its package, or its own name at the top level."""
    parts = module.split(".")
    return parts[1] if parts[0] == "trainer" and len(parts) > 1 else None


def crossed_boundaries(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import from one part of the trainer into a part it may not import (``LAYERS``)."""
    crossed = []
    for module, edges in sorted(graph.items()):
        mine = _part(module)
        for imported, line in sorted(edges.items()):
            theirs = _part(imported)
            if mine in LAYERS and theirs is not None and theirs != mine and theirs not in LAYERS[mine]:
                crossed.append(
                    f"{module} imports {imported} (line {line}): {mine} may import {sorted(LAYERS[mine])}"
                )
    return crossed


def agent_imports(root: Path = REPO) -> list[str]:
    """Every import of torch's elastic agent outside ``MAY_IMPORT_THE_AGENT``."""
    return [
        f"{_module_name(path, root)} imports {name} (line {line})"
        for path in sorted((root / "trainer").rglob("*.py"))
        if not _module_name(path, root).startswith(MAY_IMPORT_THE_AGENT)
        for line, name in _imports(path, root) if name.startswith(ELASTIC_AGENT)
    ]  # fmt: skip


# The provider's own packages below its operators, and what each may import besides itself (their
# docstrings say the same): of the provider (``errors``, ``kubernetes``, ...) and of the trainer
# (``trainer.config``, ...). ``job`` is imported at DAG-parse time: no part of the trainer that imports torch.
PROVIDER_LAYERS = {
    "job": {"errors", "kubernetes", "trust", "trainer.config", "trainer.money"},
    "trust": {"aws", "errors", "launchers", "trainer.base", "trainer.checkpoint", "trainer.config"},
    "session": {
        "aws", "job", "launchers", "metrics", "status_line", "trainer.checkpoint", "trainer.config",
        "trainer.money",
    },
}  # fmt: skip


def provider_crossings(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import from one of ``PROVIDER_LAYERS``' packages into a part it may not import."""
    crossed = []
    for module, edges in sorted(graph.items()):
        parts = module.split(".")
        mine = parts[1] if parts[0] == "airflow_dtrain" and len(parts) > 1 else None
        if mine not in PROVIDER_LAYERS:
            continue
        for imported, line in sorted(edges.items()):
            head, _, rest = imported.partition(".")
            theirs = rest.split(".")[0] if head == "airflow_dtrain" else f"{head}.{rest.split('.')[0]}"
            if theirs != mine and theirs not in PROVIDER_LAYERS[mine]:
                crossed.append(f"{module} imports {imported} (line {line}): {mine} may import "
                               f"{sorted(PROVIDER_LAYERS[mine])}")  # fmt: skip
    return crossed


def test_no_package_of_the_provider_imports_across_its_boundary():
    packages = {p.parent.name for p in (REPO / "airflow_dtrain").glob("*/__init__.py")}
    assert set(PROVIDER_LAYERS) <= packages
    crossed = provider_crossings(import_graph())
    assert not crossed, "imports across the provider's boundaries (PROVIDER_LAYERS):\n" + "\n".join(crossed)


def test_a_synthetic_provider_module_that_crosses_a_boundary_fails(tmp_path):
    for package in (
        "trainer",
        "trainer/step",
        "airflow_dtrain",
        "airflow_dtrain/job",
        "airflow_dtrain/session",
    ):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "trainer/step/train_step.py").write_text("import torch\n")
    (tmp_path / "airflow_dtrain/session/group.py").write_text("SESSION = 1\n")
    # a spec that knows the session that runs it, and one that imports torch at DAG-parse time
    (tmp_path / "airflow_dtrain/job/spec.py").write_text(
        "from airflow_dtrain.session import group\nfrom trainer.step import train_step\n"
    )
    may = "job may import ['errors', 'kubernetes', 'trainer.config', 'trainer.money', 'trust']"
    assert provider_crossings(import_graph(tmp_path)) == [
        f"airflow_dtrain.job.spec imports airflow_dtrain.session.group (line 1): {may}",
        f"airflow_dtrain.job.spec imports trainer.step.train_step (line 2): {may}",
    ]


def test_every_part_of_the_trainer_is_a_declared_package():
    packages = sorted(p.parent.name for p in (REPO / "trainer").glob("*/__init__.py"))
    assert set(packages) - {"__pycache__"} == set(LAYERS), (
        "a package without its LAYERS entry, or the reverse"
    )
    top = sorted(p.name for p in (REPO / "trainer").glob("*.py"))
    assert len(top) <= 12, f"trainer/ holds {len(top)} modules at its top level (at most 12): {top}"


def test_no_part_of_the_trainer_imports_across_its_boundary():
    crossed = crossed_boundaries(import_graph())
    assert not crossed, "imports across the trainer's boundaries (LAYERS):\n" + "\n".join(crossed)
    assert not agent_imports(), f"torch's elastic agent imported outside {MAY_IMPORT_THE_AGENT}"


def test_a_synthetic_module_that_crosses_a_boundary_or_closes_a_circle_fails(tmp_path):
    for package in ("trainer", "trainer/model", "trainer/checkpoint", "airflow_dtrain"):
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    # a model that knows how it is saved, and a checkpoint directory that builds the model: a circle
    (tmp_path / "trainer/model/llama.py").write_text(
        "from trainer.checkpoint.directory import CheckpointDir\n"
    )
    (tmp_path / "trainer/checkpoint/directory.py").write_text(
        "def f():\n    from trainer.model import llama\n    from torch.distributed.elastic import agent\n"
    )
    graph = import_graph(tmp_path)
    assert crossed_boundaries(graph) == [
        "trainer.checkpoint.directory imports trainer.model.llama (line 2): checkpoint may import "
        "['base', 'config', 'data', 'money', 'report', 'torch_private', 'validate']",
        "trainer.model.llama imports trainer.checkpoint.directory (line 1): model may import "
        "['base', 'config', 'data', 'torch_private']",
    ]
    assert strongly_connected(graph) == [["trainer.checkpoint.directory", "trainer.model.llama"]]
    assert agent_imports(tmp_path) == [
        "trainer.checkpoint.directory imports torch.distributed.elastic.agent (line 3)"
    ]


def _dtrain_variables() -> dict[str, list[str]]:
    """Every DTRAIN_* name production code spells (the provider, the trainer, the DAGs): where."""
    import re

    found: dict[str, list[str]] = {}
    for path in SOURCES:
        if path.name == "wiring.py":
            continue
        for line, value in _string_literals(path):
            for name in re.findall(r"\bDTRAIN_[A-Z0-9_]+\b", value):
                found.setdefault(name, []).append(f"{path.relative_to(REPO)}:{line}")
    return found


def test_every_dtrain_variable_the_code_reads_is_listed_once_in_trainer_base_wiring():
    from trainer.base import wiring

    assert [name for name in vars(wiring) if name.isupper()] == ["WIRING", "ENVIRONMENT", "TEST_SEAMS"]
    tables = (wiring.WIRING, wiring.ENVIRONMENT, wiring.TEST_SEAMS)  # no switch: a setting is a field
    listed = [name for table in tables for name in table]
    assert len(listed) == len(set(listed)), "a variable listed twice"
    found = _dtrain_variables()
    unlisted = {name: where for name, where in found.items() if name not in listed}
    assert not unlisted, f"DTRAIN_* variables read but not listed in trainer/base/wiring.py: {unlisted}"
    gone = sorted(set(listed) - set(found))
    assert not gone, f"listed in trainer/base/wiring.py but read nowhere: {gone}"
