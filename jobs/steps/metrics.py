"""Step 8, report (metrics): one row per run in the output's metrics table, published or not.

The row holds the run's status, times and row counts, the prediction profile of its rows (label shares, deciles of
the score, of the embeddings' norms, of the generated texts' lengths: :mod:`lakescore.jobs.steps.drift`), the drift
figures and the baseline version. Whoever runs the job writes it beside the run's JSON and HTML report
(:func:`record_run`; :func:`record_stopped_run` for a run that raised): the CLI and the Python API's ``score``.
Every run that got as far as its plan (which names the run id) has one: succeeded, refused by a check
(``validation_failed``, ``error_rate_exceeded``, ``drift_exceeded``), ``failed`` or ``interrupted``; a run refused
before compute (a bad setting, input or model) has none. The write replaces the run id's row (``replaceWhere``), so
a rerun of one run id leaves one row, its last outcome. A failed write is logged and changes nothing about the run.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.errors import AnalysisException

from lakescore.jobs.platform.background import in_background
from lakescore.jobs.config import RUN_ID, JobConfig
from lakescore.jobs.platform.interrupts import was_interrupted
from lakescore.jobs.platform.tables import TableError, read_input, write_delta
from lakescore.jobs.report import RunReport, one_line, write_report
from lakescore.jobs.steps.report import failure_report

__all__ = ["METRICS_SCHEMA", "metrics_row", "record_metrics", "record_run", "record_stopped_run", "read_metrics"]

log = logging.getLogger(__name__)

_DECILES = T.ArrayType(T.DoubleType())
METRICS_SCHEMA = T.StructType([
    T.StructField("run_id", T.StringType()),
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
])
"""The metrics table's columns: the same for every task (a profile the task does not have is null)."""

_PROFILE = ("label_shares", "score_deciles", "embedding_norm_deciles", "text_length_deciles")
_FIGURES = ("label_js", "score_psi", "id_cosine_p5")


def metrics_row(report: RunReport) -> Optional[dict[str, Any]]:
    """The metrics row of ``report`` (:data:`METRICS_SCHEMA`'s fields); ``None`` for a run without a usable id."""
    if not report.run_id or not RUN_ID.fullmatch(report.run_id):  # the id sits in the write's replaceWhere predicate
        return None
    drift = report.drift or {}
    profile = (drift.get("profiles") or {}).get("run") or {}
    figures = drift.get("figures") or {}
    return {
        "run_id": report.run_id, "status": report.status, "task": report.task, "model_id": report.model_id,
        "model_sha256": report.model_sha256, "started_at": _when(report.started_at),
        "finished_at": _when(report.finished_at), "seconds": report.seconds, "input_rows": report.input_rows,
        "output_rows": report.output_rows, "error_rows": report.error_rows, "rows_kept": report.rows_kept,
        "delta_version": report.delta_version, "baseline_version": drift.get("baseline_version"),
        **{name: profile.get(name) for name in _PROFILE}, **{name: figures.get(name) for name in _FIGURES},
        "drift_exceeded": drift.get("exceeded") if drift else None, "drift_note": drift.get("note"),
        "error": report.error,
    }


def record_metrics(spark: Optional[SparkSession], cfg: JobConfig, report: RunReport) -> None:
    """Write ``report``'s row to the metrics table (``validation.metrics``), replacing an earlier row of its run id;
    nothing without a session or a run id. A failure is logged as a warning and never raised."""
    row = metrics_row(report)
    if not cfg.validation.metrics or spark is None or row is None or not cfg.output:
        return
    target = cfg.metrics_ref()
    try:
        write_delta(_one_row_frame(spark, row), target, replace_where=f"run_id = '{report.run_id}'")
    except Exception as exc:  # the run's outcome is decided; its metrics row must never change it
        log.warning("could not write run %s's row to the metrics table %s: %s", report.run_id, target, one_line(exc))
        log.debug("the metrics table's write failed", exc_info=True)


def _one_row_frame(spark: SparkSession, row: dict[str, Any]) -> DataFrame:
    """``row`` as a one-row DataFrame of :data:`METRICS_SCHEMA`, sent to the JVM as Arrow: a list of tuples would be
    a Python RDD, whose write waited for a Python worker of its own at the end of every run (BENCHMARKS.md)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    table = pa.Table.from_pylist([row], schema=to_arrow_schema(METRICS_SCHEMA))
    return spark.createDataFrame(table, METRICS_SCHEMA).coalesce(1)


def record_run(spark: Optional[SparkSession], cfg: JobConfig, report: RunReport) -> Optional[Path]:
    """Write ``report`` as JSON and HTML to ``cfg.report`` (when set; its path is returned) while its metrics row is
    written (:func:`record_metrics`, in a background thread: its Spark job waits on the scheduler, the page on
    matplotlib). ``spark``: the run's session; default: the active one."""
    spark = spark or SparkSession.getActiveSession()  # in this thread: the JVM keeps the active session per thread
    recording = in_background("metrics", record_metrics, spark, cfg, report)
    try:
        return write_report(report, cfg.report) if cfg.report else None
    finally:
        recording.result()


def record_stopped_run(spark: Optional[SparkSession], cfg: JobConfig, exc: BaseException) -> None:
    """:func:`record_metrics` for a run that raised ``exc``: ``interrupted`` or ``failed``, no row counts; nothing for
    a run stopped before its plan named it."""
    if not getattr(exc, "lakescore_facts", {}).get("run_id"):
        return
    report = failure_report(cfg, exc, "interrupted" if was_interrupted(exc) else "failed")
    record_metrics(spark or SparkSession.getActiveSession(), cfg, report)


def read_metrics(spark: SparkSession, ref: str, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The metrics rows of ``run_ids`` by run id; ``{}`` when the table cannot be read (none written yet, or another
    table by that name)."""
    if not run_ids:
        return {}
    try:
        rows = read_input(spark, ref, "delta").where(F.col("run_id").isin(run_ids)).collect()
    except (TableError, AnalysisException):  # none written yet, or a table of other columns: history goes on without
        return {}
    return {row["run_id"]: row.asDict(recursive=True) for row in rows}


def _when(text: Optional[str]) -> Optional[datetime]:
    return datetime.fromisoformat(text) if text else None
