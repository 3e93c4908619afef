"""The job configuration schema: YAML file, then ``--set`` overrides, then CLI flags.

This schema is the one place an option is declared: its type, bounds, default and one-sentence
description (the attribute docstring), and its CLI flag when it has one. The CLI's flags, the
Python API's keywords, the worker's model spec and the reference in ``docs/configuration.md``
all derive from it (:func:`config_options`). :func:`load_config` validates the whole tree before
any Spark or model work starts, so a typo fails in milliseconds with a message naming the key.

Layout of a config file (all keys optional except where the job needs them)::

    input: reviews.raw            # metastore table, or a Parquet / Delta path
    output: reviews.embeddings    # metastore table, or a Delta path
    task: embed
    id_col: review_id
    text_col: body
    model: /models/all-MiniLM-L6-v2   # a section's shorthand: its source
    spark:
      master: local[*]
    scoring:
      max_batch_tokens: 1024
    resources:
      scoring: {task_cpus: 4, task_gpus: 1}

Errors: :class:`ConfigError` (a :class:`ValueError`), one line naming the dotted key.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Sequence

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from lakescore.udfs.batching import default_max_tokens
from lakescore.udfs.generate_options import GenerateOptions
from lakescore.udfs.model_options import BACKENDS, DEVICES, DTYPES, QUANTIZATIONS, ModelOptions
from lakescore.udfs.settings import (
    JOB_ONLY, ConfigError, Fraction, Number, Section, Text, as_number, as_text, checked, cli, invalid,
)
from lakescore.udfs.registry import (
    TASK_MODEL_OPTIONS, TASK_NAMES, TASK_OPTION_SECTIONS, TASK_VALIDATION_OPTIONS, TASKS as _TASKS, get_task,
)

__all__ = [
    "ConfigError", "JobConfig", "Option", "config_from_mapping", "config_options", "load_config", "spark_size_mib",
    "TASKS", "WRITE_MODES", "INPUT_FORMATS", "DEDUP_MODES", "DEVICES", "DTYPES", "BACKENDS", "QUANTIZATIONS",
]

TASKS = TASK_NAMES
"""Scoring tasks this version can run (:mod:`lakescore.udfs.registry`)."""
WRITE_MODES = ("overwrite", "replace_run", "incremental")
RUN_ID_MAX = 128
RUN_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_ID_MAX - 1}}}")
"""What a run id may be: safe as a partition directory name, in a SQL string literal and on one log line."""
INPUT_FORMATS = ("auto", "delta", "parquet", "images")
FILE_COLUMNS = {"id_col": "path", "image_col": "content"}
"""``input_format`` ``images``: the columns of Spark's ``binaryFile`` source the id and the image default to (each
file's path and its bytes)."""
DEDUP_MODES = ("auto", "on", "off")
LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE")


# --- Value types: what YAML, --set, flags and the Python API may hand each kind of setting -------------------


def _items(value: Any) -> Any:
    if isinstance(value, str):  # --feature-cols a,b,c
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return tuple(value) if isinstance(value, list) else value


def _id_columns(value: Any) -> Any:
    """One id column stays a string; several (a YAML list, ``--id-col user_id,item_id``, the API's list) a tuple. A
    comma cannot be in a column name Delta stores, so splitting on it is unambiguous."""
    if isinstance(value, str) and "," in value:
        value = _items(value)
    if isinstance(value, list):
        value = tuple(as_text(v) for v in value)
    return value[0] if isinstance(value, tuple) and len(value) == 1 else value


def _id_columns_problem(value: Any) -> Optional[str]:
    if isinstance(value, tuple):
        if not value:
            return "must name at least one column"
        repeated = sorted({c for c in value if value.count(c) > 1})
        if repeated:
            return f"names {repeated[0]!r} twice"
    return None


def _string_keys(value: Any) -> Any:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else value


def _spark_conf_value(value: Any) -> Any:
    """Spark confs are strings on the JVM side; YAML may have parsed ``8`` or ``true``."""
    if isinstance(value, (Mapping, list)) or value is None:
        raise invalid(f"must be a single value (Spark conf keys are written whole), got {value!r}")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _min_max(bounds: tuple[float, ...]) -> tuple[float, ...]:
    if len(bounds) != 2 or bounds[0] > bounds[1]:
        raise invalid(f"must be [min, max] with min <= max, got {list(bounds)}")
    return bounds


Names = Annotated[tuple[Text, ...], BeforeValidator(_items)]
TaskName = Literal[TASK_NAMES]
OnOff = Annotated[Literal[DEDUP_MODES], BeforeValidator(lambda v: ("on" if v else "off") if isinstance(v, bool) else v)]
"""``on`` / ``off``, which YAML 1.1 reads as booleans."""
LogLevel = Annotated[Literal[LOG_LEVELS], BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)]
SparkConf = Annotated[dict[str, Annotated[str, BeforeValidator(_spark_conf_value)]], BeforeValidator(_string_keys)]
ValueRanges = Annotated[
    dict[str, Annotated[tuple[Number, ...], BeforeValidator(_items), AfterValidator(_min_max)]], BeforeValidator(_string_keys)
]
NullFractions = Annotated[dict[str, Fraction], BeforeValidator(_string_keys)]


IdColumns = Annotated[typing.Union[Text, tuple[Text, ...]], BeforeValidator(_id_columns), checked(_id_columns_problem)]
"""An id: one column's name, or a list of names that together identify a row (composite id)."""


# --- The schema ------------------------------------------------------------------------------------------------


ModelConfig = ModelOptions
"""The ``model`` section, declared on the executors' side (:mod:`lakescore.udfs.model_options`)."""


