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


def as_user(monkeypatch, user: str) -> None:
    """Every dag.test() run from now on is triggered by ``user`` (Airflow's own run, its triggering user)."""
    from airflow.models import dagrun

    create = dagrun.get_or_create_dagrun

    def create_as_user(*args, **kwargs):
        return create(*args, **{**kwargs, "triggering_user_name": user})

    monkeypatch.setattr(dagrun, "get_or_create_dagrun", create_as_user)
