"""What Delta's log says about a table: its commits (:class:`HistoryEntry`), the run tags lakescore writes into them,
details and ids."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from lakescore.jobs.platform.spark import adapter as spark_adapter
from lakescore.jobs.platform.spark.adapter import one_row
from lakescore.jobs.platform.tables.refs import TableRef


@dataclass(frozen=True)
class DeltaCommit:
    """The commit a write made: table version and the rows it wrote (Delta's own metric)."""

    version: int
    rows: int | None


_METADATA_KEY = "lakescore"


def run_metadata(run_id: str, report: str | None, spec: Mapping[str, Any] | None = None) -> str:
    """The ``userMetadata`` lakescore tags its commits with: ``{"lakescore": {"run_id", "report"}}`` as JSON
    (``report``: the JSON report's absolute path, or ``None``), with ``"spec"`` when given (an incremental run's
    scoring spec, which the next run compares with).

    >>> run_metadata("2026-11-21", None)
    '{"lakescore": {"run_id": "2026-11-21", "report": null}}'
    """
    tag: dict[str, Any] = {"run_id": run_id, "report": report}
    if spec is not None:
        tag["spec"] = spec
    return json.dumps({_METADATA_KEY: tag}, sort_keys=False)


def staging_metadata(output: str, tag: str | None = None) -> str:
    """The ``userMetadata`` of a staging table's commits: the run's ``tag`` (:func:`run_metadata`, if any) and the
    output the table stages for, by which a later run of that output tells its own stale staging in a shared
    ``write.staging`` location (:func:`last_commit_stamp`).

    >>> staging_metadata("db.scores", run_metadata("r1", None))
    '{"lakescore": {"run_id": "r1", "report": null, "staging_for": "db.scores"}}'
    """
    return json.dumps({_METADATA_KEY: {**_tag(tag), "staging_for": output}})


def _tag(user_metadata: str | None) -> dict[str, Any]:
    try:
        tag = json.loads(user_metadata or "{}").get(_METADATA_KEY)
    except (ValueError, AttributeError):  # someone else's metadata: not JSON, or not an object
        return {}
    return tag if isinstance(tag, dict) else {}


@dataclass(frozen=True)
class HistoryEntry:
    """One commit of a Delta table's history (:func:`delta_history`), with lakescore's tag when it has one."""

    version: int
    timestamp: str
    """When it was committed, in the session's time zone, to the second."""
    operation: str
    rows: int | None
    """The rows it wrote (Delta's ``numOutputRows``), where the operation reports them."""
    run_id: str | None
    report: str | None
    spec: dict | None = None
    """The scoring spec's parts an incremental run recorded (:func:`run_metadata`)."""
    staging_for: str | None = None
    """The output a staging table's commit stages for (:func:`staging_metadata`)."""
    committed_at: float = 0.0
    """When it was committed, in seconds since the epoch (whatever the session's time zone)."""
    metrics: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Delta's ``operationMetrics`` of the commit."""
    user_metadata: str | None = field(default=None, compare=False, repr=False)

    @property
    def commit(self) -> DeltaCommit:
        """The commit as a write's result: version and rows written."""
        return DeltaCommit(self.version, self.rows)


def _history(spark: SparkSession, ref: TableRef, limit: int | None = None) -> DataFrame:
    """``DESCRIBE HISTORY`` of the Delta table ``ref``, newest first, at most ``limit`` commits, in the columns
    :func:`_entry` reads (Delta's API or SQL: :meth:`TableRef.delta_api`)."""
    from pyspark.sql import functions as F

    api = ref.delta_api(spark)
    if api is not None:
        history = api.history(limit) if limit else api.history()
    else:
        history = spark.sql(f"DESCRIBE HISTORY {ref.sql}" + (f" LIMIT {int(limit)}" if limit else ""))
    return history.select(
        "version",
        "timestamp",
        F.unix_micros("timestamp").alias("micros"),
        "operation",
        "operationMetrics",
        "userMetadata",
    )


def _entry(row) -> HistoryEntry:
    """One row of :func:`_history`, read: the only place Delta's history columns and lakescore's tag are parsed."""
    tag, metrics = _tag(row["userMetadata"]), dict(row["operationMetrics"] or {})
    rows = metrics.get("numOutputRows")
    return HistoryEntry(
        version=int(row["version"]),
        timestamp=row["timestamp"].isoformat(sep=" ", timespec="seconds"),
        operation=row["operation"],
        rows=int(rows) if rows is not None else None,
        run_id=tag.get("run_id"),
        report=tag.get("report"),
        spec=tag.get("spec"),
        staging_for=tag.get("staging_for"),
        committed_at=row["micros"] / 1e6,
        metrics=metrics,
        user_metadata=row["userMetadata"],
    )


def delta_history(spark: SparkSession, ref: str | TableRef, limit: int | None = None) -> list[HistoryEntry]:
    """The commits of the Delta table ``ref``, newest first (at most ``limit``); ``[]`` when it does not exist.

    ``run_id`` and ``report`` come from :func:`run_metadata` tags; other commits have ``None`` there.
    """
    ref = TableRef.parse(ref)
    if not ref.exists(spark):
        return []
    return sorted(map(_entry, _history(spark, ref, limit).collect()), key=lambda e: -e.version)


def last_commit(spark: SparkSession, ref: str | TableRef) -> DeltaCommit:
    """The latest commit of the Delta table ``ref``: version and rows written (Delta's own metric)."""
    return _entry(_history(spark, TableRef.parse(ref), 1).first()).commit


def latest_commit(spark: SparkSession, ref: str | TableRef) -> DeltaCommit | None:
    """The latest commit of ``ref`` (:func:`last_commit`), or ``None`` when ``ref`` is not a Delta table with a commit
    (:func:`~lakescore.jobs.platform.tables.is_delta`'s answer).

    A path is asked of its ``_delta_log`` first (:func:`~lakescore.jobs.platform.spark.adapter.is_delta_path`); a
    table's one ``DESCRIBE HISTORY`` answers both questions, where asking whether it is Delta and then for its latest
    commit read its history twice.
    """
    ref = TableRef.parse(ref)
    known = spark_adapter.is_delta_path(spark, ref.text) if ref.is_path else None
    if known is False:
        return None
    try:
        row = _history(spark, ref, 1).first()
    except AnalysisException:
        if known:
            raise
        return None
    return _entry(row).commit if row is not None else None


def own_commit(spark: SparkSession, ref: str | TableRef, user_metadata: str | None) -> DeltaCommit:
    """The newest commit of ``ref`` tagged exactly ``user_metadata`` (:func:`run_metadata`): this run's own
    commit, whatever other writers committed after it. Without a tag: the latest commit (:func:`last_commit`).

    A write that changed nothing where the platform refuses to record empty commits (see
    :func:`write_delta`) leaves no tagged commit: then the latest commit is returned.
    """
    return own_entry(spark, TableRef.parse(ref), user_metadata).commit


def own_entry(spark: SparkSession, ref: TableRef, user_metadata: str | None) -> HistoryEntry:
    """The newest commit tagged ``user_metadata`` (else the latest).

    The latest entry is read first: it is the run's own commit unless another writer committed since, so the
    whole history (long on an old table) is read only then.
    """
    from pyspark.sql import functions as F

    latest = _entry(_history(spark, ref, 1).first())
    if user_metadata is None or latest.user_metadata == user_metadata:
        return latest
    row = (
        _history(spark, ref)
        .where(F.col("userMetadata") == F.lit(user_metadata))
        .orderBy(F.col("version").desc())
        .first()
    )
    return _entry(row) if row is not None else latest  # none tagged: an empty write the platform did not record


def last_commit_stamp(spark: SparkSession, ref: str | TableRef) -> tuple[float, str | None]:
    """When the latest commit of the Delta table ``ref`` was made, in seconds since the epoch (whatever the session's
    time zone), and the output its lakescore tag says the table stages for (:func:`staging_metadata`; ``None``)."""
    latest = _entry(_history(spark, TableRef.parse(ref), 1).first())
    return latest.committed_at, latest.staging_for


def latest_version_and_id(spark: SparkSession, ref: str | TableRef) -> tuple[int, str]:
    """The latest commit's version of the Delta table ``ref`` and the table's unique id (:func:`last_commit`,
    :func:`table_id`): for a path in a classic session both from the log's latest snapshot on the driver
    (:func:`~lakescore.jobs.platform.spark.adapter.delta_path_snapshot`), elsewhere from ``DESCRIBE HISTORY`` and
    ``DESCRIBE DETAIL``."""
    ref = TableRef.parse(ref)
    known = spark_adapter.delta_path_snapshot(spark, ref.text) if ref.is_path else None
    return known if known is not None else (last_commit(spark, ref).version, table_id(spark, ref))


def delta_detail(spark: SparkSession, ref: str | TableRef) -> DataFrame:
    """``DESCRIBE DETAIL`` of the Delta table ``ref``: its id, location, file count and size, properties, one row
    (Delta's API or SQL: :meth:`TableRef.delta_api`)."""
    ref = TableRef.parse(ref)
    api = ref.delta_api(spark)
    return api.detail() if api is not None else spark.sql(f"DESCRIBE DETAIL {ref.sql}")


def table_id(spark: SparkSession, ref: str | TableRef) -> str:
    """The Delta table's unique id (``DESCRIBE DETAIL``): a new one for each table created, even at the same path."""
    return str(one_row(delta_detail(spark, ref).select("id"))[0])
