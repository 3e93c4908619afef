"""Output schemas per task: what the scoring UDF returns and what lands in Delta."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, FloatType, StringType, StructField, StructType

from schemas.contracts import InputContractError

__all__ = ["scored_struct", "output_schema", "prediction_columns", "column_types", "IDENTITY_COLUMNS"]

IDENTITY_COLUMNS = ("model_id", "model_sha256", "run_id")
"""Columns every output row carries so anyone can tell which model and run produced it."""

_SCORED = {
    "embed": StructType(
        [
            StructField("embedding", ArrayType(FloatType(), containsNull=False), nullable=True),
            StructField("model_sha256", StringType(), nullable=False),
        ]
    ),
}


def scored_struct(task: str) -> StructType:
    """The struct the scoring UDF returns for ``task`` (prediction columns + ``model_sha256``).

    Raises ``KeyError`` for an unknown task.
    """
    return _SCORED[task]


def prediction_columns(task: str) -> list[str]:
    """Names of the columns holding the model's output for ``task``."""
    return [f.name for f in scored_struct(task).fields if f.name not in IDENTITY_COLUMNS]


def output_schema(task: str, id_field: StructField) -> StructType:
    """The Delta table's schema: the id column as it was in the input, predictions, identity columns.

    Raises :class:`~schemas.contracts.InputContractError` when the id column's name collides
    with an output column.
    """
    taken = prediction_columns(task) + list(IDENTITY_COLUMNS)
    if id_field.name in taken:
        raise InputContractError(f"id column {id_field.name!r} collides with an output column ({', '.join(taken)}); rename it")
    predictions = [f for f in scored_struct(task).fields if f.name in prediction_columns(task)]
    return StructType(
        [StructField(id_field.name, id_field.dataType, nullable=True)]
        + predictions
        + [StructField(name, StringType(), nullable=True) for name in IDENTITY_COLUMNS]
    )


def column_types(schema: StructType) -> list[tuple[str, str]]:
    """``(name, type)`` per column, types in full (``array<float>``), nullability ignored.

    Delta and Parquet do not keep every nullability flag as written, so two schemas
    are "the same table shape" when these lists are equal.
    """
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]
