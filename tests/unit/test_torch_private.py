"""Every private torch name is used through trainer/torch_private/, each with its reason, the releases it
was checked on and a fallback; a fallback forced off is said and recorded."""

from __future__ import annotations

import ast
import io
import pickle
import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from trainer import torch_private
from trainer.torch_private import HOOKS, OFF_ENV, TESTED

HOME = REPO / "trainer" / "torch_private"
"""The one home of private torch names: the package (its hooks and what is in force)."""
SOURCES = [
    p for d in ("airflow_dtrain", "trainer", "dags", "benchmarks") for p in sorted((REPO / d).rglob("*.py"))
]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "torch" and (any(_private(p) for p in parts) or parts[:2] == ["torch", "testing"])


def _torch_identifiers() -> set[str]:
    """Every ``_``-prefixed identifier in the installed torch's Python source."""
    import torch

    found: set[str] = set()
    for path in Path(torch.__file__).parent.rglob("*.py"):
        found.update(re.findall(r"\b(_[A-Za-z0-9]\w*)\b", path.read_text(errors="ignore")))
    return found


def _our_names(trees: dict[Path, ast.AST]) -> set[str]:
    """Every name our own code defines or assigns: a private attribute it reads may be its own."""
    names: set[str] = set()
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names.add(n.attr)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
            elif isinstance(n, ast.keyword) and n.arg:
                names.add(n.arg)
    return names


NOT_TORCH = {"_exit": "os._exit", "_parent": "fsspec's AbstractFileSystem._parent", "_s": "field suffixes"}
"""Private names that torch's source also spells but that the code here takes from elsewhere."""


def private_torch_uses(path: Path, torch_names: set[str], ours: set[str], tree: ast.AST) -> list[str]:
    """``line: what`` of each private torch name ``path`` uses: an import of a private torch module or name,
    a private attribute of a name bound to torch, a private attribute (or ``getattr`` string) that only
    torch defines, a dotted private torch module named in a string."""
    bound: set[str] = set()  # names bound to torch's modules, classes and functions in this file
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names if a.name.split(".")[0] == "torch"}
        elif isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch":
            bound |= {a.asname or a.name for a in n.names}
    found = []
    for n in ast.walk(tree):
        what = None
        if isinstance(n, ast.Import):
            what = next((a.name for a in n.names if _private_module(a.name)), None)
        elif isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch":
            if _private_module(n.module) or any(_private(a.name) for a in n.names):
                what = f"from {n.module} import {', '.join(a.name for a in n.names)}"
        elif isinstance(n, ast.Attribute) and _private(n.attr):
            base = n.value
            while isinstance(base, ast.Attribute):
                base = base.value
            on_torch = isinstance(base, ast.Name) and base.id in bound
            only_torch = n.attr in torch_names and n.attr not in ours and n.attr not in NOT_TORCH
            if on_torch or only_torch:
                what = f".{n.attr}"
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            value = n.value
            if re.fullmatch(r"torch(\.\w+)+", value) and _private_module(value):
                what = repr(value)
            elif re.fullmatch(r"_\w+", value) and _private(value) and value in torch_names:
                if value not in ours and value not in NOT_TORCH:
                    what = repr(value)
        if what:
            found.append(f"{path.relative_to(REPO)}:{n.lineno}: {what}")
    return found


@pytest.fixture(scope="module")
def scan():
    trees = {p: ast.parse(p.read_text()) for p in SOURCES}
    return trees, _torch_identifiers(), _our_names(trees)


def test_no_private_torch_name_is_used_outside_trainer_torch_private(scan):
    trees, torch_names, ours = scan
    found = [
        use
        for path, tree in trees.items() if not path.is_relative_to(HOME)
        for use in private_torch_uses(path, torch_names, ours, tree)
    ]  # fmt: skip
    assert not found, "private torch names outside trainer/torch_private/:\n" + "\n".join(found)


def test_the_scan_finds_a_private_torch_name_where_one_is_written(scan, tmp_path):
    """The test above can fail: each way of reaching a private name is found."""
    _, torch_names, ours = scan
    path = REPO / "trainer" / "example_not_a_module.py"
    source = """
import torch
import torch.testing._internal.distributed.fake_pg
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousJoinOp
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
torch.serialization._get_layout
SimpleElasticAgent._rendezvous
handler._state_holder
getattr(handler, "_op_executor", None)
MODULE = "torch.distributed.tensor._redistribute"
"""
    found = private_torch_uses(path, torch_names, ours, ast.parse(source))
    lines = sorted(int(line.split(": ", 1)[0].rsplit(":", 1)[1]) for line in found)
    assert lines == [3, 4, 6, 7, 8, 9, 10], found  # line 5 imports a public class


