"""The provider's validation error, and the one integer check its hand-written rules share."""

from __future__ import annotations

from typing import Any

from trainer.config.fields import ConfigError


class SpecError(ConfigError):
    """A job spec is invalid. The message names the field and the value.

    A ``ConfigError`` (the trainer's): whoever catches a bad config catches both.
    """


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` (or its string form, as a template renders it) as an int >= ``minimum``."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


def checked(build, *args: Any, **kwargs: Any) -> Any:
    """Call ``build``, turning the trainer's ConfigError into a SpecError (same message)."""
    try:
        return build(*args, **kwargs)
    except SpecError:
        raise
    except ConfigError as err:
        raise SpecError(str(err)) from None
