"""Rows that cannot be scored, with a reason: the dead-letter (errors) table.

Two kinds reach it. Rows refused before scoring because of their id (``null_id``: a null in any id column;
``duplicate_id``: every copy of an id that appears more than once, since which copy
is "right" cannot be known), and rows the workers could not score (``null_input``,
``bad_feature_value``, ``scoring_error`` with the exception text). Every input row
lands in exactly one of the output and the errors table. In ``write.mode: incremental`` a third kind is carried: a
row an earlier run dead-lettered for a reason of its own (:func:`~lakescore.schemas.output.carries`), unchanged
since, keeps its dead letter without being scored again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakescore.jobs.platform.spark.adapter import one_row, partition_count
from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.ids import any_null, id_columns
from lakescore.schemas.output import DIGEST_COLUMN, ERROR_COLUMNS
from lakescore.schemas.reasons import DUPLICATE_ID, NULL_ID, NULL_INPUT

__all__ = [
    "CARRIED",
    "IdCheck",
    "check_ids",
    "split_by_id",
    "refused_rows",
    "unscored_rows",
    "carried_rows",
    "name_null_column",
    "name_null_prompt_columns",
]

_BROADCAST_LIMIT = 1_000_000
CARRIED = "__lakescore_carried"
"""The incremental changes table's column holding the dead letter (``input``, ``reason``, ``error``, ``first_run_id``)
of a row carried from the last run's errors table, null on every other row
(:func:`~lakescore.jobs.steps.incremental.find_changes`)."""


@dataclass(frozen=True)
class IdCheck:
    """Input row count and the rows refused for their id, from one aggregation."""

    rows: int
    refused_rows: int
    """Rows with a null id plus every copy of a duplicated id."""
    refused_ids: int
    null_id_rows: int


def check_ids(source: DataFrame, id_cols: Sequence[str]) -> IdCheck:
    """Count the input and its null / duplicated ids in one pass (a shuffle of the id columns only). A composite id
    with a null in any of its columns is a null id."""
    keys = [f"_id{i}" for i in range(len(id_cols))]
    ids = source.select(*[column(c).alias(k) for c, k in zip(id_cols, keys)])
    # Ids are (nearly) all distinct, so Spark's partial aggregation before the shuffle would build a hash map of every
    # id of each input task for nothing (and spill it): the ids are shuffled first and counted once, after it, in
    # twice as many partitions as the input has, so each count's hash map holds half an input partition's ids and a
    # small input makes few tasks (BENCHMARKS.md, issue 46). Over Connect, where the input's partitions are unknown,
    # Spark picks the number.
    planned = partition_count(source)
    per_id = (ids.repartition(2 * planned, *keys) if planned else ids.repartition(*keys)).groupBy(*keys).count()
    null = any_null(keys)
    refused = null | (F.col("count") > 1)
    row = one_row(
        per_id.agg(
            F.coalesce(F.sum("count"), F.lit(0)).alias("rows"),
            F.coalesce(F.sum(F.when(refused, F.col("count"))), F.lit(0)).alias("refused_rows"),
            F.count(F.when(refused, True)).alias("refused_ids"),
            F.coalesce(F.sum(F.when(null, F.col("count"))), F.lit(0)).alias("null_id_rows"),
        )
    )
    return IdCheck(int(row["rows"]), int(row["refused_rows"]), int(row["refused_ids"]), int(row["null_id_rows"]))


def split_by_id(source: DataFrame, id_cols: Sequence[str], check: IdCheck) -> tuple[DataFrame, DataFrame]:
    """``(scorable, refused)``: rows with a unique id with no null in it, and the rest with a ``reason`` column."""
    if check.refused_rows == 0:
        return source, source.limit(0).withColumn("reason", F.lit(None).cast("string"))
    ids = list(id_cols)
    present = source.where(~any_null(ids))
    duplicated = present.groupBy(*id_columns(ids)).count().where(F.col("count") > 1).select(*id_columns(ids))
    if check.refused_ids <= _BROADCAST_LIMIT:
        duplicated = F.broadcast(duplicated)
    scorable = present.join(duplicated, on=ids, how="left_anti")
    refused = (
        source.where(any_null(ids))
        .withColumn("reason", F.lit(NULL_ID))
        .unionByName(present.join(duplicated, on=ids, how="left_semi").withColumn("reason", F.lit(DUPLICATE_ID)))
    )
    return scorable, refused


def refused_rows(
    refused: DataFrame, id_cols: Sequence[str], raw_input: Column, run_id: str, *carry: Column
) -> DataFrame:
    """Refused rows in the errors table's shape (``carry``: its incremental columns)."""
    return refused.select(
        *id_columns(id_cols),
        raw_input.cast("string").alias("input"),
        F.col("reason"),
        F.lit(None).cast("string").alias("error"),
        F.lit(run_id).alias("run_id"),
        *carry,
    )