class SparkConfig(Section):
    """How the SparkSession is built when lakescore builds it (never on Databricks or under spark-submit)."""

    master: Text = Field("local[*]", json_schema_extra=cli("--master", sweep=True))
    """The Spark master when lakescore builds the session."""
    remote: Annotated[Optional[Text], checked(
        lambda v: None if v.startswith("sc://") else f"must be a Spark Connect URL sc://host:port, got {v!r}"
    )] = Field(None, json_schema_extra=cli("--remote", "sc://HOST:PORT", sweep=True))
    """Run over Spark Connect on this server, ``sc://host:port``; unset: ``SPARK_REMOTE`` when the environment has it.
    The server owns jars, Delta and the metastore, so the other ``spark.*`` settings do not apply."""
    app_name: Text = "lakescore"
    """The Spark application name."""
    warehouse_dir: Text = ".lakescore/warehouse"
    """Managed-table location; the local Derby metastore lives beside it."""
    metastore_dir: Optional[Text] = None
    """Directory of the embedded Derby metastore; default: ``<warehouse_dir>/../metastore_db``."""
    jars_dir: Text = "~/.cache/lakescore/jars"
    """Where ``lakescore fetch-jars`` puts the Delta (and S3A) jars, so sessions start without Maven."""
    class_archive: bool = True
    """On this host's own masters (``local[…]``, ``local-cluster[…]``), start the driver JVM from the host's
    class-data-sharing archive for its classpath, when ``lakescore fetch-jars`` built one
    (``<jars_dir>/class-archives/``); ``false``, or any other master: the JVM parses every class at start-up."""
    worker_preload: bool = True
    """On this host's own masters (``local[…]``, ``local-cluster[…]``), executors' Python workers are forked from a
    daemon that has imported the scoring runtime (torch, transformers) once, so each worker loads only the weights
    and shares the imported modules' memory; ``false``, or any other master (``spark://``, ``yarn``, ``k8s://``):
    Spark's own daemon. Ignored where ``conf`` sets ``spark.python.daemon.module``."""
    s3a: Optional[bool] = None
    """Put the Hadoop S3A connector on the classpath: ``null`` when the job's input or output is an ``s3a://`` path,
    ``true`` always (e.g. metastore tables stored on S3), ``false`` never (the platform's Spark already has it).
    The endpoint goes in ``conf`` (``spark.hadoop.fs.s3a.*``); credentials come from the environment."""
    log_level: LogLevel = "WARN"
    """The JVM log level of a session lakescore builds."""
    conf: SparkConf = Field(default_factory=dict)
    """Extra ``spark.*`` settings, passed through verbatim."""


class ScoringConfig(Section):
    """How rows are cut into model batches and spread over tasks."""

    max_batch_tokens: Optional[int] = Field(None, ge=1)
    """Padded tokens per forward batch (rows x longest row); default per device (cpu 1024; ``generate`` on cpu 8192,
    counting each row's prompt plus ``generate.max_new_tokens``)."""
    max_batch_rows: int = Field(256, ge=1)
    """Rows per forward batch at most, however short they are."""
    arrow_max_records_per_batch: int = Field(4096, ge=1, json_schema_extra=JOB_ONLY)
    """Rows per Arrow batch handed to the scoring function; rows are length-sorted within one."""
    arrow_max_bytes_per_batch: int = Field(64 << 20, ge=1, json_schema_extra=JOB_ONLY)
    """Bytes per Arrow batch at most, so very long texts cannot blow up a worker."""
    partitions: Optional[int] = Field(None, ge=1)
    """Scoring tasks per chunk; default: the cluster's default parallelism when the input has fewer."""
    max_image_pixels: Optional[int] = Field(None, ge=1)
    """Image tasks: the pixels (width x height, read from the header before decoding) one image may have; a bigger
    one is dead-lettered ``image_too_large``. Default: Pillow's decompression-bomb limit (about 89 million)."""
    dedup: OnOff = Field("auto", json_schema_extra=JOB_ONLY)
    """Score identical inputs (same ``input_digest``) once per chunk and fan the outputs out to every row having them:
    ``on``, ``off``, or ``auto``: on when a sample of the input repeats enough to pay for the shuffle."""

    def max_tokens_for(self, device: str) -> int:
        """The token budget for ``device``: the configured one, else the device default."""
        return self.max_batch_tokens or default_max_tokens(device)


_SIZE = re.compile(r"^(\d+)([kmgtp])?b?$", re.IGNORECASE)
_MIB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2, "p": 1024**3}


def spark_size_mib(text: str) -> Optional[float]:
    """A Spark memory size (``512m``, ``2g``; a bare number is MiB, as Spark reads memory settings) in MiB;
    ``None`` when ``text`` is not one."""
    size = _SIZE.match(text.strip())
    return int(size.group(1)) * _MIB_PER_UNIT[(size.group(2) or "m").lower()] if size else None


