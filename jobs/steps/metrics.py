"""Step 8, report (metrics): one row per attempt of a run in the output's metrics table, published or not.

The row holds the run's id and attempt number, status, times and row counts, the prediction profile of its rows
(label shares, deciles of the score, of the embeddings' norms, of the generated texts' lengths:
:mod:`lakescore.jobs.steps.drift`), the drift figures and the baseline version. Whoever runs the job writes it beside
the run's JSON and HTML report (:func:`record_run`; :func:`record_stopped_run` for a run that raised): the CLI and the
Python API's ``score``. Every attempt that got as far as its plan (which names the run id) has one: succeeded, refused
by a check (``validation_failed``, ``error_rate_exceeded``, ``drift_exceeded``), ``failed``, ``interrupted`` or
``pending`` (a ``batch.wait: false`` run whose provider batches still run); a run
refused before compute (a bad setting, input or model) has none. The row is appended: a rerun of a run id (which
resumes its staging) is its next ``attempt`` and leaves the earlier attempts' rows as they were, so a refused attempt
stays on record. A table written before attempts were numbered gets the column on its first new row (its rows'
``attempt`` is null: each was its run id's only row, attempt 1). A failed write is logged and changes nothing about
the run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakescore.jobs.config import RUN_ID, JobConfig
from lakescore.jobs.platform.spark.background import in_background
from lakescore.jobs.platform.tables import TableError, TableRef, read_input, write_delta
from lakescore.jobs.report.files import write_report
from lakescore.jobs.report.model import RunReport
from lakescore.jobs.report.text import one_line
from lakescore.jobs.steps.clock import StepClock
from lakescore.jobs.steps.report import failure_report, stopped_status

__all__ = [
    "ATTEMPT",
    "METRICS_SCHEMA",
    "metrics_row",
    "record_metrics",
    "record_run",
    "record_stopped_run",
    "read_attempts",
    "read_metrics",
]

log = logging.getLogger(__name__)

_DECILES = T.ArrayType(T.DoubleType())
ATTEMPT = "attempt"
"""The column numbering the attempts of one run id: 1, 2, ... (null in rows written before it existed: attempt 1)."""
METRICS_SCHEMA = T.StructType(
    [
        T.StructField("run_id", T.StringType()),
        T.StructField(ATTEMPT, T.LongType()),
        T.StructField("status", T.StringType()),
        T.StructField("task", T.StringType()),
        T.StructField("model_id", T.StringType()),
        T.StructField("model_sha256", T.StringType()),
        T.StructField("started_at", T.TimestampType()),
        T.StructField("finished_at", T.TimestampType()),
        T.StructField("seconds", T.DoubleType()),
        T.StructField("input_rows", T.LongType()),
        T.StructField("output_rows", T.LongType()),
        T.StructField("error_rows", T.LongType()),
        T.StructField("rows_kept", T.LongType()),
        T.StructField("delta_version", T.LongType()),
        T.StructField("baseline_version", T.LongType()),
        T.StructField("label_shares", T.MapType(T.StringType(), T.DoubleType())),
        T.StructField("score_deciles", _DECILES),
        T.StructField("embedding_norm_deciles", _DECILES),
        T.StructField("text_length_deciles", _DECILES),
        T.StructField("label_js", T.DoubleType()),
        T.StructField("score_psi", T.DoubleType()),
        T.StructField("id_cosine_p5", T.DoubleType()),
        T.StructField("drift_exceeded", T.ArrayType(T.StringType())),
        T.StructField("drift_note", T.StringType()),
        T.StructField("error", T.StringType()),
        T.StructField("tokens_in", T.LongType()),
        T.StructField("tokens_out", T.LongType()),
        T.StructField("cost", T.DoubleType()),
        T.StructField("tokens_in_cached", T.LongType()),
        T.StructField("tokens_in_cache_write", T.LongType()),
    ]
)
"""The metrics table's columns: the same for every task (a profile the task does not have is null)."""

_ATTEMPT_FACTS = (
    "attempt",
    "status",
    "started_at",
    "finished_at",
    "seconds",
    "input_rows",
    "output_rows",
    "error_rows",
    "delta_version",
    "drift_exceeded",
    "error",
)
"""What a report keeps of each earlier attempt of its run id
(:attr:`~lakescore.jobs.report.model.RunReport.attempts`)."""
_PROFILE = ("label_shares", "score_deciles", "embedding_norm_deciles", "text_length_deciles")
_FIGURES = ("label_js", "score_psi", "id_cosine_p5")


