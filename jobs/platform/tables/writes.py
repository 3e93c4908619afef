"""Writing Delta outputs by reference: overwrite, replaceWhere and append commits, MERGE, deletes, each refusing a
concurrent writer's conflict in one line."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from lakescore.jobs.platform.spark import adapter as spark_adapter
from lakescore.jobs.platform.tables.failures import WriteConflictError, first_line, is_commit_conflict
from lakescore.jobs.platform.tables.history import own_entry
from lakescore.jobs.platform.tables.refs import TableRef
from lakescore.jobs.references import quote_identifier

log = logging.getLogger(__name__)


@contextmanager
def _conflicts_refused(ref: TableRef, what: str, then: str):
    """A commit conflict (:func:`is_commit_conflict`) raised in the block becomes one :class:`WriteConflictError`
    line."""
    try:
        yield
    except Exception as exc:
        if is_commit_conflict(exc):
            raise WriteConflictError(
                f"another run committed to {ref.text!r} at the same time and Delta refused this run's {what} "
                f"({first_line(exc)}); {then}"
            ) from exc
        raise


WRITE_MODES = ("overwrite", "append")


def write_delta(
    df: DataFrame,
    ref: str | TableRef,
    mode: str = "overwrite",
    *,
    replace_where: str | None = None,
    partition_by: str | None = None,
    table_properties: Mapping[str, str] | None = None,
    overwrite_schema: bool = False,
    user_metadata: str | None = None,
    txn: tuple[str, int] | None = None,
) -> None:
    """Write ``df`` to the Delta table ``ref`` in one commit: ``mode="overwrite"`` replaces its rows, ``"append"``
    adds ``df``'s. Readers see either the old or the new snapshot, never a mix; read the commit back with
    :func:`own_commit`.

    ``replace_where`` (a SQL predicate, overwrite only) replaces only the rows matching it, atomically; Delta refuses
    the write if ``df`` holds a row outside it. ``partition_by`` and ``table_properties`` (Delta table properties,
    e.g. ``delta.enableDeletionVectors``) apply when the write creates the table; an existing table keeps its own.
    ``overwrite_schema``: the table's columns become ``df``'s (Delta's ``overwriteSchema``), where they differ.
    ``user_metadata`` is stored in the commit's ``commitInfo.userMetadata`` (lakescore's is :func:`run_metadata`;
    :func:`delta_history` reads it back). ``txn``: ``(app id, version)`` makes the write idempotent (Delta's
    ``txnAppId`` / ``txnVersion``): Delta skips it when the table holds a commit of that app id at that version or
    later, so a rerun after a driver died between the commit and the rest of the run writes nothing twice.

    A concurrent commit that Delta refuses raises :class:`WriteConflictError`.
    """
    if mode not in WRITE_MODES:
        raise ValueError(f"write mode {mode!r} is not one of {WRITE_MODES}")
    ref = TableRef.parse(ref)
    spark = df.sparkSession
    writer = df.write.format("delta").mode(mode)
    options = {
        "overwriteSchema": "true" if overwrite_schema else None,
        "replaceWhere": replace_where,
        "userMetadata": user_metadata,
    }
    if txn is not None:
        options.update(txnAppId=txn[0], txnVersion=str(int(txn[1])))
    if (partition_by is not None or table_properties) and not ref.exists(spark):
        if partition_by is not None:
            writer = writer.partitionBy(partition_by)
        options.update(table_properties or {})  # Delta stores delta.* writer options as properties of a new table
    for key, value in options.items():
        if value is not None:
            writer = writer.option(key, value)
    # A tagged overwrite is recorded even when it changes no file (Delta skips such commits by default), so a run
    # that wrote no rows still leaves the tag its commit is found by (:func:`own_commit`); an empty append changes
    # nothing and stays unrecorded.
    then = (
        "the table holds the other run's complete result. Rerun to replace it."
        if mode == "overwrite"
        else "rerun to add this run's rows."
    )
    with (
        _conflicts_refused(ref, "commit", then),
        _recording_empty_commits(spark, mode == "overwrite" and user_metadata is not None),
    ):
        ref.save(writer)


DELETION_VECTORS = "delta.enableDeletionVectors"
"""The Delta table property that lets ``MERGE``, ``UPDATE`` and ``DELETE`` mark rows deleted instead of rewriting
files."""

STATS_COLUMNS = "delta.dataSkippingStatsColumns"
"""The Delta table property naming the columns whose minimum, maximum and null count each file records
(comma-separated)."""


MERGE_OP = "_lakescore_op"
"""The column of a :func:`merge_delta` source saying what each row does: ``upsert`` or ``delete``."""


@dataclass(frozen=True)
class MergeCommit:
    """The commit a :func:`merge_delta` made, with Delta's own counts of the rows it touched."""

    version: int
    inserted: int
    updated: int
    deleted: int