class ScoringResources(Section):
    """The Spark resource profile of the scoring stage (stage-level scheduling): set any of ``task_cpus``,
    ``task_gpus``, ``executor_gpus`` or ``executor_memory_overhead`` and the scoring stage (after a repartition, so
    reading keeps the cluster's CPU parallelism) runs with its own profile. A master that cannot honour profiles
    (``local[...]``) runs without one and logs a warning."""

    task_cpus: Optional[int] = Field(None, ge=1)
    """CPUs per scoring task (and torch threads per task); default: ``spark.task.cpus``."""
    task_gpus: Annotated[Optional[Number], Field(gt=0), checked(
        lambda v: f"must be at most 0.5 or a whole number, got {v}" if v > 0.5 and not v.is_integer() else None
    )] = None
    """GPUs per scoring task: at most 0.5 (tasks share a GPU) or a whole number."""
    executor_gpus: Optional[int] = Field(None, ge=1)
    """GPUs per executor of the profile; needs ``task_gpus`` and dynamic allocation to take effect."""
    executor_memory_overhead: Annotated[Optional[Text], checked(
        lambda v: None if spark_size_mib(v) is not None else f"must be a Spark size such as 512m or 2g, got {v!r}"
    )] = None
    """Off-heap memory per executor of the profile (torch lives here), a Spark size such as ``2g``."""
    partitions: Optional[int] = Field(None, ge=1)
    """Scoring tasks when the profile applies; default: ``scoring.partitions``, else the default parallelism."""
    discovery_script: Annotated[Optional[Text], checked(
        lambda v: None if v.strip() else "must be a path, got an empty string"
    )] = None
    """Executor-side path of the GPU discovery script for the profile's executors; default: the cluster's
    ``spark.executor.resource.gpu.discoveryScript``."""

    @model_validator(mode="after")
    def _combinations(self) -> "ScoringResources":
        where = "resources.scoring"
        if self.executor_gpus is not None:
            if self.task_gpus is None:
                raise ConfigError(f"{where}.executor_gpus needs {where}.task_gpus (the GPUs each scoring task takes)")
            if self.task_gpus > self.executor_gpus:
                raise ConfigError(
                    f"{where}.task_gpus ({self.task_gpus:g}) exceeds {where}.executor_gpus ({self.executor_gpus}): "
                    "no executor could run a scoring task"
                )
        if self.discovery_script is not None and self.executor_gpus is None:
            raise ConfigError(f"{where}.discovery_script is for the profile's executor GPUs; set {where}.executor_gpus too")
        return self

    @property
    def requested(self) -> bool:
        """Whether any task or executor resource is asked for (else the stage keeps the default profile)."""
        return any(
            v is not None for v in (self.task_cpus, self.task_gpus, self.executor_gpus, self.executor_memory_overhead)
        )


class ResourcesConfig(Section):
    """Per-stage resources (Spark resource profiles), and what they cost."""

    scoring: ScoringResources = Field(default_factory=ScoringResources)
    price_per_core_hour: Optional[Annotated[Number, Field(ge=0)]] = None
    """What one CPU core costs per hour (any currency): set it, or ``price_per_gpu_hour``, and the run report states the
    run's cost and its cost per million rows scored (an unset price counts as zero)."""
    price_per_gpu_hour: Optional[Annotated[Number, Field(ge=0)]] = None
    """What one GPU costs per hour, in the currency of ``price_per_core_hour``."""


GenerateConfig = GenerateOptions
"""The ``generate`` section, declared on the executors' side (:mod:`lakescore.udfs.generate_options`)."""


def _baseline(value: str) -> Optional[str]:
    if value == "previous" or value.isdigit():
        return None
    return f"must be previous or a Delta version number, got {_shown(value)}"


class DriftConfig(Section):
    """The drift gate: this run's predictions against the output's rows at a baseline version, before the publish.
    Every figure the task's outputs allow is computed and reported; a bound set here refuses the publish
    (``drift_exceeded``, exit 1) when the figure passes it. No baseline (a first run): skipped, with a note."""

    baseline: Annotated[Text, checked(_baseline)] = "previous"
    """The output version to compare with: ``previous`` (the output as this run found it) or a Delta version number."""
    max_label_js: Optional[Fraction] = None
    """Tasks with a label (``classify``, ``image_classify``, ``generate`` with ``generate.choices``): refuse when the
    Jensen-Shannon distance (base 2) between this run's label shares and the baseline's exceeds this."""
    max_score_psi: Optional[Number] = Field(None, ge=0)
    """Tasks with a numeric prediction (``score``, tabular ``prediction``): refuse when its population stability index
    over 10 quantile bins of the baseline exceeds this (0.1 is a common "moved", 0.25 a "shifted")."""
    min_id_cosine_p5: Optional[Number] = Field(None, ge=-1, le=1)
    """Embedding tasks: refuse when the 5th percentile of the cosine between each id's embedding and its baseline
    embedding (ids in both, with an unchanged ``input_digest`` where both store it) falls below this."""

    @property
    def baseline_version(self) -> Optional[int]:
        """The configured baseline as a version number; ``None`` for ``previous``."""
        return None if self.baseline == "previous" else int(self.baseline)

    def bounds(self) -> dict[str, Any]:
        """Every bound by its option name, ``None`` where not set."""
        return {name: getattr(self, name) for name in ("max_label_js", "max_score_psi", "min_id_cosine_p5")}


_DRIFT_READS = {"max_label_js": "label", "max_score_psi": "score", "min_id_cosine_p5": "embedding"}
"""Each drift bound, and the output it reads (:class:`~lakescore.udfs.registry.OutputProfile`)."""


class ValidationConfig(Section):
    """The Great Expectations suite every run must pass before its output is published. Built in: row count,
    columns, types, no nulls in predictions and identity columns, one weights digest, this run's id."""

    enabled: bool = True
    """Validate before publishing; ``false`` publishes without the suite (the error-rate check still applies)."""
    min_rows: Optional[int] = Field(None, ge=0)
    """Fail when fewer rows were scored (e.g. an upstream table that arrived half empty)."""
    value_ranges: ValueRanges = Field(default_factory=dict)
    """Column -> ``[min, max]`` every value must lie in, e.g. ``{score: [0, 1]}``."""
    max_null_fraction: NullFractions = Field(default_factory=dict)
    """Column -> the largest fraction of nulls allowed (for columns the suite does not require non-null)."""
    max_length_stops: Optional[Fraction] = None
    """``generate``: fail when more than this fraction of rows stopped at ``generate.max_new_tokens``
    (``finish_reason`` ``length``: their text was cut); default: no limit."""
    drift: DriftConfig = Field(default_factory=DriftConfig)
    metrics: bool = True
    """Add one row per attempt of a run (published or not: its status, times, row counts, prediction profile and drift
    figures; a rerun of a run id adds its next attempt) to the metrics table; a failed write is logged and changes
    nothing about the run."""
    metrics_table: Optional[Text] = None
    """The metrics table (Delta, table or path); default: ``<output>_metrics`` beside the output."""


