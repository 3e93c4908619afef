"""The scoring job: read -> check -> score -> stage -> validate -> publish -> report.

Before anything is written: the model resolves; the input exists and has the
columns and types the task needs; the output and errors targets can take this
run's schema; the executors' Python workers load the model, hash its weights
(which must match ``--expect-sha256``) and score one sample, while the driver
checks the rows for null and duplicated ids. The driver never loads the model.

Then the rows are scored chunk by chunk
into a private staging table (:mod:`lakescore.jobs.steps.staging`; a rerun resumes), the staged
rows are accounted for (every input row in exactly one of output and errors),
the error rate is checked, the Great Expectations suite runs on the staged
output, and only then is the output published in one Delta commit
(``overwrite``, or ``replaceWhere run_id = ...`` for ``write.mode: replace_run``).
A run that fails a check publishes nothing to the output: readers keep the
previous version.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from pyspark.resource import ResourceProfile
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from lakescore.jobs.config import TEXT_TASKS, JobConfig
from lakescore.jobs.steps.dead_letter import check_ids, refused_rows, split_by_id, unscored_rows
from lakescore.jobs.platform.model_staging import stage_remote_model
from lakescore.jobs.platform.profiles import scoring_profile
from lakescore.jobs.platform.progress import ProgressReporter, progress_partitions
from lakescore.jobs.report import RunReport, software_versions
from lakescore.jobs.platform.session import get_or_create_session
from lakescore.jobs.steps.report_data import finish_profile, run_errors, start_profile
from lakescore.jobs.steps.staging import Staging, chunk_column, chunk_count, input_fingerprint, run_key
from lakescore.jobs.platform.tables import (
    check_output_target, column, last_commit, read_input, run_metadata, write_delta_overwrite,
)
from lakescore.schemas.contracts import FeatureInputContract, InputContractError, TextInputContract, resolve_feature_cols
from lakescore.schemas.expectations import OutputFacts, UserExpectations, validate_output
from lakescore.schemas.output import ERROR_COLUMNS, errors_schema, output_schema, prediction_columns, scored_schema
from lakescore.udfs.model_source import ModelIntegrityError, ModelSourceError, ModelSpec, is_remote, resolve_model_dir
from lakescore.udfs.scoring_udf import PREFLIGHT_SCHEMA, WorkerCounters, make_preflight_function, make_scoring_function

__all__ = [
    "run_scoring", "ModelIdentity", "new_run_id", "model_spec", "preflight_model", "ScoringLayout", "scoring_layout",
    "score_dataframe", "ErrorRateExceeded",
]

log = logging.getLogger(__name__)

_ARROW_RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
_ARROW_BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"


@dataclass(frozen=True)
class ModelIdentity:
    """Who scored: written into every row and into the report."""

    model_id: str
    revision: Optional[str]
    sha256: str


class ErrorRateExceeded(RuntimeError):
    """More rows than ``max_error_rate`` allows could not be scored; the output was not published."""


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus 8 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def model_spec(cfg: JobConfig, feature_cols: tuple[str, ...] = ()) -> ModelSpec:
    """The worker-side model key for ``cfg``."""
    m = cfg.model
    return ModelSpec(
        task=cfg.task,
        source=m.source,
        revision=m.revision,
        device=m.device,
        dtype=m.dtype,
        max_seq_length=m.max_seq_length,
        pooling=m.pooling,
        normalize=m.normalize,
        allow_pickle=m.allow_pickle,
        trust_remote_code=m.trust_remote_code,
        expect_sha256=m.expect_sha256.lower() if m.expect_sha256 else None,
        feature_cols=feature_cols,
    )


def preflight_model(
    spark: SparkSession,
    spec: ModelSpec,
    layout: "ScoringLayout",
    counters: Optional[WorkerCounters] = None,
    job_group: Optional[str] = None,
) -> ModelIdentity:
    """Load the model where it will score, in the executors' Python workers, and score one sample there.

    Runs one small task per scoring slot (``layout.partitions``, else the cluster's
    parallelism) under the scoring stage's resource profile, before any input row
    is scored: a model that cannot load fails the run here, and the workers that
    score next find it in their cache. The driver itself never imports torch.

    Raises :class:`~lakescore.udfs.model_source.ModelIntegrityError` when a worker's weights
    differ from ``spec.expect_sha256`` or two workers hashed different weights, and
    :class:`~lakescore.udfs.model_source.ModelSourceError` naming the host when a worker could
    not load the model or score the sample. Returns the identity every worker agreed on.
    """
    sc = spark.sparkContext
    if job_group:
        sc.setJobGroup(job_group, "lakescore: load the model on the executors", interruptOnCancel=True)
    tasks = layout.partitions or sc.defaultParallelism
    probe = make_preflight_function(spec, counters)
    rows = spark.range(tasks, numPartitions=tasks).mapInArrow(probe, PREFLIGHT_SCHEMA, profile=layout.profile).collect()
    failed = [r for r in rows if r.error_type]
    if failed:
        r = failed[0]
        if r.error_type == ModelIntegrityError.__name__:
            raise ModelIntegrityError(r.error)
        raise ModelSourceError(
            f"model {spec.source!r} failed to load or score a sample on executor {r.host} (pid {r.pid}): "
            f"{r.error_type}: {r.error}"
        )
    digests = sorted({r.sha256 for r in rows})
    if len(digests) != 1:
        hosts = ", ".join(sorted({f"{r.host}: {r.sha256}" for r in rows}))
        raise ModelIntegrityError(f"executors found different weights for model {spec.source!r} ({hosts}); refusing to score")
    loads = sorted(r.seconds for r in rows)
    log.info(
        "model ready in %d executor task(s) on %s (slowest %.1f s; weights sha256 %s)",
        len(rows), ", ".join(sorted({r.device for r in rows})), loads[-1], digests[0],
    )
    return ModelIdentity(model_id=spec.source, revision=rows[0].revision, sha256=digests[0])


@dataclass(frozen=True)
class ScoringLayout:
    """Where the scoring stage runs: its resource profile (``None``: the default) and task count (``None``: as read)."""

    profile: Optional[ResourceProfile]
    partitions: Optional[int]


def scoring_layout(spark: SparkSession, cfg: JobConfig) -> ScoringLayout:
    """The scoring stage's layout for ``cfg`` on this session (:mod:`lakescore.jobs.platform.profiles` decides the profile, once)."""
    profile = scoring_profile(spark, cfg.resources.scoring) if cfg.resources.scoring.requested else None
    partitions = (cfg.resources.scoring.partitions if profile is not None else None) or cfg.scoring.partitions
    return ScoringLayout(profile, partitions)


