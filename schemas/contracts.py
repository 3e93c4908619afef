"""Input contracts: the columns and types a task needs, checked on the schema before any compute."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    ByteType,
    DataType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

__all__ = ["InputContractError", "TextInputContract"]

_ID_TYPES = (StringType, LongType, IntegerType, ShortType, ByteType, DecimalType)


class InputContractError(ValueError):
    """The input does not have the columns or types the task needs."""


@dataclass(frozen=True)
class TextInputContract:
    """A text task's input: an id column (string, integer or decimal) and a string text column."""

    id_col: str
    text_col: str

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or ill-typed column.

        Column names match exactly (case-sensitive), as Delta writes them.
        """
        fields = {f.name: f.dataType for f in schema.fields}
        for role, name in (("id column", self.id_col), ("text column", self.text_col)):
            if name not in fields:
                raise InputContractError(
                    f"{role} {name!r} not found in {source}; available columns: {', '.join(fields) or '(none)'}"
                )
        _require(fields[self.id_col], _ID_TYPES, f"id column {self.id_col!r} in {source}", "string, integer or decimal")
        _require(fields[self.text_col], (StringType,), f"text column {self.text_col!r} in {source}", "string")


def _require(found: DataType, allowed: tuple[type, ...], what: str, expected: str) -> None:
    if not isinstance(found, allowed):
        raise InputContractError(f"{what} has type {found.simpleString()}; expected {expected}")