class WriteConfig(Section):
    """How a run's rows reach the output table."""

    mode: Literal[WRITE_MODES] = Field("overwrite", json_schema_extra=cli("--write-mode"))
    """``overwrite``: the table holds the last run. ``replace_run``: only this run's rows are replaced.
    ``incremental``: only rows whose id is new, whose input changed (``input_digest``) or whose output came from
    other weights or another scoring spec are scored; the rest are kept; one ``MERGE`` applies the changes."""
    delete_missing: bool = Field(False, json_schema_extra=cli("--delete-missing"))
    """``incremental`` only: delete output rows whose id is no longer in the input (counted in the report either way)."""
    full_rescore: bool = Field(False, json_schema_extra=cli("--full-rescore"))
    """``incremental`` only: score every input row and replace the output with them in one overwrite commit, instead
    of comparing; also turns an output written by ``overwrite`` / ``replace_run`` into an incremental one."""
    deletion_vectors: bool = True
    """``incremental`` only: an output this mode creates gets Delta deletion vectors (``delta.enableDeletionVectors``),
    so each later ``MERGE`` writes the changed rows and marks the old ones deleted instead of rewriting every data
    file that holds a changed id. Readers need the ``deletionVectors`` table feature (Delta reader version 3). An
    existing output is never altered (``ALTER TABLE ... SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)``
    enables it there)."""
    chunk_rows: int = Field(2_000_000, ge=1)
    """Rows per resumable chunk: each chunk is committed to staging on its own, so a rerun after a crash
    scores only the chunks not yet committed."""
    staging: Optional[Text] = None
    """Where chunks are staged before publishing: a directory, or a table prefix ``catalog.schema.prefix``
    (tables ``<prefix>_<run key>``); default: beside the output (a table ``<output>__lakescore_staging_<run key>``
    for a table output, ``<output dir>/_lakescore_staging/<name>/<run key>`` for a path)."""
    allow_output_in_input: bool = False
    """Allow an output (or errors) path inside the input's directory, where the next read of the input may pick it up."""

    @model_validator(mode="after")
    def _incremental_only(self) -> "WriteConfig":
        for key in ("delete_missing", "full_rescore"):
            if getattr(self, key) and self.mode != "incremental":
                raise ConfigError(f"write.{key} applies to write.mode incremental only, not {self.mode!r}")
        return self


class RankConfig(Section):
    """Top-K per key: after scoring and before validation, keep the best ``top_k`` scored rows of each ``partition_by``
    key, best first by ``order_by``, numbered in a ``rank`` column (1 = best; equal values go to the smallest id). Rows
    ranked out are counted in the report (``ranked_out``), not written. Off unless ``top_k`` is set."""

    partition_by: Names = ()
    """The input columns whose values make a key, e.g. ``[user_id]`` (copied to the output after the id columns)."""
    order_by: Optional[Text] = None
    """The task's output column the rows of a key are ranked by, e.g. ``score`` or ``prediction``."""
    descending: bool = True
    """Rank the largest ``order_by`` first (``false``: the smallest)."""
    top_k: Optional[int] = Field(None, ge=1)
    """Rows kept per key."""

    @property
    def enabled(self) -> bool:
        return self.top_k is not None

    @model_validator(mode="after")
    def _complete(self) -> "RankConfig":
        given = sorted(self.model_fields_set)
        missing = [key for key, value in (("partition_by", self.partition_by), ("order_by", self.order_by),
                                          ("top_k", self.top_k)) if not value]
        if given and missing:
            raise ConfigError(f"rank needs {', '.join(f'rank.{k}' for k in missing)} too (given: {', '.join(given)})")
        return self


def _run_date(value: str) -> Optional[str]:
    try:
        date.fromisoformat(value)
    except ValueError:
        return f"must be YYYY-MM-DD, got {value!r}"
    return None


def _run_id(value: str) -> Optional[str]:
    if RUN_ID.fullmatch(value):
        return None
    return (
        f"must be 1-{RUN_ID_MAX} characters of letters, digits, '.', '_' or '-', starting with a letter or digit "
        f"(it names a partition directory and sits in the publish predicate), got {_shown(value)}"
    )