def metrics_row(report: RunReport) -> dict[str, Any] | None:
    """The metrics row of ``report`` (:data:`METRICS_SCHEMA`'s fields); ``None`` for a run without a usable id."""
    if not report.run_id or not RUN_ID.fullmatch(report.run_id):  # the id sits in the write's replaceWhere predicate
        return None
    drift = report.drift or {}
    profile = (drift.get("profiles") or {}).get("run") or {}
    figures = drift.get("figures") or {}
    return {
        "run_id": report.run_id,
        ATTEMPT: report.attempt,
        "status": report.status,
        "task": report.task,
        "model_id": report.model_id,
        "model_sha256": report.model_sha256,
        "started_at": _when(report.started_at),
        "finished_at": _when(report.finished_at),
        "seconds": report.seconds,
        "input_rows": report.input_rows,
        "output_rows": report.output_rows,
        "error_rows": report.error_rows,
        "rows_kept": report.rows_kept,
        "delta_version": report.delta_version,
        "baseline_version": drift.get("baseline_version"),
        **{name: profile.get(name) for name in _PROFILE},
        **{name: figures.get(name) for name in _FIGURES},
        "drift_exceeded": drift.get("exceeded") if drift else None,
        "drift_note": drift.get("note"),
        "error": report.error,
        # generation's tokens, and the run's cost where a price is set (cores, GPUs, an endpoint's tokens)
        "tokens_in": (report.workers or {}).get("tokens_in"),
        "tokens_out": (report.workers or {}).get("tokens_out"),
        "cost": (report.cost or {}).get("cost"),
        "tokens_in_cached": (report.workers or {}).get("tokens_in_cached"),
        "tokens_in_cache_write": (report.workers or {}).get("tokens_in_cache_write"),
    }


@dataclass(frozen=True)
class _MetricsTarget:
    """Where a run's metrics row goes: the table's reference, and the table as it is (``None``: none written yet)."""

    ref: str
    table: DataFrame | None


def _metrics_target(spark: SparkSession | None, cfg: JobConfig, report: RunReport) -> _MetricsTarget | None:
    """The metrics table ``report``'s row goes to; ``None`` when it gets none (metrics off, no session, output or
    usable run id)."""
    if not cfg.validation.metrics or spark is None or metrics_row(report) is None or not cfg.output:
        return None
    ref = cfg.metrics_ref()
    try:
        return _MetricsTarget(ref, read_input(spark, ref, "delta"))
    except Exception:  # none written yet (or not a Delta table: the append says so); never the run's failure
        return _MetricsTarget(ref, None)


def _number_attempt(cfg: JobConfig, report: RunReport, target: _MetricsTarget | None) -> None:
    """Set ``report.attempt`` (1 + the run id's attempts in the metrics table) and ``report.attempts`` (those earlier
    attempts); neither without a metrics table to count them in."""
    if target is None:
        return
    try:
        earlier = (
            read_attempts(target.table, [report.run_id])
            if target.table is not None and not _minted(cfg, report)
            else []
        )
    except Exception:  # a table of other columns: the append says so; this attempt counts as the first
        log.debug("could not read run %s's earlier attempts", report.run_id, exc_info=True)
        earlier = []
    report.attempt = max((row[ATTEMPT] for row in earlier), default=0) + 1
    report.attempts = [{k: _shown(row.get(k)) for k in _ATTEMPT_FACTS} for row in earlier] or None


def _minted(cfg: JobConfig, report: RunReport) -> bool:
    """Whether the run made its own id and resumed no staged chunk: a fresh id has no earlier attempt to read (only a
    configured id, or a rerun resuming another attempt's staging, reuses one)."""
    return not cfg.resolved_run_id() and (report.chunks or {}).get("skipped") == 0


def _append_row(spark: SparkSession | None, report: RunReport, target: _MetricsTarget | None) -> None:
    """Append ``report``'s row to ``target`` (adding the columns a table written by an earlier lakescore lacks: the
    attempt, tokens, cost); a failure is logged as a warning and never raised."""
    row = metrics_row(report)
    if target is None or spark is None or row is None:  # a target is found only with a session and a row
        return
    try:
        missing = [f for f in METRICS_SCHEMA.fields if target.table is not None and f.name not in target.table.columns]
        if missing:  # written by an earlier lakescore
            added = ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in missing)
            spark.sql(f"ALTER TABLE {TableRef.parse(target.ref).sql} ADD COLUMNS ({added})")
        write_delta(_one_row_frame(spark, row), target.ref, mode="append")
    except Exception as exc:  # the run's outcome is decided; its metrics row must never change it
        log.warning(
            "could not write run %s's row to the metrics table %s: %s", report.run_id, target.ref, one_line(exc)
        )
        log.debug("the metrics table's write failed", exc_info=True)


