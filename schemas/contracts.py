"""Input contracts: the columns and types a task needs, checked on the schema before any compute."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
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

from lakescore.schemas.id_columns import id_names

__all__ = [
    "PROMPT_COLUMN",
    "IMAGE_COLUMN",
    "FILE_COLUMN",
    "InputContractError",
    "TextInputContract",
    "ImageInputContract",
    "AudioInputContract",
    "PromptInputContract",
    "FeatureInputContract",
    "one_column_contract",
    "resolve_feature_cols",
    "id_names",
]

_ID_TYPES = (StringType, LongType, IntegerType, ShortType, ByteType, DecimalType)
_NUMERIC_TYPES = (DoubleType, FloatType, LongType, IntegerType, ShortType, ByteType, DecimalType)
_PROMPT_VALUE_TYPES = (StringType, BooleanType, DateType, TimestampType, TimestampNTZType, *_NUMERIC_TYPES)
"""What a prompt template may insert: values with one obvious text form (Spark's cast to string)."""


PROMPT_COLUMN = "_lakescore_prompt"
"""The column a prompted task's rendered prompt is added to the input as (never written to the output)."""

FILE_COLUMN = "_lakescore_file"
"""The column each row's file is described in, for an image column of paths: a struct of its ``path``, ``length`` and
``modified`` time (:data:`~lakescore.jobs.platform.files.hadoop_files.FILE_STATUS`), got without reading the file (an
incremental output stores it, :data:`~lakescore.schemas.output.FILE_COLUMNS`)."""
IMAGE_COLUMN = "_lakescore_image"
"""The column the bytes of each row's image file are added to the input as, for an image column of paths (never
written to the output)."""


class InputContractError(ValueError):
    """The input does not have the columns or types the task needs."""


@dataclass(frozen=True)
class _IdContract:
    """A contract's id columns: a composite id's, one column's, or none (``()``: none needed). Given as one name, a
    contract takes it as its one column."""

    id_cols: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "id_cols", id_names(self.id_cols))


@dataclass(frozen=True)
class TextInputContract(_IdContract):
    """A text task's input: id columns (string, integer or decimal), a string text column and, for pairs, a second
    string column (``text_pair_col``)."""

    text_col: str
    text_pair_col: str | None = None

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or ill-typed column.

        Column names match exactly (case-sensitive), as Delta writes them.
        """
        texts = [("text column", self.text_col), ("text_pair_col column", self.text_pair_col)]
        fields = _fields_present(schema, source, [*_id_roles(self.id_cols), *texts])
        _require_ids(fields, self.id_cols, source)
        for role, name in texts:
            if name is not None:
                _require(fields[name], (StringType,), f"{role} {name!r} in {source}", "string")


@dataclass(frozen=True)
class ImageInputContract(_IdContract):
    """An image task's input: id columns and an image column: binary (encoded images) or string (paths or URIs of
    image files)."""

    image_col: str

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or ill-typed column."""
        fields = _fields_present(schema, source, [*_id_roles(self.id_cols), ("image column", self.image_col)])
        _require_ids(fields, self.id_cols, source)
        _require(
            fields[self.image_col],
            (BinaryType, StringType),
            f"image column {self.image_col!r} in {source}",
            "binary (encoded image bytes) or string (paths of image files)",
        )


@dataclass(frozen=True)
class AudioInputContract(_IdContract):
    """An audio task's input: id columns and an audio column: binary (encoded recordings) or string (paths or URIs
    of audio files)."""

    audio_col: str

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or ill-typed column."""
        fields = _fields_present(schema, source, [*_id_roles(self.id_cols), ("audio column", self.audio_col)])
        _require_ids(fields, self.id_cols, source)
        _require(
            fields[self.audio_col],
            (BinaryType, StringType),
            f"audio column {self.audio_col!r} in {source}",
            "binary (encoded audio bytes) or string (paths of audio files)",
        )


def one_column_contract(
    kind: str, id_cols: tuple[str, ...], column: str, pair_col: str | None = None
) -> TextInputContract | ImageInputContract | AudioInputContract:
    """The contract of a task that reads one column of input kind ``kind`` (``text``: strings, ``image``: bytes,
    ``audio``: bytes), and for text pairs the second string column ``pair_col``."""
    if pair_col is not None:
        return TextInputContract(id_cols, column, pair_col)
    contracts = {"text": TextInputContract, "image": ImageInputContract, "audio": AudioInputContract}
    return contracts[kind](id_cols, column)


@dataclass(frozen=True)
class PromptInputContract(_IdContract):
    """A prompted task's input: id columns and the columns its prompt template names (strings, numbers, booleans,
    dates or timestamps, inserted as Spark casts them to a string)."""

    template_cols: tuple[str, ...]

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or ill-typed column."""
        named = _id_roles(self.id_cols) + [("prompt_template column", c) for c in self.template_cols]
        fields = _fields_present(schema, source, named)
        _require_ids(fields, self.id_cols, source)
        for name in self.template_cols:
            _require(
                fields[name],
                _PROMPT_VALUE_TYPES,
                f"prompt_template column {name!r} in {source}",
                "a string, number, boolean, date or timestamp",
            )


def resolve_feature_cols(schema: StructType, cols: Sequence[str], prefix: str | None, source: str) -> tuple[str, ...]:
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
    raise InputContractError(
        "the tabular task needs feature_cols (--feature-cols) or feature_prefix (--feature-prefix)"
    )


@dataclass(frozen=True)
class FeatureInputContract(_IdContract):
    """A tabular task's input: id columns and numeric feature columns."""

    feature_cols: tuple[str, ...]

    def check(self, schema: StructType, source: str) -> None:
        """Raise :class:`InputContractError` naming the first missing or non-numeric column."""
        fields = _fields_present(
            schema, source, _id_roles(self.id_cols) + [("feature column", c) for c in self.feature_cols]
        )
        _require_ids(fields, self.id_cols, source)
        for name in self.feature_cols:
            _require(
                fields[name],
                _NUMERIC_TYPES,
                f"feature column {name!r} in {source}",
                "a number (double, float, integer or decimal)",
            )
        for name in self.id_cols:
            if name in self.feature_cols:
                raise InputContractError(f"id column {name!r} is also listed as a feature column")


def _id_roles(id_cols: tuple[str, ...]) -> list[tuple[str, str | None]]:
    return [("id column", name) for name in id_cols]


def _require_ids(fields: dict[str, DataType], id_cols: tuple[str, ...], source: str) -> None:
    for name in id_cols:
        _require(fields[name], _ID_TYPES, f"id column {name!r} in {source}", "string, integer or decimal")


def _fields_present(schema: StructType, source: str, columns: list[tuple[str, str | None]]) -> dict[str, DataType]:
    """The schema's fields by name, after checking every named ``(role, column)`` is there (``None``: not needed)."""
    fields = {f.name: f.dataType for f in schema.fields}
    for role, name in columns:
        if name is not None and name not in fields:
            raise InputContractError(
                f"{role} {name!r} not found in {source}; available columns: {', '.join(fields) or '(none)'}"
            )
    return fields


def _require(found: DataType, allowed: tuple[type, ...], what: str, expected: str) -> None:
    if not isinstance(found, allowed):
        raise InputContractError(f"{what} has type {found.simpleString()}; expected {expected}")