def test_every_hook_has_a_reason_a_fallback_and_the_tested_releases():
    for name, hook in HOOKS.items():
        assert hook.name == name
        assert len(hook.reason) > 20 and len(hook.fallback) > 20, hook
        assert set(TESTED) <= set(hook.checked_on), hook


def test_every_hook_the_code_asks_for_is_declared():
    asked = set()
    for path in SOURCES:
        if path.is_relative_to(HOME):
            asked |= set(re.findall(r"""(?:use|fall_back|why_off)\(\s*["'](\w+)["']""", path.read_text()))
        asked |= set(
            re.findall(r"""torch_private\.(?:use|fall_back|why_off)\(\s*["'](\w+)["']""", path.read_text())
        )
    assert asked and asked <= set(HOOKS), sorted(asked - set(HOOKS))
    assert set(HOOKS) <= asked, f"hooks never asked for: {sorted(set(HOOKS) - asked)}"


def test_every_private_name_a_hook_declares_is_in_this_torch(monkeypatch):
    """On the tested releases (make test, make test-torch-min) every hook is in force: a torch that moved a
    name fails here first, naming it, before any user meets the fallback."""
    monkeypatch.setattr(torch_private, "_taken", {})  # what another test's hooks failed on, in this process
    missing = {name: torch_private.why_off(name, {}) for name in HOOKS if torch_private.why_off(name, {})}
    assert not missing, missing
    assert torch_private.fallbacks_in_force({}) == {}


def test_a_hook_forced_off_is_named_with_its_fallback_and_an_unknown_one_is_refused():
    off = torch_private.fallbacks_in_force({OFF_ENV: "rdzv_close_round,dynamo_graph_counter"})
    assert set(off) == {"rdzv_close_round", "dynamo_graph_counter"}
    assert "wait their last call" in off["rdzv_close_round"] and OFF_ENV in off["rdzv_close_round"]
    assert set(torch_private.fallbacks_in_force({OFF_ENV: "all"})) == set(HOOKS)
    line = torch_private.startup_line({OFF_ENV: "rdzv_close_round"})
    assert line.startswith("torch 2.") and "fallbacks in force: rdzv_close_round: rendezvous rounds" in line
    with pytest.raises(ValueError, match=rf"{OFF_ENV}='rdzv_close_rounds'.*no hook rdzv_close_rounds"):
        torch_private.fallbacks_in_force({OFF_ENV: "rdzv_close_rounds"})


def test_a_torch_newer_than_the_newest_tested_is_said():
    newest = TESTED[1].split(".")
    assert not torch_private.newer_than_tested(TESTED[1] + ".1")
    assert torch_private.newer_than_tested(f"{newest[0]}.{int(newest[1]) + 1}.0")


def test_with_the_metadata_globals_off_dcp_metadata_still_loads_and_a_forged_global_is_refused(monkeypatch):
    """dcp_metadata_globals' fallback: DCP's own plain dataclasses and enums, and layouts by their public
    names, but never a global of the file's choosing."""
    import torch
    from torch.distributed.checkpoint import metadata as dcp_metadata

    from trainer.checkpoint import safe_pickle

    monkeypatch.setenv(OFF_ENV, "dcp_metadata_globals")
    stripped = {k: v for k, v in safe_pickle.ALLOWED.items() if _private(k[1])}
    assert stripped, "the allowlist holds DCP's private globals while the hook is in force"
    monkeypatch.setattr(
        safe_pickle, "ALLOWED", {k: v for k, v in safe_pickle.ALLOWED.items() if k not in stripped}
    )
    props = dcp_metadata.TensorProperties(dtype=torch.float32, layout=torch.strided)
    meta = dcp_metadata.Metadata(
        state_dict_metadata={"w": dcp_metadata.TensorStorageMetadata(props, torch.Size([2]), [])},
        storage_data={dcp_metadata.MetadataIndex("w"): torch_private.resolve(next(iter(
            s for s in HOOKS["dcp_metadata_globals"].names if "filesystem" in s)))("f", 0, 8)},
    )  # fmt: skip
    loaded = safe_pickle.load_metadata(io.BytesIO(pickle.dumps(meta)), "m")
    assert loaded.state_dict_metadata["w"].properties.layout is torch.strided
    assert next(iter(loaded.storage_data.values())).length == 8

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(safe_pickle.UnsafeCheckpoint, match="builtins.print"):
        safe_pickle.load_metadata(io.BytesIO(pickle.dumps(Evil())), "evil")