class JobConfig(Section):
    """One scoring run, fully resolved. Build with :func:`load_config` or :func:`config_from_mapping`."""

    input: Optional[Text] = Field(None, json_schema_extra=cli("--input", sweep=True))
    """The table (``db.table``, ``catalog.schema.table``) or Parquet / Delta path to score."""
    output: Optional[Text] = Field(None, json_schema_extra=cli("--output"))
    """The Delta table or path the scores go to, written as ``write.mode`` says."""
    input_format: Literal[INPUT_FORMATS] = Field("auto", json_schema_extra=cli("--input-format", sweep=True))
    """How to read a path input: ``auto`` (Delta if the path holds a Delta log, else Parquet), ``delta``, ``parquet``,
    or ``images``: every image file under the folder, recursively (by extension, any case: jpg, jpeg, png, webp, gif,
    bmp, tif, tiff; other files are ignored and counted), its path the id column and its bytes the image column."""
    task: TaskName = Field(
        "embed", json_schema_extra=cli("--task", sweep=True),
        description="What the model computes: " + ", ".join(f"``{t.name}`` ({t.summary})" for t in _TASKS.values()) + ".",
    )
    id_col: Optional[IdColumns] = Field(None, json_schema_extra=cli("--id-col"))
    """The input column copied unchanged to the output to identify each row: string, integer or decimal, under any
    name Delta stores (``review.id`` too; no space or ``,;{}()=``); or a list of such columns that together identify
    it (a composite id: ``[user_id, item_id]``, a flag takes ``user_id,item_id``)."""
    text_col: Optional[Text] = Field(None, json_schema_extra=cli("--text-col", sweep=True))
    """The string column to score (text tasks: ``classify``, ``embed``, ``ner``; ``generate`` without
    ``generate.prompt_template``: the prompt), under any name (``review text`` too)."""
    image_col: Optional[Text] = Field(None, json_schema_extra=cli("--image-col"))
    """The image column to score (image tasks: ``image_classify``, ``image_embed``): binary, each value a file's bytes
    in any format Pillow reads (JPEG, PNG, WebP, GIF, BMP, TIFF, ...), or string, each value the path of such a file
    (``s3a://``, ``dbfs:/``, ``file:``, any URI Hadoop reads; without a scheme, a path of ``fs.defaultFS``: local
    in local mode), read on the executors through Hadoop's filesystem with the ``spark.hadoop.*`` settings; a missing
    file is ``missing_file``. Set by ``input_format`` ``images``."""
    feature_cols: Names = Field((), json_schema_extra=cli("--feature-cols"))
    """``tabular``: the numeric feature columns, in the order the program takes them (a flag takes ``a,b,c``)."""
    feature_prefix: Optional[Text] = Field(None, json_schema_extra=cli("--feature-prefix"))
    """``tabular``: use every input column starting with this prefix, in input order (when ``feature_cols`` is empty)."""
    errors: Optional[Text] = Field(None, json_schema_extra=cli("--errors"))
    """Dead-letter table or path for rows that cannot be scored; default: ``<output>_errors``."""
    max_error_rate: Fraction = 0.001
    """Fail the run (publishing nothing; the errors table is left as it was, the rows' reasons are in the report and
    the run's staging) when more rows than this fraction fail."""
    report: Optional[Text] = Field(None, json_schema_extra=cli("--report", "JSON"))
    """Where to write the JSON run report (the HTML page goes beside it)."""
    run_date: Annotated[Optional[Text], checked(_run_date)] = Field(
        None, json_schema_extra=cli("--run-date", "YYYY-MM-DD")
    )
    """``YYYY-MM-DD`` the run is for; the run id defaults to it (so reruns of one date replace each other)."""
    run_id: Annotated[Optional[Text], checked(_run_id)] = Field(None, json_schema_extra=cli("--run-id"))
    """The id written into every row; default: ``run_date``, else a UTC timestamp and a random suffix (a rerun that
    resumes staged chunks keeps the id they were staged under)."""
    progress_seconds: int = Field(15, ge=0)
    """Seconds between progress lines while scoring; 0 turns them off."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    write: WriteConfig = Field(default_factory=WriteConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    rank: RankConfig = Field(default_factory=RankConfig)

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = {key: _lists_from_text(key, _shorthand(key, value)) for key, value in data.items()}
        if data.get("input_format") == "images":  # a folder's files: the id and image columns are Spark's
            data.update({key: name for key, name in FILE_COLUMNS.items() if data.get(key) is None})
        return data

    @model_validator(mode="after")
    def _combinations(self) -> "JobConfig":
        task = get_task(self.task)
        if self.model.backend not in task.backends:
            raise ConfigError(
                f"model.backend {self.model.backend!r} cannot run task {self.task!r} (it runs on {', '.join(task.backends)})"
            )
        for option in TASK_MODEL_OPTIONS:
            if getattr(self.model, option) is not None and option not in task.model_options:
                readers = ", ".join(name for name in TASKS if option in get_task(name).model_options)
                raise ConfigError(f"model.{option} applies to task {readers}, not {self.task!r}")
        for option in TASK_VALIDATION_OPTIONS:
            if getattr(self.validation, option) is not None and option not in task.validation_options:
                readers = ", ".join(name for name in TASKS if option in get_task(name).validation_options)
                raise ConfigError(f"validation.{option} applies to task {readers}, not {self.task!r}")
        profile = task.output_profile(self.task_options())
        for option, reads in _DRIFT_READS.items():
            if getattr(self.validation.drift, option) is not None and getattr(profile, reads) is None:
                raise ConfigError(
                    f"validation.drift.{option} compares the {reads} output, which task {self.task!r} does not write "
                    "with these settings"
                )
        for section in TASK_OPTION_SECTIONS:
            given = sorted(getattr(self, section).model_fields_set)
            if given and section != task.options_section:
                raise ConfigError(f"{section}.{given[0]} applies to task {section}, not {self.task!r}")
        if self.input_format == "images" and not task.input_kind.file_extensions:
            readers = ", ".join(name for name in TASKS if get_task(name).input_kind.file_extensions)
            raise ConfigError(f"input_format images is for task {readers}, not {self.task!r}")
        for option in _RUNNER_SETTINGS:
            if getattr(self.scoring, option) is not None and option not in task.input_kind.runner_settings:
                readers = ", ".join(name for name in TASKS if option in get_task(name).input_kind.runner_settings)
                raise ConfigError(f"scoring.{option} applies to task {readers}, not {self.task!r}")
        if self.scoring.dedup == "on" and not self.deterministic:
            raise ConfigError(
                "scoring.dedup on scores one row per distinct input, but sampled generation (generate.temperature > 0) "
                "draws each row's text on its own; use dedup auto or off, or temperature 0"
            )
        reduced = self.model.quantize if self.model.quantize != "none" else self.model.dtype
        if reduced != "float32" and not task.input_kind.is_text:  # a lossy path runs only where its tolerance check does
            raise ConfigError(
                f"{reduced} is checked against float32 on a sample of the input before a run scores, which lakescore "
                f"does for text tasks only; task {self.task!r} runs float32 (drop model.dtype / model.quantize)"
            )
        if self.rank.enabled:
            fields = {f.name: f for f in task.output_fields}
            if self.rank.order_by not in fields:
                raise ConfigError(f"rank.order_by must be one of task {self.task!r}'s output columns "
                                  f"({', '.join(fields)}), got {self.rank.order_by!r}")
            if fields[self.rank.order_by].dataType.typeName() in ("array", "struct", "map"):
                raise ConfigError(f"rank.order_by {self.rank.order_by!r} holds {fields[self.rank.order_by].dataType.simpleString()}"
                                  "; rank by a column of single values (a number or a string)")
        if self.write.mode == "incremental" and self.validation.min_rows is not None:
            raise ConfigError(
                "validation.min_rows counts the rows a run publishes, which in write.mode incremental are only the "
                "changed ones; drop it for incremental runs"
            )
        return self

    def require_for_scoring(self) -> None:
        """Raise :class:`ConfigError` naming every setting a scoring run still lacks."""
        required = [
            ("input", self.input),
            ("output", self.output),
            # an endpoint's model is the server's: no files to read here
            ("model.source (--model)", self.model.source or getattr(self.task_options(), "endpoint", None)),
            ("id_col (--id-col)", self.id_col),
        ]
        setting = self.column_setting
        if setting:  # a prompt template names its own columns
            required.append((f"{setting} (--{setting.replace('_', '-')})", self.input_col or self.prompt_template))
        else:
            required.append(("feature_cols (--feature-cols) or feature_prefix (--feature-prefix)", self.feature_cols or self.feature_prefix))
        missing = [flag for flag, value in required if not value]
        if missing:
            raise ConfigError("missing required setting(s): " + ", ".join(missing))
        if setting and self.input_col in self.id_cols:
            raise ConfigError(f"id_col and {setting} must differ, both are {self.input_col!r}")
        for other in _COLUMN_SETTINGS:
            if other != setting and getattr(self, other):
                readers = [get_task(name) for name in TASKS if get_task(name).input_kind.column_setting == other]
                reads = f"reads {setting}" if setting else "reads feature_cols / feature_prefix"
                raise ConfigError(f"{other} is for {readers[0].input_kind.name} tasks ({', '.join(t.name for t in readers)}); "
                                  f"task {self.task!r} {reads}")
        if self.errors and self.errors == self.output:
            raise ConfigError(f"errors and output must differ, both are {self.errors!r}")
        self._check_writes_apart_from_input()

    def _check_writes_apart_from_input(self) -> None:
        """Refuse an output or errors target that is the input, or (unless allowed) a path inside its directory."""
        source = _location(self.input)
        for key, ref in (("output", self.output), ("errors", self.errors_ref())):
            target = _location(ref)
            if target == source:
                raise ConfigError(f"{key} {ref!r} is the input: the run would overwrite what it reads")
            inside = _is_path(self.input) and target.startswith(source.rstrip("/") + "/")
            if inside and not self.write.allow_output_in_input:
                raise ConfigError(
                    f"{key} {ref!r} is inside the input directory {self.input!r}, where the next read of the input "
                    "would pick it up; write elsewhere, or set write.allow_output_in_input"
                )

    @property
    def id_cols(self) -> tuple[str, ...]:
        """The id column(s) as a tuple: one name, or a composite id's names in the configured order (``()``: unset)."""
        if self.id_col is None:
            return ()
        return self.id_col if isinstance(self.id_col, tuple) else (self.id_col,)

    @property
    def row_cols(self) -> tuple[str, ...]:
        """The input columns every output row copies: the id column(s), then ``rank.partition_by``'s others."""
        return tuple(dict.fromkeys([*self.id_cols, *self.rank.partition_by]))

    @property
    def column_setting(self) -> Optional[str]:
        """The setting naming the task's one input column (``text_col``, ``image_col``), per the task registry;
        ``None`` for a task that reads numeric feature columns."""
        return get_task(self.task).input_kind.column_setting

    @property
    def input_col(self) -> Optional[str]:
        """The task's one input column as configured (``text_col`` or ``image_col``); ``None`` for feature tasks."""
        return getattr(self, self.column_setting) if self.column_setting else None

    @property
    def prompt_template(self) -> Optional[str]:
        """The template each row's prompt is rendered from, for a task that reads prompts (else ``None``)."""
        return self.generate.prompt_template if get_task(self.task).input_kind.row_keys else None

    @property
    def deterministic(self) -> bool:
        """Whether a row's output depends only on its input (all tasks but sampled generation): what dedup needs."""
        options = self.task_options()
        return getattr(options, "deterministic", True)

    def task_options(self) -> Any:
        """The task's own settings section, which its head takes as it is (``generate``: :class:`GenerateOptions`),
        else ``None``."""
        section = get_task(self.task).options_section
        return getattr(self, section) if section else None

    def resolved_run_id(self) -> Optional[str]:
        """The run id: given, else derived from ``run_date``, else ``None`` (the job makes one)."""
        return self.run_id or self.run_date

    def errors_ref(self) -> str:
        """The dead-letter table: configured, else ``<output>_errors`` beside the output (for a table, built
        from its parsed name: ``main.`my scores``` -> ``main.`my scores_errors```)."""
        return self.errors or self._beside_output("_errors")

    def metrics_ref(self) -> str:
        """The metrics table: ``validation.metrics_table``, else ``<output>_metrics`` beside the output, named as
        :meth:`errors_ref` names the errors table."""
        return self.validation.metrics_table or self._beside_output("_metrics")

    def _beside_output(self, suffix: str) -> str:
        from lakescore.jobs.platform.identifiers import parse_table_name
        from lakescore.jobs.platform.tables import is_path

        if not self.output or is_path(self.output):
            return f"{(self.output or '').rstrip('/')}{suffix}"
        return str(parse_table_name(self.output, "output").with_suffix(suffix))


