"""Steps 1–2, read and check: the session, the model source, the input and the output targets, before any compute.

:func:`open_input` resolves the model (a missing one fails in milliseconds), takes or
builds the session, reads the input lazily and checks its input contract (columns and
types, per the task's input kind) on the schema alone. :func:`check_targets` proves that
the output and errors targets can take this run's schemas. Nothing here runs a Spark job
over the input's rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType

from lakescore.jobs.config import JobConfig
from lakescore.jobs.platform.model_staging import stage_remote_model
from lakescore.jobs.platform.session import get_or_create_session
from lakescore.jobs.platform.tables import check_output_target, read_input
from lakescore.jobs.steps.score import ScoringLayout, scoring_layout
from lakescore.schemas.contracts import FeatureInputContract, TextInputContract, resolve_feature_cols
from lakescore.schemas.output import errors_schema, output_schema
from lakescore.udfs.model_source import ModelSpec, is_remote, resolve_model_dir
from lakescore.udfs.scoring_udf import WorkerCounters

__all__ = ["RunContext", "Targets", "model_spec", "open_input", "check_targets"]


@dataclass(frozen=True)
class RunContext:
    """What every later step needs: the config, the session, the checked input and how it is scored."""

    cfg: JobConfig
    spark: SparkSession
    source: DataFrame
    input_cols: tuple[str, ...]
    """The model's input columns: the text column, or the feature columns in the program's order."""
    spec: ModelSpec
    layout: ScoringLayout
    counters: WorkerCounters

    @property
    def id_field(self) -> StructField:
        return self.source.schema[self.cfg.id_col]


@dataclass(frozen=True)
class Targets:
    """The output and errors tables this run will write, checked before compute."""

    output_schema: StructType
    errors_schema: StructType
    errors_ref: str
    previous_version: Optional[int]
    """The output's Delta version before this run (``None``: it does not exist yet)."""


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
        backend=m.backend,
        quantize=m.quantize,
        cache_dir=m.cache_dir,
    )


def open_input(cfg: JobConfig, spark: Optional[SparkSession] = None) -> RunContext:
    """Resolve the model, take or build the session, read ``cfg.input`` and check its contract.

    Raises :class:`~lakescore.udfs.model_source.ModelSourceError` for a model that cannot be
    found, :class:`~lakescore.jobs.platform.tables.TableError` for an unreadable input and
    :class:`~lakescore.schemas.contracts.InputContractError` for missing or ill-typed columns.
    """
    spec = model_spec(cfg)
    if is_remote(spec.source):
        spark = spark or get_or_create_session(cfg.spark, storage_refs(cfg))[0]
        stage_remote_model(spark, spec.source, Path(cfg.model.cache_dir))
    resolve_model_dir(spec.source, spec.revision)  # a missing model fails here, in milliseconds
    spark = spark or get_or_create_session(cfg.spark, storage_refs(cfg))[0]
    source = read_input(spark, cfg.input, cfg.input_format)
    input_cols = input_columns(cfg, source)
    if not cfg.reads_text:
        spec = dataclasses.replace(spec, feature_cols=input_cols)
    return RunContext(cfg, spark, source, input_cols, spec, scoring_layout(spark, cfg), WorkerCounters(spark.sparkContext))


def check_targets(run: RunContext) -> Targets:
    """Prove the output and errors targets can take this run's schemas (``TableError`` otherwise)."""
    planned = output_schema(run.cfg.task, run.id_field)
    planned_errors = errors_schema(run.id_field)
    previous_version = check_output_target(run.spark, run.cfg.output, planned)
    errors_ref = run.cfg.errors_ref()
    check_output_target(run.spark, errors_ref, planned_errors)
    return Targets(planned, planned_errors, errors_ref, previous_version)


def input_columns(cfg: JobConfig, source: DataFrame) -> tuple[str, ...]:
    """The model's input columns, after checking the input contract on the schema (no compute)."""
    where = f"input {cfg.input!r}"
    if cfg.reads_text:
        TextInputContract(cfg.id_col, cfg.text_col).check(source.schema, where)
        return (cfg.text_col,)
    features = resolve_feature_cols(source.schema, cfg.feature_cols, cfg.feature_prefix, where)
    FeatureInputContract(cfg.id_col, features).check(source.schema, where)
    return features


def storage_refs(cfg: JobConfig) -> tuple[str, ...]:
    """Every location the run touches, so the session gets the connectors they need (e.g. S3A)."""
    return tuple(ref for ref in (cfg.input, cfg.output, cfg.errors_ref(), cfg.model.source, cfg.write.staging) if ref)