def score_dataframe(
    df: DataFrame,
    cfg: JobConfig,
    spec: ModelSpec,
    id_col: str,
    input_cols: tuple[str, ...],
    counters: Optional[WorkerCounters] = None,
    layout: Optional[ScoringLayout] = None,
) -> DataFrame:
    """Lazily score ``df``: columns per :func:`lakescore.schemas.output.scored_schema` (id, predictions,
    ``model_sha256``, ``_reason``/``_error``/``_input`` for unscored rows).

    The scoring stage runs on ``scoring.partitions`` tasks (default: the cluster's
    parallelism when the input has fewer partitions), so a one-file input still
    uses every core.

    With ``resources.scoring`` set and a master that honours resource profiles, the
    scoring stage runs with that profile (:mod:`lakescore.jobs.platform.profiles`) on
    ``resources.scoring.partitions`` (else as above) tasks, always behind a
    repartition: a profile covers a whole stage, and reading and preprocessing
    must keep the default, full-CPU parallelism. Elsewhere (``local[...]``) a
    warning is logged and the stage runs without the profile.
    """
    layout = layout or scoring_layout(df.sparkSession, cfg)
    profile, partitions = layout.profile, layout.partitions
    target = partitions or df.sparkSession.sparkContext.defaultParallelism
    if partitions or profile is not None or df.rdd.getNumPartitions() < target:
        df = df.repartition(target)
    schema = scored_schema(cfg.task, df.schema[id_col])
    scorer = make_scoring_function(
        spec,
        id_col=id_col,
        input_cols=input_cols,
        schema=schema,
        max_tokens=cfg.scoring.max_batch_tokens,
        max_rows=cfg.scoring.max_batch_rows,
        counters=counters,
    )
    return df.select(column(id_col), *[column(c) for c in input_cols]).mapInArrow(scorer, schema, profile=profile)


