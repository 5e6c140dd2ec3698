"""An operator's or a sensor's inputs: declared once, as a ``setting()`` dataclass, and validated once.

The inputs an operator shares with the job (``budget_usd``, ``num_nodes``, the steps) are ``borrow``-ed from
their declaration in ``trainer.config.job_config`` / ``airflow_dtrain.job.spec``: the same help, bounds and
error messages; its own (prices, estimates) are declared in its module. From that one dataclass come the
operator's keyword arguments (``parameters``: its ``__init__`` signature, by which Airflow applies
``default_args``), its ``:param`` docs (``param_doc``), the check of what is known when the DAG is parsed
(``check_given``: every value that is not a template) and, once the templates have rendered, the inputs
themselves (``build``).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from trainer.config.fields import ConfigError, check_value, coerce, field_types, meta, nullable

from airflow_dtrain.errors import SpecError
from airflow_dtrain.templating import is_template


def names(klass: type) -> tuple[str, ...]:
    """The inputs' names, in declaration order (every one templated)."""
    return tuple(f.name for f in dataclasses.fields(klass))


def parameters(klass: type) -> list[inspect.Parameter]:
    """Keyword-only parameters of the inputs, with their declared defaults (none: required)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    out = []
    for f in dataclasses.fields(klass):
        default = f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
        out.append(inspect.Parameter(f.name, keyword, default=default))
    return out


def param_doc(klass: type) -> str:
    """The ``:param`` lines of the inputs, from their help texts."""
    return "\n".join(f":param {f.name}: {meta(f).help} (templated)" for f in dataclasses.fields(klass))


def _unset(klass: type, name: str, value: Any) -> bool:
    """An empty value (None, or a template that rendered nothing) for an input that cannot be None: its
    declared default then."""
    f = next(f for f in dataclasses.fields(klass) if f.name == name)
    tp = field_types(klass)[name]
    empty = value is None or (isinstance(value, str) and value.strip() in ("", "None", "null"))
    return empty and not nullable(tp) and f.default is not dataclasses.MISSING


def check_given(klass: type, values: dict[str, Any], where: str) -> None:
    """When the DAG is parsed: every value that is not a template, by its declaration (a ``SpecError``
    prefixed with ``where``, e.g. ``BudgetBranchOperator(task_id='budget')``)."""
    for name, value in values.items():
        if is_template(value) or _unset(klass, name, value):
            continue
        try:
            check_value(klass, name, value)
        except ConfigError as err:
            raise SpecError(f"{where}: {err}") from None


def build(klass: type, values: dict[str, Any], where: str) -> Any:
    """After the templates rendered: the inputs as ``klass``, each coerced and validated once."""
    types_ = field_types(klass)
    try:
        kwargs = {
            name: coerce(name, types_[name], value)
            for name, value in values.items()
            if not _unset(klass, name, value)
        }
        return klass(**kwargs)
    except ConfigError as err:
        raise SpecError(f"{where}: {err}") from None
