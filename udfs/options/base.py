"""What the config schema's sections are built from: the base section, the value types YAML, ``--set``, flags and the
Python API hand each kind of setting, and :class:`ConfigError`.

It lives in ``udfs`` because the executors' settings objects (:class:`~lakescore.udfs.options.model.ModelOptions`,
:class:`~lakescore.udfs.options.generate.GenerateOptions`) are sections of the schema
(:mod:`lakescore.jobs.config`), declared once on this side of the driver/executor line.
"""

from __future__ import annotations

import typing
from datetime import date
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

__all__ = [
    "ConfigError",
    "Section",
    "Text",
    "Number",
    "Fraction",
    "Strings",
    "invalid",
    "checked",
    "cli",
    "JOB_ONLY",
    "as_text",
    "as_number",
]


class ConfigError(ValueError):
    """A configuration file, override or flag is missing, unknown or ill-typed."""


class Section(BaseModel):
    """A section of the config schema: frozen (hashable, picklable: the executors' sections cross to them), unknown
    keys refused, each field's docstring its description."""

    # Strict: a string is not an integer, 1 is not true; the Before validators below accept what YAML means.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)


def invalid(reason: str) -> PydanticCustomError:
    """A value's own check failing; the message reads ``<dotted key> <reason>``."""
    return PydanticCustomError("lakescore", "{reason}", {"reason": reason})


def as_text(value: Any) -> Any:
    """A value YAML read as a date or a number, as the text it was written as."""
    if isinstance(value, date):  # YAML reads 2026-11-20 as a date
        return value.isoformat()
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # revision: 2
        return str(value)
    return value


def as_number(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _strings(value: Any) -> Any:
    if isinstance(value, str):  # the config reads a comma list at its boundary; here one string is a mistake
        raise invalid(f"must be a list of strings, got {value!r}")
    return tuple(value) if isinstance(value, list) else value


def checked(check: typing.Callable[[Any], str | None]) -> AfterValidator:
    """A value check: ``check(value)`` returns why the value is wrong, or ``None``."""

    def validate(value: Any) -> Any:
        reason = None if value is None else check(value)
        if reason:
            raise invalid(reason)
        return value

    return AfterValidator(validate)


Text = Annotated[str, BeforeValidator(as_text)]
Number = Annotated[float, BeforeValidator(as_number)]
Fraction = Annotated[Number, Field(ge=0, le=1)]
Strings = Annotated[tuple[Text, ...], BeforeValidator(_strings)]
"""A list of strings, kept as a tuple."""


def cli(flag: str, metavar: str | None = None, sweep: bool = False, repeat: bool = False) -> dict[str, Any]:
    """``json_schema_extra`` of a field that has a command-line flag: ``lakescore score`` takes every such flag,
    ``lakescore sweep`` those marked ``sweep``; a ``repeat`` flag (a list setting) adds one item each time it is
    given."""
    return {
        "flag": flag,
        "sweep": sweep,
        **({"metavar": metavar} if metavar else {}),
        **({"repeat": True} if repeat else {}),
    }


JOB_ONLY = {"job_only": True}
"""``json_schema_extra`` of a setting only the scoring job applies (``transform`` / ``pandas_udf`` refuse it)."""
