"""The scoring job: read -> check -> score -> write -> validate -> report.

Everything that can be wrong about the configuration, the model or the input
is checked before Spark computes anything: the model directory resolves and
its weights hash, the model loads and scores one sample on the driver, the
input exists and has the columns and types the task needs, and the output can
take an overwrite with this run's schema.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.config import JobConfig
from jobs.progress import ProgressReporter
from jobs.session import get_or_create_session
from jobs.report import RunReport
from jobs.tables import check_output_target, column, read_delta_version, read_input, write_delta_overwrite
from schemas.contracts import TextInputContract
from schemas.expectations import OutputFacts, validate_output
from schemas.output import output_schema, prediction_columns
from udfs.batching import BatchPolicy
from udfs.model_cache import get_model
from udfs.model_source import ModelSpec, resolve_model_dir
from udfs.scoring_udf import WorkerCounters, make_scoring_udf

__all__ = ["run_scoring", "ModelIdentity", "new_run_id"]

log = logging.getLogger(__name__)

_ARROW_RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
_ARROW_BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"


@dataclass(frozen=True)
class ModelIdentity:
    """Who scored: written into every row and into the report."""

    model_id: str
    revision: Optional[str]
    sha256: str


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus 8 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def model_spec(cfg: JobConfig) -> ModelSpec:
    """The worker-side model key for ``cfg``."""
    m = cfg.model
    return ModelSpec(
        task=cfg.task,
        source=m.source,
        revision=m.revision,
        device=m.device,
        max_seq_length=m.max_seq_length,
        pooling=m.pooling,
        normalize=m.normalize,
    )


def preflight_model(spec: ModelSpec) -> ModelIdentity:
    """Load the model on the driver and score one text, so a broken model fails before any compute."""
    loaded, _ = get_model(spec)
    sample = loaded.scorer.score(["lakescore preflight"])
    if sample.shape[0] != 1:
        raise RuntimeError(f"model {spec.source!r} returned {sample.shape[0]} rows for one text")
    return ModelIdentity(model_id=spec.source, revision=spec.revision, sha256=loaded.sha256)


def score_dataframe(
    df: DataFrame,
    cfg: JobConfig,
    spec: ModelSpec,
    identity: ModelIdentity,
    run_id: str,
    counters: Optional[WorkerCounters] = None,
) -> DataFrame:
    """Lazily add the task's predictions and identity columns to ``df`` (columns per :func:`output_schema`).

    The scoring stage runs on ``scoring.partitions`` tasks (default: the cluster's
    parallelism when the input has fewer partitions), so a one-file input still
    uses every core.
    """
    target = cfg.scoring.partitions or df.sparkSession.sparkContext.defaultParallelism
    if cfg.scoring.partitions or df.rdd.getNumPartitions() < target:
        df = df.repartition(target)
    policy = BatchPolicy(max_tokens=cfg.scoring.max_tokens_for(spec.device), max_rows=cfg.scoring.max_batch_rows)
    udf = make_scoring_udf(spec, policy=policy, counters=counters)
    scored = df.select(column(cfg.id_col), udf(column(cfg.text_col)).alias("_scored"))
    return scored.select(
        column(cfg.id_col),
        *[F.col(f"_scored.{name}").alias(name) for name in prediction_columns(cfg.task)],
        F.lit(identity.model_id).alias("model_id"),
        F.col("_scored.model_sha256").alias("model_sha256"),
        F.lit(run_id).alias("run_id"),
    )


def run_scoring(cfg: JobConfig, spark: Optional[SparkSession] = None):
    """Run one scoring job described by ``cfg`` and return its :class:`~jobs.report.RunReport`.

    Raises :class:`~jobs.config.ConfigError`, :class:`~schemas.contracts.InputContractError`,
    :class:`~jobs.tables.TableError` or :class:`~udfs.model_source.ModelSourceError` before any
    compute when the run cannot succeed. A failed validation does not raise: the report's
    ``status`` is ``validation_failed``.
    """
    cfg.require_for_scoring()
    started = time.perf_counter()
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run_id = cfg.run_id or new_run_id()
    steps: dict[str, float] = {}

    spec = model_spec(cfg)
    t = time.perf_counter()
    resolve_model_dir(spec.source, spec.revision)  # a missing model fails here, in milliseconds
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakescore-preflight") as pool:
        # Loading torch and the model (seconds) overlaps the JVM start (seconds more).
        preflight = pool.submit(preflight_model, spec)
        if spark is None:
            spark, _ = get_or_create_session(cfg.spark, (cfg.input, cfg.output))
        identity = preflight.result()
    steps["startup"] = time.perf_counter() - t
    log.info("model %s ready on the driver (weights sha256 %s)", identity.model_id, identity.sha256)
    if cfg.validation.enabled:  # GX takes seconds to import: do it while Spark scores
        threading.Thread(target=importlib.import_module, args=("great_expectations",), daemon=True).start()

    t = time.perf_counter()
    source = read_input(spark, cfg.input, cfg.input_format)
    TextInputContract(cfg.id_col, cfg.text_col).check(source.schema, f"input {cfg.input!r}")
    planned = output_schema(cfg.task, source.schema[cfg.id_col])
    previous_version = check_output_target(spark, cfg.output, planned)
    steps["read_check"] = time.perf_counter() - t

    t = time.perf_counter()
    input_rows = source.count()
    steps["count_input"] = time.perf_counter() - t
    log.info("scoring %d rows of %s into %s (run %s)", input_rows, cfg.input, cfg.output, run_id)

    counters = WorkerCounters(spark.sparkContext)
    arrow_confs = {
        _ARROW_RECORDS_CONF: str(cfg.scoring.arrow_max_records_per_batch),
        _ARROW_BYTES_CONF: str(cfg.scoring.arrow_max_bytes_per_batch),
    }
    previous_confs = {key: spark.conf.get(key, None) for key in arrow_confs}
    for key, value in arrow_confs.items():
        spark.conf.set(key, value)
    try:
        t = time.perf_counter()
        scored = score_dataframe(source, cfg, spec, identity, run_id, counters)
        with ProgressReporter(spark.sparkContext, counters.rows, input_rows, cfg.progress_seconds):
            commit = write_delta_overwrite(scored, cfg.output)
        steps["score_write"] = time.perf_counter() - t
    finally:  # a taken session (Databricks, notebooks) gets its own settings back
        for key, value in previous_confs.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    log.info("wrote %s rows to %s as Delta version %d", commit.rows, cfg.output, commit.version)

    report = RunReport(
        run_id=run_id,
        status="running",
        task=cfg.task,
        input=cfg.input,
        output=cfg.output,
        model_id=identity.model_id,
        model_revision=identity.revision,
        model_sha256=identity.sha256,
        input_rows=input_rows,
        output_rows=commit.rows,
        delta_version=commit.version,
        previous_delta_version=previous_version,
        started_at=started_at,
        spark={"master": spark.sparkContext.master, "app_id": spark.sparkContext.applicationId},
        workers={
            "model_loads": counters.model_loads.value,
            "arrow_batches": counters.arrow_batches.value,
            "rows_scored": counters.rows.value,
            "model_seconds": round(counters.model_seconds.value, 3),
        },
    )

    t = time.perf_counter()
    written = read_delta_version(spark, cfg.output, commit.version)
    if cfg.validation.enabled:
        facts = OutputFacts(
            schema=planned,
            expected_rows=input_rows,
            prediction_columns=tuple(prediction_columns(cfg.task)),
            model_sha256=identity.sha256,
            run_id=run_id,
        )
        outcome = validate_output(written, facts)
        report.validation = outcome.as_dict()
    if report.output_rows is None:
        report.output_rows = written.count()
    steps["validate"] = time.perf_counter() - t

    report.seconds = round(time.perf_counter() - started, 3)
    report.rows_per_second = round(input_rows / report.seconds, 2) if report.seconds else None
    report.step_seconds = {k: round(v, 3) for k, v in steps.items()}
    report.status = "succeeded" if report.validation is None or report.validation["success"] else "validation_failed"
    report.finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return report