@dataclass(frozen=True)
class _MergeClauses:
    """The one MERGE lakescore runs, target ``t`` and source ``s``: delete on a ``delete`` row, update or insert every
    column on an ``upsert`` row. Built once; run through Delta's builder (:meth:`run`) or as SQL (:meth:`sql`)."""

    on: str
    delete: str
    upsert: str
    assignments: dict[str, str]
    """Target column -> source value, for UPDATE and INSERT alike."""

    @classmethod
    def upsert_or_delete(cls, id_cols: Sequence[str], columns: list[str]) -> _MergeClauses:
        keys = [quote_identifier(c) for c in id_cols]
        quoted = [quote_identifier(c) for c in columns]
        return cls(
            " AND ".join(f"t.{key} = s.{key}" for key in keys),
            f"s.{MERGE_OP} = 'delete'",
            f"s.{MERGE_OP} = 'upsert'",
            {c: f"s.{c}" for c in quoted},
        )

    def run(self, target, source: DataFrame) -> None:
        """Run on Delta's ``DeltaTable`` ``target``."""
        (
            target.alias("t")
            .merge(source.alias("s"), self.on)
            .whenMatchedDelete(condition=self.delete)
            .whenMatchedUpdate(condition=self.upsert, set=self.assignments)
            .whenNotMatchedInsert(condition=self.upsert, values=self.assignments)
            .execute()
        )

    def sql(self, target: str, source: str) -> str:
        """The statement merging the view ``source`` into ``target`` (both as SQL names them)."""
        sets = ", ".join(f"t.{c} = {v}" for c, v in self.assignments.items())
        return (
            f"MERGE INTO {target} AS t USING {source} AS s ON {self.on} "
            f"WHEN MATCHED AND {self.delete} THEN DELETE "
            f"WHEN MATCHED AND {self.upsert} THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED AND {self.upsert} THEN INSERT ({', '.join(self.assignments)}) "
            f"VALUES ({', '.join(self.assignments.values())})"
        )


def merge_delta(
    changes: DataFrame,
    ref: str | TableRef,
    id_cols: Sequence[str],
    columns: list[str],
    view: str,
    user_metadata: str | None = None,
    txn: tuple[str, int] | None = None,
) -> MergeCommit:
    """Apply ``changes`` to the Delta table ``ref`` in one ``MERGE`` commit and return it.

    ``changes`` holds at most one row per id (the values of ``id_cols``) and a :data:`MERGE_OP` column: an ``upsert``
    row updates the output row of its id (every column of ``columns``) or inserts it; a ``delete`` row deletes the
    output row of its id, if any. Run through Delta's API for a path in a classic session
    (:meth:`TableRef.delta_api`), else as SQL with the source registered as the temporary view ``view`` for the
    statement's length. ``user_metadata`` is stored in the commit info, as :func:`write_delta` does, and the
    commit returned is found by it; ``txn`` makes the MERGE idempotent as there (Delta's session settings
    ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``). A concurrent commit that Delta refuses raises
    :class:`WriteConflictError`.
    """
    ref = TableRef.parse(ref)
    spark = changes.sparkSession
    clauses = _MergeClauses.upsert_or_delete(id_cols, columns)
    app_id, txn_version = (txn[0], str(int(txn[1]))) if txn is not None else (None, None)
    # Delta's MERGE reads its source twice (to find the files it touches, then to write). Its "auto" setting leaves
    # a deterministic source of Delta scans unmaterialized, so each pass would plan and list this run's staging,
    # errors and changes tables again; materialized once, they are read once. A session that sets it keeps its own.
    materialize = None if spark.conf.get(_MATERIALIZE_SOURCE, None) is not None else "all"
    target = ref.delta_api(spark)
    if target is None:
        changes.createOrReplaceTempView(view)
    try:
        with (
            _conflicts_refused(
                ref, "MERGE", "the table holds the other run's result. Rerun to apply this run's changes."
            ),
            _session_conf(spark, _COMMIT_METADATA, user_metadata),
            _session_conf(spark, _TXN_APP_ID, app_id),
            _session_conf(spark, _TXN_VERSION, txn_version),
            _session_conf(spark, _MATERIALIZE_SOURCE, materialize, refused_ok=True),
        ):
            if target is not None:
                clauses.run(target, changes)
            else:
                spark.sql(clauses.sql(ref.sql, quote_identifier(view))).collect()
    finally:
        if target is None:
            spark.catalog.dropTempView(view)
    entry = own_entry(spark, ref, user_metadata)
    count = lambda name: int(entry.metrics.get(name) or 0)  # noqa: E731
    return MergeCommit(
        entry.version, count("numTargetRowsInserted"), count("numTargetRowsUpdated"), count("numTargetRowsDeleted")
    )


_COMMIT_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"


_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextmanager
def _session_conf(spark: SparkSession, key: str, value: str | None, refused_ok: bool = False):
    """While the block runs, the session setting ``key`` is ``value`` (``None``: left as it is); restored afterwards.

    ``refused_ok``: where the platform refuses the setting (serverless compute allows only some), the block
    runs with the platform's value instead of raising.
    """
    if value is None:
        yield
        return
    try:
        previous = spark.conf.get(key, None)
        spark.conf.set(key, value)
    except Exception:
        if not refused_ok:
            raise
        yield
        return
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


_SKIP_EMPTY_COMMITS = "spark.databricks.delta.skipRecordingEmptyCommits"


def _recording_empty_commits(spark: SparkSession, wanted: bool):
    """While the block runs, Delta records a write that adds and removes no file (its default skips it).

    A session setting, restored afterwards; only Delta writes read it, and lakescore makes its
    tagged writes one at a time. Where the platform refuses the setting, the write goes ahead with
    the platform's behaviour: a refused setting costs a history entry, never the write.
    """
    return _session_conf(spark, _SKIP_EMPTY_COMMITS, "false" if wanted else None, refused_ok=True)


def delete_path(spark: SparkSession, ref: str) -> bool:
    """Delete the directory ``ref`` recursively (any Hadoop filesystem); True if something was deleted.

    Classic sessions only (:func:`lakescore.jobs.platform.spark.adapter.can_delete_paths`).
    """
    return spark_adapter.delete_path(spark, ref)


def drop_delta(spark: SparkSession, ref: str | TableRef) -> None:
    """Remove the Delta table ``ref``: ``DROP TABLE`` for a (managed) table, deleting the directory for a path."""
    ref = TableRef.parse(ref)
    if ref.is_path:
        delete_path(spark, ref.text)
    else:
        spark.sql(f"DROP TABLE IF EXISTS {ref.sql}")
