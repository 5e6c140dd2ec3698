"""Declarative fields: one definition of every setting, from which everything else is derived.

A config section is a frozen dataclass whose fields are made with ``setting(...)``: the
default, a help text, a title, bounds, choices, the operator argument / trigger-form name
and the form section. From that one definition come

* validation (``check``): the type and the bounds, with messages that name the dotted
  field and the value (``checkpoint.keep: must be >= 1, got 0``);
* the JSON Schema of a field (``json_schema``), from which the provider builds the DAG's
  trigger-form ``Param`` objects;
* the trainer's command line (``add_arguments``): ``--checkpoint-every`` and friends;
* the README's reference table (``airflow_dtrain.params.markdown_table``).

Standard library only: the trainer, and the provider at DAG-parse time, import it.
Cross-field rules (a batch that must divide, a step that must lie before ``steps``) stay in
each section's ``__post_init__``, after ``check``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any


class ConfigError(ValueError):
    """An invalid job configuration. The message always names the dotted field and the bad value."""


@dataclass(frozen=True)
class Setting:
    """What a field means and which values it takes (kept in the dataclass field's metadata)."""

    help: str
    title: str | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    pattern: str | None = None
    """A regular expression a string value must match (``fullmatch``); also the form's pattern."""
    rule: str | None = None
    """The words of a bound's error message, when the generated ones would read badly."""
    arg: str | None = None
    """The flat name of the field as an operator argument and a trigger-form param (``flavor``
    for ``model.flavor``); None: only reachable by its dotted name."""
    section: str | None = None
    """The trigger-form section it is shown in; None: not on the form."""
    cli: bool = True
    """Offered as a flag of ``python -m trainer``."""


_KEY = "dtrain"


def setting(default: Any = MISSING, *, factory: Any = MISSING, help: str, **meta: Any) -> Any:
    """A dataclass field with a ``Setting``: ``steps: int = setting(50, help="...", ge=1, arg="steps")``."""
    return dataclasses.field(
        default=default, default_factory=factory, metadata={_KEY: Setting(help=help, **meta)}
    )


def meta(f: dataclasses.Field) -> Setting:
    """The ``Setting`` of a field (a bare one for fields made without ``setting``)."""
    return f.metadata.get(_KEY) or Setting(help="")


def title_of(f: dataclasses.Field) -> str:
    m = meta(f)
    return m.title or (m.arg or f.name).replace("_", " ").capitalize()


def _hints(klass: type) -> dict[str, Any]:
    return typing.get_type_hints(klass)


def field_types(klass: type) -> dict[str, Any]:
    """Field name -> its resolved type (string annotations evaluated)."""
    hints = _hints(klass)
    return {f.name: hints[f.name] for f in dataclasses.fields(klass)}


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the inner type, whether None is allowed) for ``X | None``."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def nullable(tp: Any) -> bool:
    """Whether a field of type ``tp`` takes None (``X | None``)."""
    return _optional(tp)[1]


def _bound_rule(m: Setting, integer: bool) -> str | None:
    if m.rule:
        return m.rule
    low = f"[{m.ge:g}" if m.ge is not None else f"({m.gt:g}" if m.gt is not None else None
    high = f"{m.le:g}]" if m.le is not None else f"{m.lt:g})" if m.lt is not None else None
    if low and high:
        if integer and m.ge is not None and m.le is not None:
            return f"must be in {m.ge:g}..{m.le:g}"
        return f"must be in {low}, {high}"
    if m.ge is not None:
        return f"must be >= {m.ge:g}"
    if m.gt is not None:
        return f"must be > {m.gt:g}"
    if m.le is not None:
        return f"must be <= {m.le:g}"
    if m.lt is not None:
        return f"must be < {m.lt:g}"
    return None


def _in_bounds(m: Setting, value: float) -> bool:
    return not (
        (m.ge is not None and value < m.ge)
        or (m.gt is not None and value <= m.gt)
        or (m.le is not None and value > m.le)
        or (m.lt is not None and value >= m.lt)
    )


def check(obj: Any, section: str) -> None:
    """Validate every field of dataclass ``obj`` against its type and its ``Setting``.

    ints are accepted (and stored) as floats for float fields; bool is not an int here
    (``steps = true`` is a mistake, not 1 step); enum fields take their values' spellings.
    """
    types_ = field_types(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        where = f"{section}.{f.name}" if section else f.name
        checked = check_field(f, types_[f.name], value, where)
        if checked is not value:
            object.__setattr__(obj, f.name, checked)  # frozen: bypass to normalise 1 -> 1.0, "spot" -> enum


def check_field(f: dataclasses.Field, tp: Any, value: Any, where: str) -> Any:
    """``value`` validated by the declaration of field ``f`` (of type ``tp``); returns it normalised
    (an int as a float for a float field, a spelling as its enum member). Errors name ``where``."""
    tp, nullable = _optional(tp)
    if value is None and nullable:
        return value
    m = meta(f)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(
                f"{where}: choose from {', '.join(str(c.value) for c in tp)}, got {value!r}"
            ) from None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, tp):
            raise ConfigError(f"{where}: expected a {tp.__name__}, got {value!r}")
        return value
    value = _check_type(tp, value, where)
    if tp in (int, float) and not _in_bounds(m, value):
        raise ConfigError(f"{where}: {_bound_rule(m, tp is int)}, got {value!r}")
    if m.choices is not None and value not in m.choices:
        noun = m.rule or "value"  # for choices, rule names what is chosen: "unknown flavour 'tiny'"
        raise ConfigError(f"{where}: unknown {noun} {value!r} (choose from {', '.join(map(str, m.choices))})")
    if m.pattern is not None and isinstance(value, str) and not re.fullmatch(m.pattern, value):
        raise ConfigError(f"{where}: {m.rule or 'does not match ' + m.pattern}, got {value!r}")
    return value