def unscored_rows(scored: DataFrame, id_cols: Sequence[str], run_id: str, *carry: Column) -> DataFrame:
    """Rows the workers could not score, in the errors table's shape (``carry``: its incremental columns)."""
    reason, error, raw = ERROR_COLUMNS
    return scored.where(F.col(reason).isNotNull()).select(
        *id_columns(id_cols),
        F.col(raw).alias("input"),
        F.col(reason).alias("reason"),
        F.col(error).alias("error"),
        F.lit(run_id).alias("run_id"),
        *carry,
    )


def carried_rows(carried: DataFrame, id_cols: Sequence[str], run_id: str, model_sha256: str, spec: str) -> DataFrame:
    """The dead letters an incremental run carried from an earlier run's errors table (``carried``: the changes table's
    carried rows, :meth:`~lakescore.jobs.steps.incremental.Changes.carried`), in the errors table's incremental shape:
    as they were found, under this run's id, with the run that first found them, marked ``carried``."""
    letter = F.col(CARRIED)
    return carried.select(
        *id_columns(id_cols),
        letter["input"].alias("input"),
        letter["reason"].alias("reason"),
        letter["error"].alias("error"),
        F.lit(run_id).alias("run_id"),
        F.col(DIGEST_COLUMN).alias("input_digest"),
        F.lit(model_sha256).alias("model_sha256"),
        F.lit(spec).alias("spec_digest"),
        letter["first_run_id"].alias("first_run_id"),
        F.lit(True).alias("carried"),
    )


def _blank_null_input() -> Column:
    """A ``null_input`` dead letter with neither input nor error: the worker saw a null value and nothing else."""
    return (F.col("reason") == NULL_INPUT) & F.col("input").isNull() & F.col("error").isNull()


def name_null_column(errors: DataFrame, setting: str, name: str) -> DataFrame:
    """``errors`` with each null text's dead letter (:func:`_blank_null_input`) naming the input column ``name`` (the
    value of the setting ``setting``, e.g. ``text_col``) that is null on that row."""
    said = F.lit(f"the {setting} column {name!r} is null on this row")
    return errors.withColumn("error", F.when(_blank_null_input(), said).otherwise(F.col("error")))


def name_null_prompt_columns(
    errors: DataFrame, source: DataFrame, id_cols: Sequence[str], names: Sequence[str]
) -> DataFrame:
    """``errors`` (the errors table's shape) with each null prompt's dead letter (``null_input`` with neither input nor
    error: a column the prompt template names was null, so no prompt was rendered) naming the first of the template's
    columns ``names`` that is null on that row, and showing the row's values of those columns as JSON (nulls left
    out). The worker sees the rendered prompt only; the columns are read from the pinned ``source``, for these rows
    alone (a broadcast join), when there are any."""
    blank = _blank_null_input()
    aliases = [f"__lakescore_template_{i}" for i in range(len(names))]
    values = source.select(*id_columns(id_cols), *[column(n).alias(a) for n, a in zip(names, aliases)])
    named = values.join(F.broadcast(errors.where(blank).drop("input", "error")), on=list(id_cols))
    first_null = F.coalesce(*[F.when(F.col(a).isNull(), F.lit(n)) for n, a in zip(names, aliases)])
    shown = {
        "input": F.to_json(F.struct(*[F.col(a).alias(n) for n, a in zip(names, aliases)])).alias("input"),
        "error": F.concat(F.lit("the prompt template's column '"), first_null, F.lit("' is null on this row")).alias(
            "error"
        ),
    }
    return errors.where(~blank).unionByName(named.select(*[shown.get(c, column(c)) for c in errors.columns]))