_COLUMN_SETTINGS = tuple(dict.fromkeys(t.input_kind.column_setting for t in _TASKS.values() if t.input_kind.column_setting))
"""Every setting naming a task's one input column: one the task does not read is a mistake."""

_RUNNER_SETTINGS = tuple(dict.fromkeys(o for t in _TASKS.values() for o in t.input_kind.runner_settings))
"""Every ``scoring.*`` setting only some input kinds' runners read (``max_image_pixels``)."""


# --- Loading ---------------------------------------------------------------------------------------------------


def load_config(
    path: Optional[os.PathLike | str] = None,
    overrides: Sequence[str] = (),
    flags: Optional[Mapping[str, Any]] = None,
) -> JobConfig:
    """Build a validated :class:`JobConfig`.

    Precedence, lowest first: the schema's defaults, the YAML file at ``path``,
    ``overrides`` (``dotted.key=value`` strings: a string key takes the text after ``=`` as it is, any other key's
    value is parsed as YAML), then ``flags`` (dotted keys to values; ``None`` values are ignored).

    Raises :class:`ConfigError` for an unreadable file, an unknown key (with the
    closest known key suggested), a value of the wrong type, or a bad value.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        tree = _read_yaml(Path(path))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects dotted.key=value, got {item!r}")
        key = key.strip()
        _assign(tree, key, raw if _takes_text(key) else _parse_scalar(raw))
    for key, value in (flags or {}).items():
        if value is not None:
            _assign(tree, key, value)
    return config_from_mapping(tree)


def config_from_mapping(tree: Mapping[str, Any]) -> JobConfig:
    """A validated :class:`JobConfig` from the same tree a YAML file holds (sections as nested mappings).

    Raises :class:`ConfigError` exactly as :func:`load_config` does.
    """
    if not isinstance(tree, Mapping):
        raise ConfigError(f"config must be a mapping, got {type(tree).__name__}")
    try:
        return JobConfig.model_validate(dict(tree))
    except ValidationError as exc:  # the first problem, in one line; an unknown key before a bad value
        errors = exc.errors(include_url=False)
        raise ConfigError(_message(next((e for e in errors if e["type"] == "extra_forbidden"), errors[0]))) from None


def _is_path(ref: str) -> bool:
    """A path, not a table name: :func:`lakescore.jobs.platform.tables.is_path`'s rule, without importing Spark."""
    return any(ch in ref for ch in "/\\:")


