"""A node's ranks share one log: each line the trainer writes to stderr reaches it whole
(trainer/base/say.py).

``print(..., file=sys.stderr)`` writes the text and its newline apart, and two ranks' lines came out merged
(``... backend gloo[trainer] rank 0/2 ...``)."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import REPO
from trainer.base import say as say_module

RANK = """
import sys
from trainer.base.say import say
for i in range(400):
    say(f"[trainer] rank {sys.argv[1]} line {i} " + "x" * 100)
"""


class _Writes:
    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_say_writes_the_line_and_its_newline_at_once(monkeypatch):
    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    say_module.say("[trainer] rank 1/2 (local rank 1), backend gloo")
    assert stderr.writes == ["[trainer] rank 1/2 (local rank 1), backend gloo\n"]


def test_two_ranks_saying_at_once_into_one_log_leave_every_line_whole(tmp_path):
    log = tmp_path / "node.log"
    with open(log, "ab") as shared:  # as a node's ranks share their agent's log: one file, appended
        ranks = [
            subprocess.Popen([sys.executable, "-u", "-c", RANK, str(r)], cwd=REPO, stderr=shared)
            for r in (0, 1)
        ]
        assert [p.wait(timeout=60) for p in ranks] == [0, 0]
    lines = log.read_text().splitlines()
    assert len(lines) == 800
    expected = {f"[trainer] rank {r} line {i} " + "x" * 100 for r in (0, 1) for i in range(400)}
    assert set(lines) == expected


def test_no_trainer_module_prints_to_stderr():
    """Every stderr line of the trainer goes through say (or, in the self-contained contract, one write)."""
    found = []
    for path in sorted((REPO / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                if any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr" for k in node.keywords):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, (
        f"print(..., file=sys.stderr) writes a line in two writes; use trainer.base.say: {found}"
    )