def run_scoring(cfg: JobConfig, spark: Optional[SparkSession] = None) -> RunReport:
    """Run one scoring job described by ``cfg`` and return its :class:`~lakescore.jobs.report.RunReport`.

    Raises :class:`~lakescore.jobs.config.ConfigError`, :class:`~lakescore.schemas.contracts.InputContractError`,
    :class:`~lakescore.jobs.platform.tables.TableError` or :class:`~lakescore.udfs.model_source.ModelSourceError` before any
    compute when the run cannot succeed, :class:`~lakescore.jobs.platform.tables.WriteConflictError` when a
    concurrent run won the publish. A failed validation or an exceeded error rate does not
    raise: the report's ``status`` is ``validation_failed`` / ``error_rate_exceeded`` and
    the output is untouched.
    """
    cfg.require_for_scoring()
    started = time.perf_counter()
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    steps: dict[str, float] = {}

    if cfg.validation.enabled:
        # GX takes ~5 s of CPU to import: meanwhile the JVM starts, which leaves a core mostly idle.
        threading.Thread(target=importlib.import_module, args=("great_expectations",), daemon=True).start()
    t = time.perf_counter()
    spec = model_spec(cfg)
    if is_remote(spec.source):
        spark = spark or get_or_create_session(cfg.spark, _storage_refs(cfg))[0]
        stage_remote_model(spark, spec.source, Path(cfg.model.cache_dir))
    model_dir = resolve_model_dir(spec.source, spec.revision)  # a missing model fails here, in milliseconds
    spark = spark or get_or_create_session(cfg.spark, _storage_refs(cfg))[0]
    source = read_input(spark, cfg.input, cfg.input_format)
    input_cols = _input_columns(cfg, source)
    if cfg.task == "tabular":
        spec = dataclasses.replace(spec, feature_cols=input_cols)
    layout = scoring_layout(spark, cfg)
    counters = WorkerCounters(spark.sparkContext)
    steps["startup"] = time.perf_counter() - t

    # The executors load the model (their Python workers import torch, hash the weights,
    # score a sample) while the driver checks the targets and the ids below.
    preflight_group = f"lakescore-preflight-{uuid.uuid4().hex[:12]}"
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakescore-preflight") as pool:
        preflight = pool.submit(preflight_model, spark, spec, layout, counters, preflight_group)
        try:
            t = time.perf_counter()
            id_field = source.schema[cfg.id_col]
            planned = output_schema(cfg.task, id_field)
            planned_errors = errors_schema(id_field)
            previous_version = check_output_target(spark, cfg.output, planned)
            errors_ref = cfg.errors_ref()
            check_output_target(spark, errors_ref, planned_errors)
            steps["read_check"] = time.perf_counter() - t

            t = time.perf_counter()  # "prepare": the id check, the executors' model load (overlapped), the plan
            ids = check_ids(source, cfg.id_col)
            if ids.rows == 0:
                raise InputContractError(f"input {cfg.input!r} has no rows; nothing to score (nothing was written)")
            scorable, refused = split_by_id(source, cfg.id_col, ids)
        except BaseException:
            spark.sparkContext.cancelJobGroup(preflight_group)
            raise
        identity = preflight.result()
    # Workers must load exactly the weights the preflight hashed, or fail their task.
    spec = dataclasses.replace(spec, expect_sha256=identity.sha256)

    scorable_rows = ids.rows - ids.refused_rows
    chunks = chunk_count(scorable_rows, cfg.write.chunk_rows)
    run_id = cfg.resolved_run_id() or new_run_id()
    key = run_key(
        {
            "input": input_fingerprint(source),
            "output": cfg.output,
            "task": cfg.task,
            "model_sha256": identity.sha256,
            "spec": dataclasses.asdict(dataclasses.replace(spec, device="", expect_sha256=None)),
            "id_col": cfg.id_col,
            "inputs": input_cols,
            "chunks": chunks,
            "run_id": cfg.resolved_run_id(),
        }
    )
    staging = Staging.for_output(spark, cfg.output, cfg.write.staging, key, chunks)
    done = staging.committed_chunks()
    steps["prepare"] = time.perf_counter() - t
    log.info(
        "scoring %d rows of %s into %s (run %s, %d chunk(s), %d already staged)",
        ids.rows, cfg.input, cfg.output, run_id, chunks, len(done),
    )
    if ids.refused_rows:
        log.warning("%d row(s) with a null or duplicated id go to %s", ids.refused_rows, errors_ref)

    t = time.perf_counter()
    todo = [c for c in range(chunks) if c not in done]
    # [issue 16: progress] a few tasks per slot unless configured, so progress moves before the first wave ends
    if layout.partitions is None:
        wanted = progress_partitions(math.ceil(scorable_rows / chunks), spark.sparkContext.defaultParallelism)
        if scorable.rdd.getNumPartitions() < wanted:
            layout = dataclasses.replace(layout, partitions=wanted)
    # [/issue 16]
    with _arrow_settings(spark, cfg), ProgressReporter(
        spark.sparkContext, counters.rows, _rows_todo(scorable_rows, chunks, len(todo)), cfg.progress_seconds,
        chunks=chunks,  # [issue 16: progress]
    ) as progress:
        for chunk in todo:
            progress.chunk(chunk)  # [issue 16: progress]
            part = scorable if chunks == 1 else scorable.where(chunk_column(cfg.id_col, chunks) == chunk)
            staging.commit_chunk(score_dataframe(part, cfg, spec, cfg.id_col, input_cols, counters, layout), chunk)
            log.info("chunk %d/%d staged", chunk + 1, chunks)
    steps["score_stage"] = time.perf_counter() - t
    throughput = progress.samples()  # [issue 16: progress] (seconds, rows) for the HTML report

    t = time.perf_counter()
    staged = staging.rows()
    reason_col = ERROR_COLUMNS[0]
    by_reason = {r[0]: int(r[1]) for r in staged.groupBy(reason_col).count().collect()}
    staged_rows = sum(by_reason.values())
    unscored = staged_rows - by_reason.get(None, 0)
    reasons = {k: v for k, v in by_reason.items() if k is not None}
    if ids.null_id_rows:
        reasons["null_id"] = ids.null_id_rows
    if ids.refused_rows - ids.null_id_rows:
        reasons["duplicate_id"] = ids.refused_rows - ids.null_id_rows
    if staged_rows != scorable_rows:
        raise RuntimeError(
            f"staging {staging.location} holds {staged_rows} rows for {scorable_rows} scorable input rows; "
            "another run of the same input is probably writing it at the same time. Nothing was published; rerun."
        )
    output_rows = staged_rows - unscored
    error_rows = ids.refused_rows + unscored
    error_rate = error_rows / ids.rows
    published = staged.where(F.col(reason_col).isNull()).select(
        column(cfg.id_col),
        *[F.col(name) for name in prediction_columns(cfg.task)],
        F.lit(identity.model_id).alias("model_id"),
        F.lit(identity.revision).cast("string").alias("model_revision"),
        F.col("model_sha256"),
        F.lit(run_id).alias("run_id"),
    )
    report = RunReport(
        run_id=run_id,
        status="running",
        task=cfg.task,
        input=cfg.input,
        output=cfg.output,
        model_id=identity.model_id,
        model_revision=identity.revision,
        model_sha256=identity.sha256,
        input_rows=ids.rows,
        output_rows=output_rows,
        error_rows=error_rows,
        errors_table=errors_ref,
        error_reasons=dict(sorted(reasons.items())),
        previous_delta_version=previous_version,
        started_at=started_at,
        chunks={"total": chunks, "skipped": len(done), "staging": staging.location},
        spark={"master": spark.sparkContext.master, "app_id": spark.sparkContext.applicationId},
        workers={
            "model_loads": counters.model_loads.value,
            "arrow_batches": counters.arrow_batches.value,
            "rows_scored": counters.rows.value,
            "model_seconds": round(counters.model_seconds.value, 3),
            "budget_halvings": counters.budget_halvings.value,
        },
    )

    # The errors table is written whatever validation says (it explains a failed run), so its
    # Delta write runs in a second thread while GX validates: both mostly wait on the JVM.
    replace_where = f"run_id = '{run_id}'" if cfg.write.mode == "replace_run" else None
    partition_by = "run_id" if cfg.write.mode == "replace_run" else None
    errors = unscored_rows(staged, cfg.id_col, run_id)
    if ids.refused_rows:
        errors = refused_rows(refused, cfg.id_col, _raw_input(cfg, input_cols), run_id).unionByName(errors)
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakescore-errors")
    tag = run_metadata(run_id, str(Path(cfg.report).expanduser().resolve()) if cfg.report else None)  # [issue 16: history]
    errors_written = writer.submit(write_delta_overwrite, errors, errors_ref, replace_where, partition_by, tag)
    writer.shutdown(wait=False)

    # [issue 16: report data] samples for the HTML report (limit reads, no full pass), read while GX validates
    # and before publishing drops the staging table the predictions come from.
    profiling = start_profile(
        inputs=source.select(*[column(c) for c in input_cols]),
        predictions=published.select(*[F.col(name) for name in prediction_columns(cfg.task)]),
        errors=(lambda: run_errors(spark, errors_ref, errors_written.result().version, run_id)) if error_rows else None,
        throughput=throughput,
        model_dir=model_dir,
    )
    # [/issue 16]

    if cfg.validation.enabled and error_rate <= cfg.max_error_rate:
        facts = OutputFacts(
            schema=planned,
            expected_rows=output_rows,
            prediction_columns=tuple(prediction_columns(cfg.task)),
            model_sha256=identity.sha256,
            run_id=run_id,
            user=UserExpectations(
                min_rows=cfg.validation.min_rows,
                value_ranges=dict(cfg.validation.value_ranges),
                max_null_fraction=dict(cfg.validation.max_null_fraction),
            ),
        )
        report.validation = validate_output(published, facts).as_dict()
    steps["validate"] = time.perf_counter() - t
    t = time.perf_counter()  # [issue 16: report data] what the samples add after validation
    report.versions = software_versions(spark.version)
    report.profile = finish_profile(profiling)
    steps["report_data"] = time.perf_counter() - t  # [/issue 16]

    t = time.perf_counter()
    report.errors_delta_version = errors_written.result().version
    if error_rate > cfg.max_error_rate:
        report.status = "error_rate_exceeded"
        report.error = (
            f"{error_rows} of {ids.rows} rows ({error_rate:.4%}) could not be scored, above max_error_rate "
            f"{cfg.max_error_rate:.4%}; see {errors_ref}. The output was not published."
        )
    elif report.validation is not None and not report.validation["success"]:
        report.status = "validation_failed"
        report.error = "the output failed validation and was not published"
    else:
        commit = write_delta_overwrite(published, cfg.output, replace_where, partition_by, tag)  # [issue 16: tag]
        if commit.rows is not None and commit.rows != output_rows:
            raise RuntimeError(f"published {commit.rows} rows to {cfg.output} but validated {output_rows}")
        report.delta_version = commit.version
        report.status = "succeeded"
        staging.drop()
    steps["publish"] = time.perf_counter() - t
    if report.input_rows != report.output_rows + report.error_rows:  # accounting, checked every run
        raise RuntimeError(f"row accounting broken: {report.input_rows} in, {report.output_rows} out, {report.error_rows} errors")

    report.seconds = round(time.perf_counter() - started, 3)
    report.rows_per_second = round(ids.rows / report.seconds, 2) if report.seconds else None
    report.step_seconds = {k: round(v, 3) for k, v in steps.items()}
    report.finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return report