def _check_type(tp: Any, value: Any, where: str) -> Any:
    """``value`` as a scalar field of type ``tp`` takes it (an int as a float), or a ConfigError."""
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: must be finite, got {value!r}")
        return float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
    elif tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def declared(klass: type, name: str) -> dataclasses.Field:
    """The field ``name`` of dataclass ``klass`` (its declaration)."""
    for f in dataclasses.fields(klass):
        if f.name == name:
            return f
    raise KeyError(f"{klass.__name__} has no field {name!r}")


def check_value(klass: type, name: str, value: Any, where: str | None = None) -> Any:
    """One value (a string as a template renders it, coerced first) validated by the declaration of
    ``klass``'s field ``name``: the same rule and message wherever that input is taken."""
    where = where or name
    tp = field_types(klass)[name]
    return check_field(declared(klass, name), tp, coerce(where, tp, value), where)


_KEEP: Any = object()


def borrow(klass: type, name: str, default: Any = _KEEP, **changes: Any) -> Any:
    """A field of another dataclass that takes the same input as ``klass``'s field ``name``: its
    declaration (help, bounds, rule) and default, so the input is declared once. ``default``: a
    different default (e.g. a required one); ``changes``: other ``Setting`` attributes (``help=``)."""
    f = declared(klass, name)
    m = dataclasses.replace(meta(f), arg=None, section=None, **changes)
    if default is _KEEP and f.default is MISSING and f.default_factory is not MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata={_KEY: m})
    return dataclasses.field(default=f.default if default is _KEEP else default, metadata={_KEY: m})


REQUIRED: Any = MISSING
"""``borrow(..., default=REQUIRED)``: a field that has no default where it is borrowed."""


def coerce(key: str, tp: Any, value: Any) -> Any:
    """A string from a command line or a rendered template as the field's type ("10" -> 10)."""
    tp, nullable = _optional(tp)
    if not isinstance(value, str) or tp is str:
        return value
    text = value.strip()
    if nullable and text in ("", "None", "null"):
        return None
    try:
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return value
        if tp is int:
            return int(text)
        if tp is float:
            return float(text)
        if tp is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
    except ValueError:
        kind = {int: "an integer", float: "a number", bool: "true or false"}[tp]
        raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
    return value


def json_schema(f: dataclasses.Field, tp: Any) -> dict[str, Any]:
    """The JSON Schema of one field (what a trigger-form ``Param`` checks)."""
    m = meta(f)
    inner, nullable = _optional(tp)
    schema: dict[str, Any] = {}
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        schema["type"] = "string"
        schema["enum"] = [c.value for c in inner]
    else:
        origin = typing.get_origin(inner) or inner
        schema["type"] = {int: "integer", float: "number", str: "string", bool: "boolean",
                          tuple: "array", list: "array", dict: "object"}.get(origin, "object")  # fmt: skip
        if schema["type"] == "array":
            args = typing.get_args(inner)
            item = {str: "string", float: "number", int: "integer"}.get(args[0]) if args else None
            if item:
                schema["items"] = {"type": item}
                if item in ("number", "integer") and (m.gt is not None or m.ge is not None):
                    schema["items"].update(
                        {"exclusiveMinimum": m.gt} if m.gt is not None else {"minimum": m.ge}
                    )
                schema["minItems"] = 1 if item != "string" else 0
    if m.choices is not None:
        schema["enum"] = list(m.choices)
    for key, name in (
        ("ge", "minimum"),
        ("gt", "exclusiveMinimum"),
        ("le", "maximum"),
        ("lt", "exclusiveMaximum"),
    ):
        if getattr(m, key) is not None and schema["type"] in ("integer", "number"):
            schema[name] = getattr(m, key)
    if m.pattern is not None:
        schema["pattern"] = m.pattern if m.pattern.startswith("^") else f"^(?:{m.pattern})$"
    if nullable:
        schema["type"] = ["null", schema["type"]]
        if "enum" in schema:
            schema["enum"] = [None, *schema["enum"]]
    return schema


def walk(klass: type, prefix: str = "") -> typing.Iterator[tuple[str, dataclasses.Field, Any]]:
    """Every leaf field of a nested config: (dotted name, field, type), in definition order."""
    for name, tp in field_types(klass).items():
        f = next(x for x in dataclasses.fields(klass) if x.name == name)
        if dataclasses.is_dataclass(tp):
            yield from walk(tp, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", f, tp


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"dotted.name": value}``."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def add_arguments(parser: Any, klass: type) -> dict[str, str]:
    """Add ``--dotted-name`` flags (and ``--arg`` aliases) for every leaf field of ``klass`` to an
    argparse parser; returns {argparse dest: dotted name}. Values stay strings: ``coerce`` types them."""
    dests: dict[str, str] = {}
    seen: set[str] = set()
    for dotted, f, tp in walk(klass):
        m = meta(f)
        if not m.cli:
            continue
        flags = [f"--{dotted.replace('.', '-').replace('_', '-')}"]
        if m.arg and m.arg != dotted:
            alias = f"--{m.arg.replace('_', '-')}"
            if alias not in flags and alias not in seen:
                flags.append(alias)
        flags = [flag for flag in flags if flag not in seen]
        seen.update(flags)
        dest = "field__" + dotted.replace(".", "__")
        choices = f" ({' | '.join(map(str, m.choices))})" if m.choices else ""
        parser.add_argument(*flags, dest=dest, metavar=_metavar(tp), help=f"{m.help}{choices}")
        dests[dest] = dotted
    return dests


def _metavar(tp: Any) -> str:
    inner, _ = _optional(tp)
    return {int: "N", float: "X", bool: "true|false"}.get(inner, "VALUE")
