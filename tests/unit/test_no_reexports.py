"""No name of the project is imported through a module that does not define it, and no module is only a
list of other modules' names: every importer names a name's real home. The two facades are the documented
ones (``FACADES``)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO
from tests.unit.test_architecture import PACKAGES, _module_name

IMPORTERS = ("airflow_dtrain", "trainer", "dags", "benchmarks", "scripts", "examples", "tests")

FACADES = {
    "airflow_dtrain": "the provider's public names (from airflow_dtrain import FSDPTrainOperator), lazily",
    "trainer.contract": "documented for programs of your own (docs/own_training_code.md); copied beside one, "
    "it imports the copy of trainer/contract_files.py beside it",
}


def _top_level_names(tree: ast.Module) -> set[str]:
    """What a module defines at its top level (under ``if`` and ``try`` too), imports left out."""
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])

    visit(tree.body)
    return names


def _project(root: Path) -> dict[str, Path]:
    return {_module_name(p, root): p for d in PACKAGES for p in sorted((root / d).rglob("*.py"))}


def imports_through_another_module(root: Path = REPO) -> list[str]:
    """``file:line: name from module`` for each import of a project name from a module that only imports
    it (a facade's own imports, of the names it stands for, excepted)."""
    modules = _project(root)
    defined = {name: _top_level_names(ast.parse(path.read_text())) for name, path in modules.items()}
    found = []
    for path in (p for d in IMPORTERS for p in sorted((root / d).rglob("*.py"))):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in modules:
                continue
            if node.module in FACADES:
                continue
            for alias in node.names:
                if alias.name not in defined[node.module] and f"{node.module}.{alias.name}" not in modules:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {alias.name} from {node.module}")
    return found


def _module_aliases(tree: ast.Module, modules: dict[str, Path]) -> dict[str, str]:
    """Local name -> project module, for ``import a.b as c`` and ``from a import b`` where ``a.b`` is one."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if f"{node.module}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def attributes_through_another_module(root: Path = REPO) -> list[str]:
    """``file:line: module.name`` for each ``module.name`` read off an imported project module that does not
    define ``name`` (``from trainer.checkpoint import directory``, then ``directory.SPEND``)."""
    modules = _project(root)
    defined = {name: _top_level_names(ast.parse(path.read_text())) for name, path in modules.items()}
    found = []
    for path in (p for d in IMPORTERS for p in sorted((root / d).rglob("*.py"))):
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(tree, modules)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            module = aliases.get(node.value.id)
            if module is None or module in FACADES or isinstance(node.ctx, ast.Store):
                continue
            if node.attr not in defined[module] and f"{module}.{node.attr}" not in modules:
                if not node.attr.startswith("__"):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {module}.{node.attr}")
    return found


def modules_of_imports_only(root: Path = REPO) -> list[str]:
    """Modules whose body, past the docstring, is only imports of the project's names."""
    found = []
    for name, path in _project(root).items():
        body = ast.parse(path.read_text()).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        body = [n for n in body if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
        if body and name not in FACADES and all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in body):
            found.append(str(path.relative_to(root)))
    return found


def test_every_import_of_a_project_name_names_its_home():
    found = imports_through_another_module()
    assert not found, "imported through a module that does not define it:\n" + "\n".join(found)


def test_every_name_read_off_a_project_module_is_defined_there():
    found = attributes_through_another_module()
    assert not found, "read off a module that does not define it:\n" + "\n".join(found)


def test_no_module_is_only_imports():
    assert not modules_of_imports_only()


def test_a_synthetic_re_export_and_an_import_through_it_fail(tmp_path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "home.py").write_text("NAME = 1\n")
    (package / "shim.py").write_text('"""Old names."""\nfrom trainer.home import NAME  # noqa: F401\n')
    (package / "user.py").write_text(
        "from trainer import shim\nfrom trainer.shim import NAME\nfrom trainer.home import NAME as N\n\n"
        "BOTH = NAME + N + shim.NAME\n"
    )
    (tmp_path / "airflow_dtrain").mkdir()
    assert modules_of_imports_only(tmp_path) == ["trainer/shim.py"]
    assert imports_through_another_module(tmp_path) == ["trainer/user.py:2: NAME from trainer.shim"]
    assert attributes_through_another_module(tmp_path) == ["trainer/user.py:5: trainer.shim.NAME"]
