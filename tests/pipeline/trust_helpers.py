"""What a refusal must leave as it was: every file under a directory, with its bytes' hash."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root`` (directories: "dir"), to compare."""
    out: dict[str, str] = {}
    for path in sorted(Path(root).rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out
