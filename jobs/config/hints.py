"""Reading the schema's type hints: a field's type without ``Optional`` and validators, its choices and bounds, in
words. What messages, flags and the reference say a setting takes."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def is_section(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, BaseModel)


def unwrapped(hint: Any) -> tuple[Any, list]:
    """``hint`` without ``Optional`` and ``Annotated``, and the constraints those carried."""
    metadata: list = []
    while True:
        if typing.get_origin(hint) is Annotated:
            hint, *extra = typing.get_args(hint)
            metadata += [m for x in extra for m in (x.metadata if isinstance(x, FieldInfo) else [x])]
        elif typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(args) != 1:
                return hint, metadata
            hint = args[0]
        else:
            return hint, metadata


def choices_of(hint: Any) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def bounds_text(metadata: list) -> str:
    bound = {name: getattr(m, name) for m in metadata for name in ("ge", "gt", "le") if hasattr(m, name)}
    if "ge" in bound and "le" in bound:
        return f"between {bound['ge']:g} and {bound['le']:g}"
    return ", ".join(
        f"{symbol} {bound[name]:g}" for name, symbol in (("ge", ">="), ("gt", ">"), ("le", "<=")) if name in bound
    )


def type_text(hint: Any, bounds: str = "") -> str:
    if choices_of(hint):
        return "one of " + ", ".join(f"`{choice}`" for choice in choices_of(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict:
        value, metadata = unwrapped(args[1])
        return f"mapping: name → {type_text(value, bounds_text(metadata))}"
    if origin is tuple:
        return f"list of {type_text(unwrapped(args[0])[0])}s"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(unwrapped(arg)[0]) for arg in args if arg is not type(None))
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return " ".join(filter(None, [names.get(hint, getattr(hint, "__name__", str(hint))), bounds]))
