"""What each process of a group runs: the bundled trainer, another of its modules, or a program of your
own."""

from __future__ import annotations

import re
from typing import Any

from airflow_dtrain.errors import SpecError

TRAINER_MODULE = re.compile(r"trainer(\.[a-z_][a-z0-9_]*)*")
"""The bundled trainer package and its modules (``trainer``, ``trainer.evaluate``)."""
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_ENTRYPOINT_FORMS = (
    "a Python script (['train.py', ...]), '-m' and a module (['-m', 'my_pkg.train', ...]) or a "
    "module of the bundled trainer"
)


def parse_entrypoint(value: Any) -> tuple[str, ...]:
    """An ``entrypoint`` as the spec keeps it; ``SpecError`` naming the field and the value for anything else.

    * ``()`` (or ``None``, ``["trainer"]``): the bundled trainer with the job's config;
    * ``("trainer.evaluate", arg, ...)``: another module of the bundled trainer (also spelled ``-m
    trainer.x``);
    * ``("-m", "my_pkg.train", arg, ...)`` or ``("path/to/train.py", arg, ...)``: your own program.

    A single string is a program without arguments (``"train.py"``); arguments are separate strings.
    """
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return ()
    if isinstance(value, str):
        if value != value.strip() or len(value.split()) > 1:
            raise SpecError(
                f"entrypoint: {value!r} holds spaces: give the program and its arguments as a list, "
                "e.g. ['train.py', '--lr', '3e-4'] (no shell ever sees it)"
            )
        value = (value,)
    if not isinstance(value, (list, tuple)):
        raise SpecError(
            f"entrypoint: expected a list of strings such as ['train.py', '--lr', '3e-4'], got {value!r}"
        )
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise SpecError(f"entrypoint[{i}]: expected a string, got {arg!r} (entrypoint {list(value)!r})")
        if "{{" in arg or "{%" in arg:
            raise SpecError(f"entrypoint[{i}]: {arg!r} is a template: the program is set in the DAG file (an "
                            "operator argument, never rendered from a run's params or conf)")  # fmt: skip
        if "\0" in arg:
            raise SpecError(f"entrypoint[{i}]: holds a NUL character, got {arg!r}")
    head, args = value[0], tuple(value[1:])
    if head == "-m":
        if not args or not _MODULE.fullmatch(args[0]):
            raise SpecError(
                f"entrypoint: '-m' must be followed by a module name such as 'my_pkg.train', "
                f"got {list(value)!r}"
            )
        if not TRAINER_MODULE.fullmatch(args[0]):
            return ("-m", *args)
        head, args = args[0], args[1:]  # the bundled trainer, spelled with -m
    if TRAINER_MODULE.fullmatch(head):
        return () if head == "trainer" and not args else (head, *args)
    if head.endswith(".py") and head.strip() == head and len(head) > len(".py") and not head.startswith("-"):
        return (head, *args)
    raise SpecError(f"entrypoint: {head!r} is not {_ENTRYPOINT_FORMS} (entrypoint {list(value)!r})")