def record_metrics(spark: SparkSession | None, cfg: JobConfig, report: RunReport) -> None:
    """Number ``report``'s attempt and append its row to the metrics table (``validation.metrics``); nothing without
    a session or a run id. A failure is logged as a warning and never raised."""
    target = _metrics_target(spark, cfg, report)
    _number_attempt(cfg, report, target)
    _append_row(spark, report, target)


def _one_row_frame(spark: SparkSession, row: dict[str, Any]) -> DataFrame:
    """``row`` as a one-row DataFrame of :data:`METRICS_SCHEMA`, sent to the JVM as Arrow: a list of tuples would be
    a Python RDD, whose write waited for a Python worker of its own at the end of every run (BENCHMARKS.md)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    table = pa.Table.from_pylist([row], schema=to_arrow_schema(METRICS_SCHEMA))
    return spark.createDataFrame(table, METRICS_SCHEMA).coalesce(1)


def record_run(spark: SparkSession | None, cfg: JobConfig, report: RunReport) -> Path | None:
    """Number ``report``'s attempt from the metrics table (the report shows the run id's earlier attempts), then write
    it as JSON and HTML to ``cfg.report`` (when set; its path is returned) while its metrics row is appended (in a
    background thread: its Spark job waits on the scheduler, the page on matplotlib). ``spark``: the run's session;
    default: the active one."""
    spark = spark or SparkSession.getActiveSession()  # in this thread: the JVM keeps the active session per thread
    target = _metrics_target(spark, cfg, report)
    _number_attempt(cfg, report, target)
    recording = in_background("metrics", _append_row, spark, report, target)
    try:
        return write_report(report, cfg.report) if cfg.report else None
    finally:
        recording.result()


def record_stopped_run(spark: SparkSession | None, cfg: JobConfig, exc: BaseException, clock: StepClock) -> None:
    """:func:`record_metrics` for a run that raised ``exc``, stopping ``clock``'s run: ``interrupted``, ``pending`` or
    ``failed`` (:func:`~lakescore.jobs.steps.report.stopped_status`), no row counts; nothing for a run stopped before
    its plan named it."""
    stop = clock.stop_of(exc)
    if stop is None or not stop.facts.get("run_id"):
        return
    report = failure_report(cfg, exc, stopped_status(exc), clock)
    record_metrics(spark or SparkSession.getActiveSession(), cfg, report)


def read_attempts(table: DataFrame, run_ids: list[str] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """The rows of the metrics table ``table`` (of ``run_ids`` only, when given; the newest ``limit``), oldest first,
    each with its ``attempt`` (1 where a table written before attempts were numbered has none)."""
    if ATTEMPT not in table.columns:
        table = table.withColumn(ATTEMPT, F.lit(None).cast("long"))
    if run_ids is not None:
        table = table.where(F.col("run_id").isin(run_ids))
    if limit:
        table = table.orderBy(F.col("started_at").desc_nulls_last()).limit(limit)
    rows = sorted(
        (row.asDict(recursive=True) for row in table.collect()),
        key=lambda r: (r["started_at"] is None, r["started_at"] or datetime.min),
    )
    for row in rows:
        row[ATTEMPT] = row[ATTEMPT] or 1
    return rows


def read_metrics(spark: SparkSession, ref: str, limit: int | None = None) -> list[dict[str, Any]]:
    """:func:`read_attempts` of the metrics table ``ref``; ``[]`` when it cannot be read (none written yet, or another
    table by that name)."""
    try:
        return read_attempts(read_input(spark, ref, "delta"), limit=limit)
    except (TableError, AnalysisException):  # none written yet, or a table of other columns: history goes on without
        return []


def _shown(value: Any) -> Any:
    """A metrics value as the JSON report holds it: an instant as ISO text in this host's zone (Spark returns them
    naive, in local time)."""
    return value.astimezone().isoformat(timespec="seconds") if isinstance(value, datetime) else value


def _when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
