"""What can be validated when a DAG is parsed, and what only once it is rendered."""

from __future__ import annotations

import re
from typing import Any

from airflow_dtrain.errors import SpecError


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


_RUN_INPUTS = re.compile(r"\b(params|dag_run|conf)\b")


def check_author_template(name: str, value: Any) -> None:
    """Refuse a template in a DAG author's privileged setting (``name``) that reads what a run is
    given (``params``, ``dag_run.conf``): a trigger may not reach those settings that way. Other
    templates (``var.value``, macros) are the author's and stay allowed."""
    if isinstance(value, str):
        if is_template(value) and _RUN_INPUTS.search(value):
            raise SpecError(
                f"{name}: a template here may not read params or dag_run (what a trigger sets); "
                f"a run chooses within these settings through kubernetes_overrides, got {value!r}"
            )
    elif isinstance(value, dict):
        for v in value.values():
            check_author_template(name, v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_author_template(name, v)
    elif is_template(value):  # an XComArg or mapped value: what a run computes
        raise SpecError(
            f"{name}: must be written in the DAG, not computed by a run (got {type(value).__name__})"
        )