def _location(ref: str) -> str:
    """``ref`` in a comparable form: a local path absolute, a URI as given, a table name lowercased."""
    if not _is_path(ref):
        return ref.lower()
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", ref) and not ref.startswith("file:"):
        return ref.rstrip("/")
    return os.path.abspath(ref.removeprefix("file:").removeprefix("//"))


def _shown(value: str, limit: int = 60) -> str:
    """``value`` for a one-line message: repr (control characters escaped), cut at ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} characters)"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def _takes_text(dotted: str) -> bool:
    """Whether the schema declares the key ``dotted`` a string (or a choice among strings), so that ``--set`` hands
    it the text as typed: parsed as YAML, ``Review: {body}`` would be a mapping and ``\\n`` two characters."""
    parts = _split_key(dotted)
    if len(parts) == 1 and parts[0] in _SHORTHANDS:  # --set model=/path sets the shorthand's key
        parts.append(_SHORTHANDS[parts[0]])
    hint, _ = _declared(tuple(parts))
    choices = _choices(hint)
    return hint is str or (bool(choices) and all(isinstance(choice, str) for choice in choices))


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except (yaml.YAMLError, ValueError):  # ValueError: YAML timestamps that are not dates (2026-13-01)
        return raw


_SHORTHANDS = {"model": "source"}
"""Sections that may be given as one value, which sets one of their keys: ``model: /models/minilm`` is
``model: {source: /models/minilm}`` (in YAML, ``--set`` and the Python API alike)."""


def _shorthand(key: str, value: Any) -> Any:
    """``value`` of section ``key`` as a mapping when it is a shorthand's single value (a string or path); else as it is."""
    if key in _SHORTHANDS and isinstance(value, (str, os.PathLike)):
        return {_SHORTHANDS[key]: os.fspath(value)}
    return value


def _lists_from_text(key: str, value: Any) -> Any:
    """Section ``key``'s list settings given as text (``a,b``) as their items: the executors' sections
    (:mod:`lakescore.udfs.settings`) take lists only, so the config reads the text form at its boundary."""
    section = JobConfig.model_fields.get(key)
    if section is None or not isinstance(value, Mapping) or not _is_section(section.annotation):
        return value
    declared = section.annotation.model_fields
    return {
        name: _items(item) if isinstance(item, str) and name in declared
        and typing.get_origin(_unwrapped(declared[name].annotation)[0]) is tuple else item
        for name, item in value.items()
    }


