"""Input contracts: the columns and types a task needs, checked on the schema before any compute."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Optional, Sequence

from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DateType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

__all__ = ["PROMPT_COLUMN", "InputContractError", "TextInputContract", "PromptInputContract", "FeatureInputContract", "resolve_feature_cols"]

_ID_TYPES = (StringType, LongType, IntegerType, ShortType, ByteType, DecimalType)
_NUMERIC_TYPES = (DoubleType, FloatType, LongType, IntegerType, ShortType, ByteType, DecimalType)
_PROMPT_VALUE_TYPES = (StringType, BooleanType, DateType, TimestampType, TimestampNTZType, *_NUMERIC_TYPES)
"""What a prompt template may insert: values with one obvious text form (Spark's cast to string)."""


PROMPT_COLUMN = "_lakescore_prompt"
"""The column a prompted task's rendered prompt is added to the input as (never written to the output)."""


class InputContractError(ValueError):
    """The input does not have the columns or types the task needs."""


@dataclass(frozen=True)
class TextInputContract:
    """A text task's input: an id column (string, integer or decimal; ``None``: none needed) and a string text column."""

    id_col: Optional[str]
    text_col: str

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or ill-typed column.

        Column names match exactly (case-sensitive), as Delta writes them.
        """
        fields = _fields_present(schema, source, [("id column", self.id_col), ("text column", self.text_col)])
        if self.id_col is not None:
            _require(fields[self.id_col], _ID_TYPES, f"id column {self.id_col!r} in {source}", "string, integer or decimal")
        _require(fields[self.text_col], (StringType,), f"text column {self.text_col!r} in {source}", "string")


@dataclass(frozen=True)
class PromptInputContract:
    """A prompted task's input: an id column and the columns its prompt template names (strings, numbers, booleans,
    dates or timestamps, inserted as Spark casts them to a string)."""

    id_col: Optional[str]
    template_cols: tuple[str, ...]

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or ill-typed column."""
        named = [("id column", self.id_col)] + [("prompt_template column", c) for c in self.template_cols]
        fields = _fields_present(schema, source, named)
        if self.id_col is not None:
            _require(fields[self.id_col], _ID_TYPES, f"id column {self.id_col!r} in {source}", "string, integer or decimal")
        for name in self.template_cols:
            _require(fields[name], _PROMPT_VALUE_TYPES, f"prompt_template column {name!r} in {source}",
                     "a string, number, boolean, date or timestamp")


def resolve_feature_cols(schema: StructType, cols: Sequence[str], prefix: Optional[str], source: str) -> tuple[str, ...]:
    """The feature columns of a tabular task: ``cols`` as named, else every column starting with ``prefix``
    (in the input's column order). Raises :class:`InputContractError` when none is named or found."""
    if cols:
        return tuple(cols)
    if prefix:
        found = tuple(f.name for f in schema.fields if f.name.startswith(prefix))
        if not found:
            raise InputContractError(
                f"no column of {source} starts with feature prefix {prefix!r}; "
                f"available columns: {', '.join(schema.names) or '(none)'}"
            )
        return found
    raise InputContractError("the tabular task needs feature_cols (--feature-cols) or feature_prefix (--feature-prefix)")


@dataclass(frozen=True)
class FeatureInputContract:
    """A tabular task's input: an id column and numeric feature columns."""

    id_col: Optional[str]
    feature_cols: tuple[str, ...]

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or non-numeric column."""
        fields = _fields_present(schema, source, [("id column", self.id_col)] + [("feature column", c) for c in self.feature_cols])
        if self.id_col is not None:
            _require(fields[self.id_col], _ID_TYPES, f"id column {self.id_col!r} in {source}", "string, integer or decimal")
        for name in self.feature_cols:
            _require(fields[name], _NUMERIC_TYPES, f"feature column {name!r} in {source}", "a number (double, float, integer or decimal)")
        if self.id_col in self.feature_cols:
            raise InputContractError(f"id column {self.id_col!r} is also listed as a feature column")


def _fields_present(schema: StructType, source: str, columns: list[tuple[str, Optional[str]]]) -> dict[str, DataType]:
    """The schema's fields by name, after checking every named ``(role, column)`` is there (``None``: not needed)."""
    fields = {f.name: f.dataType for f in schema.fields}
    for role, name in columns:
        if name is not None and name not in fields:
            raise InputContractError(f"{role} {name!r} not found in {source}; available columns: {', '.join(fields) or '(none)'}")
    return fields


def _require(found: DataType, allowed: tuple[type, ...], what: str, expected: str) -> None:
    if not isinstance(found, allowed):
        raise InputContractError(f"{what} has type {found.simpleString()}; expected {expected}")