def _storage_refs(cfg: JobConfig) -> tuple[str, ...]:
    """Every location the run touches, so the session gets the connectors they need (e.g. S3A)."""
    return tuple(ref for ref in (cfg.input, cfg.output, cfg.errors_ref(), cfg.model.source, cfg.write.staging) if ref)


def _input_columns(cfg: JobConfig, source: DataFrame) -> tuple[str, ...]:
    """The model's input columns, after checking the input contract on the schema (no compute)."""
    where = f"input {cfg.input!r}"
    if cfg.task in TEXT_TASKS:
        TextInputContract(cfg.id_col, cfg.text_col).check(source.schema, where)
        return (cfg.text_col,)
    features = resolve_feature_cols(source.schema, cfg.feature_cols, cfg.feature_prefix, where)
    FeatureInputContract(cfg.id_col, features).check(source.schema, where)
    return features


def _raw_input(cfg: JobConfig, input_cols: tuple[str, ...]) -> Column:
    if cfg.task in TEXT_TASKS:
        return column(input_cols[0])
    return F.to_json(F.struct(*[column(c) for c in input_cols]))


def _rows_todo(rows: int, chunks: int, todo: int) -> int:
    return rows if todo == chunks else round(rows * todo / chunks)


class _arrow_settings:
    """Set the Arrow batch bounds for the scoring stage; a taken session (Databricks) gets its own back."""

    def __init__(self, spark: SparkSession, cfg: JobConfig) -> None:
        self._spark = spark
        self._confs = {
            _ARROW_RECORDS_CONF: str(cfg.scoring.arrow_max_records_per_batch),
            _ARROW_BYTES_CONF: str(cfg.scoring.arrow_max_bytes_per_batch),
        }

    def __enter__(self):
        self._previous = {key: self._spark.conf.get(key, None) for key in self._confs}
        for key, value in self._confs.items():
            self._spark.conf.set(key, value)
        return self

    def __exit__(self, *exc) -> None:
        for key, value in self._previous.items():
            if value is None:
                self._spark.conf.unset(key)
            else:
                self._spark.conf.set(key, value)