def _assign(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = _split_key(dotted)
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if i == 0:
            child = node[part] = _shorthand(part, child)  # `model: /path` in the file, then --set model.device=...
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _split_key(dotted: str) -> list[str]:
    """``dotted`` cut along the config's sections; below a mapping field the rest is one key.

    ``spark.conf.spark.hadoop.fs.s3a.endpoint`` -> ``["spark", "conf", "spark.hadoop.fs.s3a.endpoint"]``.
    """
    parts = dotted.split(".")
    section: type[BaseModel] = JobConfig
    for i, part in enumerate(parts[:-1]):
        info = section.model_fields.get(part)
        if info is None:
            break  # validation names the unknown key
        hint, _ = _unwrapped(info.annotation)
        if typing.get_origin(hint) is dict:
            return parts[: i + 1] + [".".join(parts[i + 1 :])]
        if not _is_section(hint):
            break
        section = hint
    return parts


# --- What the schema declares, for messages, the CLI, the Python API and the reference -------------------------


@dataclass(frozen=True)
class Option:
    """One setting as the schema declares it: what the CLI, the Python API and the reference need to know."""

    key: str
    """The dotted key, e.g. ``model.device``."""
    type: Any
    """The value's type without ``Optional`` and validators (``Literal[...]`` for a choice)."""
    default: Any
    description: str
    """The field's documentation on one line."""
    bounds: str = ""
    """The numeric bounds as text (``>= 1``, ``between 0 and 1``); ``""`` when unbounded."""
    flag: Optional[str] = None
    """The ``lakescore score`` flag that sets it, if any."""
    metavar: Optional[str] = None
    sweep: bool = False
    """Whether ``lakescore sweep`` takes its flag too."""
    repeat: bool = False
    """Whether its flag adds one item of a list each time it is given (``--stop``), rather than taking the list."""
    job_only: bool = False
    """Whether only the scoring job applies it (``transform`` / ``pandas_udf`` refuse it)."""

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]

    @property
    def section(self) -> str:
        """The section the option sits in (``""`` at the top level)."""
        return self.key.rpartition(".")[0]

    @property
    def choices(self) -> tuple:
        """The allowed values of a choice; ``()`` for any other setting."""
        return _choices(self.type)

    @property
    def type_text(self) -> str:
        """What the option takes, in words: ``one of `auto`, `cpu`, `cuda```, ``integer >= 1``, ``list of strings``."""
        return _type_text(self.type, self.bounds)


def config_options() -> list[Option]:
    """Every setting of the schema, in declaration order, a section's settings in place of the section."""

    def walk(section: type[BaseModel], prefix: str) -> list[Option]:
        found = []
        for name, info in section.model_fields.items():
            hint, metadata = _unwrapped(info.annotation)
            if _is_section(hint):
                found += walk(hint, f"{prefix}{name}.")
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            found.append(Option(
                prefix + name, hint, info.get_default(call_default_factory=True), " ".join((info.description or "").split()),
                _bounds_text([*info.metadata, *metadata]), **extra,
            ))
        return found

    return walk(JobConfig, "")


def _is_section(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, BaseModel)


def _unwrapped(hint: Any) -> tuple[Any, list]:
    """``hint`` without ``Optional`` and ``Annotated``, and the constraints those carried."""
    metadata: list = []
    while True:
        if typing.get_origin(hint) is Annotated:
            hint, *extra = typing.get_args(hint)
            metadata += [m for x in extra for m in (x.metadata if isinstance(x, FieldInfo) else [x])]
        elif typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(args) != 1:
                return hint, metadata
            hint = args[0]
        else:
            return hint, metadata


def _choices(hint: Any) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def _bounds_text(metadata: list) -> str:
    bound = {name: getattr(m, name) for m in metadata for name in ("ge", "gt", "le") if hasattr(m, name)}
    if "ge" in bound and "le" in bound:
        return f"between {bound['ge']:g} and {bound['le']:g}"
    return ", ".join(f"{symbol} {bound[name]:g}" for name, symbol in (("ge", ">="), ("gt", ">"), ("le", "<=")) if name in bound)


def _type_text(hint: Any, bounds: str = "") -> str:
    if _choices(hint):
        return "one of " + ", ".join(f"`{choice}`" for choice in _choices(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict:
        value, metadata = _unwrapped(args[1])
        return f"mapping: name → {_type_text(value, _bounds_text(metadata))}"
    if origin is tuple:
        return f"list of {_type_text(_unwrapped(args[0])[0])}s"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_text(_unwrapped(arg)[0]) for arg in args if arg is not type(None))
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return " ".join(filter(None, [names.get(hint, getattr(hint, "__name__", str(hint))), bounds]))


def _declared(loc: tuple) -> tuple[Any, list]:
    """The type and constraints the schema declares for the value at ``loc`` (a validation error's location)."""
    hint: Any = JobConfig
    metadata: list = []
    for part in loc:
        if _is_section(hint):
            info = hint.model_fields.get(part)
            if info is None:
                return None, []
            hint, metadata = info.annotation, list(info.metadata)
        elif typing.get_origin(hint) in (dict, tuple):  # a mapping's value, a list's item
            hint, metadata = typing.get_args(hint)[-1 if typing.get_origin(hint) is dict else 0], []
        hint, more = _unwrapped(hint)
        metadata += more
    return hint, metadata


_EXPECTED = {
    "int_type": "an integer", "int_from_float": "an integer", "float_type": "a number", "bool_type": "true or false",
    "string_type": "a string", "tuple_type": "a list", "list_type": "a list",
}
"""Pydantic's type errors, as the message says what the key takes."""


def _message(error: Mapping[str, Any]) -> str:
    """One pydantic validation error as one line naming the dotted key, the bad value and what is allowed."""
    loc, kind, value, context = error["loc"], error["type"], error["input"], error.get("ctx") or {}
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    if isinstance(context.get("error"), ConfigError):  # a check across settings: its message is whole
        return str(context["error"])
    if kind == "lakescore":
        return f"{key} {context['reason']}"
    if kind == "extra_forbidden":
        section, _ = _declared(loc[:-1])
        known = list(section.model_fields) if _is_section(section) else []
        prefix = key.rpartition(".")[0] + "." if "." in key else ""
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(sorted(known))}"
        return f"unknown config key '{key}'{hint}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{key or 'config'} must be a mapping, got {type(value).__name__}"
    if kind in _EXPECTED:
        return f"{key} must be {_EXPECTED[kind]}, got {value!r}"
    hint, metadata = _declared(loc)
    if kind == "literal_error":
        return f"{key} must be one of {', '.join(map(str, _choices(hint)))}, got {value!r}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "finite_number"):
        return f"{key} must be {_bounds_text(metadata)}, got {as_number(value) if hint is float else value}"
    return f"{key}: {error['msg']}"
