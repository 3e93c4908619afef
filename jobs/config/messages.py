"""A pydantic validation error as the one line an operator reads, naming the dotted key."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from lakescore.jobs.config.hints import bounds_text, choices_of, is_section
from lakescore.jobs.config.options import declared
from lakescore.udfs.options.base import ConfigError, as_number

_EXPECTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "tuple_type": "a list",
    "list_type": "a list",
}
"""Pydantic's type errors, as the message says what the key takes."""


def message(error: Mapping[str, Any]) -> str:
    """One pydantic validation error as one line naming the dotted key, the bad value and what is allowed."""
    loc, kind, value, context = error["loc"], error["type"], error["input"], error.get("ctx") or {}
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    if isinstance(context.get("error"), ConfigError):  # a check across settings: its message is whole
        return str(context["error"])
    if kind == "lakescore":
        return f"{key} {context['reason']}"
    if kind == "extra_forbidden":
        section, _ = declared(loc[:-1])
        known = list(section.model_fields) if is_section(section) else []
        prefix = key.rpartition(".")[0] + "." if "." in key else ""
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(sorted(known))}"
        return f"unknown config key '{key}'{hint}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{key or 'config'} must be a mapping, got {type(value).__name__}"
    if kind in _EXPECTED:
        return f"{key} must be {_EXPECTED[kind]}, got {value!r}"
    hint, metadata = declared(loc)
    if kind == "literal_error":
        return f"{key} must be one of {', '.join(map(str, choices_of(hint)))}, got {value!r}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "finite_number"):
        return f"{key} must be {bounds_text(metadata)}, got {as_number(value) if hint is float else value}"
    return f"{key}: {error['msg']}"
