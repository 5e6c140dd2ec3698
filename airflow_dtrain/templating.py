"""What can be validated when a DAG is parsed, and what only once it is rendered."""

from __future__ import annotations

from typing import Any


def is_template(value: Any) -> bool:
    """True for a value that only takes its real form at run time: Jinja, or a lazy Airflow value."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(is_template(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(is_template(v) for v in value)
    # XComArg, MappedArgument and other lazy values resolve at run time
    return type(value).__module__.startswith("airflow.")
