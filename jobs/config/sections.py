"""The config schema's sections besides the executors' own (``model``: :mod:`lakescore.udfs.options.model`,
``generate``: :mod:`lakescore.udfs.options.generate`), which it takes as they are declared there."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from lakescore.jobs.config.values import (
    WRITE_MODES,
    LogLevel,
    Names,
    NullFractions,
    OnOff,
    SparkConf,
    ValueRanges,
    shown,
)
from lakescore.udfs.batching import default_max_tokens
from lakescore.udfs.options.base import JOB_ONLY, ConfigError, Fraction, Number, Section, Text, checked, cli
from lakescore.udfs.options.embed import EmbedOptions
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.options.model import ModelOptions
from lakescore.udfs.options.transcribe import TranscribeOptions

ModelConfig = ModelOptions
"""The ``model`` section, declared on the executors' side (:mod:`lakescore.udfs.options.model`)."""


class SparkConfig(Section):
    """How the SparkSession is built when lakescore builds it (never on Databricks or under spark-submit)."""

    master: Text = Field("local[*]", json_schema_extra=cli("--master", sweep=True))
    """The Spark master when lakescore builds the session."""
    remote: Annotated[
        Text | None,
        checked(lambda v: None if v.startswith("sc://") else f"must be a Spark Connect URL sc://host:port, got {v!r}"),
    ] = Field(None, json_schema_extra=cli("--remote", "sc://HOST:PORT", sweep=True))
    """Run over Spark Connect on this server, ``sc://host:port``; unset: ``SPARK_REMOTE`` when the environment has it.
    The server owns jars, Delta and the metastore, so the other ``spark.*`` settings do not apply."""
    app_name: Text = "lakescore"
    """The Spark application name."""
    warehouse_dir: Text = ".lakescore/warehouse"
    """Managed-table location; the local Derby metastore lives beside it."""
    metastore_dir: Text | None = None
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
    s3a: bool | None = None
    """Put the Hadoop S3A connector on the classpath: ``null`` when the job's input or output is an ``s3a://`` path,
    ``true`` always (e.g. metastore tables stored on S3), ``false`` never (the platform's Spark already has it).
    The endpoint goes in ``conf`` (``spark.hadoop.fs.s3a.*``); credentials come from the environment."""
    log_level: LogLevel = "WARN"
    """The JVM log level of a session lakescore builds."""
    conf: SparkConf = Field(default_factory=dict)
    """Extra ``spark.*`` settings, passed through verbatim."""


class ScoringConfig(Section):
    """How rows are cut into model batches and spread over tasks."""

    max_batch_tokens: int | None = Field(None, ge=1)
    """Padded tokens per forward batch (rows x longest row); default per device (cpu 1024; ``generate`` on cpu 8192,
    counting each row's prompt plus ``generate.max_new_tokens``). An image counts one token per 16x16 patch of its
    model input (196 at 224x224)."""
    max_batch_rows: int = Field(256, ge=1)
    """Rows per forward batch at most, however short they are."""
    arrow_max_records_per_batch: int = Field(4096, ge=1, json_schema_extra=JOB_ONLY)
    """Rows per Arrow batch handed to the scoring function; rows are length-sorted within one."""
    arrow_max_bytes_per_batch: int = Field(64 << 20, ge=1, json_schema_extra=JOB_ONLY)
    """Bytes per Arrow batch at most, so very long texts cannot blow up a worker."""
    partitions: int | None = Field(None, ge=1)
    """Scoring tasks per chunk. Default: in a scoring run, 4 per task slot of at least 500 rows each, unless the input's
    own partitions fill every slot in even waves and each scores within ``progress_seconds`` (over Spark Connect: the
    default parallelism when the input has fewer partitions); in ``transform``, the default parallelism when the input
    has fewer partitions."""
    max_image_pixels: int | None = Field(None, ge=1)
    """Image tasks: the pixels (width x height, read from the header before decoding) one image may have; a bigger
    one is dead-lettered ``image_too_large``. Default: Pillow's decompression-bomb limit (about 89 million)."""
    dedup: OnOff = Field("auto", json_schema_extra=JOB_ONLY)
    """Score identical inputs (same ``input_digest``) once per chunk and fan the outputs out to every row having them:
    ``on``, ``off``, or ``auto``: on when a sample of the input repeats enough to pay for the shuffle (never for a model
    faster than 10 µs a row, which is not sampled)."""
    group_prefixes: bool = True
    """``generate`` over an endpoint or a served engine: the scoring stage partitions each chunk's rows by range of
    their rendered prompt and sorts each task's rows by it, so rows whose prompts share a prefix reach one engine
    together, in sequence, and its prefix cache (or the provider's prompt cache) computes the prefix once. Each row is
    a request of its own, so no answer changes; ``false``: the rows keep the input's partitioning. In-process greedy
    generation is grouped the same way while ``generate.share_prefix_tokens`` is on, so a prefix's rows meet in one
    task, where the head computes it once per batch."""

    def max_tokens_for(self, device: str) -> int:
        """The token budget for ``device``: the configured one, else the device default."""
        return self.max_batch_tokens or default_max_tokens(device)


_SIZE = re.compile(r"^(\d+)([kmgtp])?b?$", re.IGNORECASE)
_MIB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2, "p": 1024**3}


def spark_size_mib(text: str) -> float | None:
    """A Spark memory size (``512m``, ``2g``; a bare number is MiB, as Spark reads memory settings) in MiB;
    ``None`` when ``text`` is not one."""
    size = _SIZE.match(text.strip())
    return int(size.group(1)) * _MIB_PER_UNIT[(size.group(2) or "m").lower()] if size else None


class ScoringResources(Section):
    """The Spark resource profile of the scoring stage (stage-level scheduling): set any of ``task_cpus``,
    ``task_gpus``, ``executor_gpus`` or ``executor_memory_overhead`` and the scoring stage (after a repartition, so
    reading keeps the cluster's CPU parallelism) runs with its own profile. A master that cannot honour profiles
    (``local[...]``) runs without one and logs a warning."""

    task_cpus: int | None = Field(None, ge=1)
    """CPUs per scoring task (and torch threads per task); default: ``spark.task.cpus``."""
    task_gpus: Annotated[
        Number | None,
        Field(gt=0),
        checked(
            lambda v: f"must be at most 0.5 or a whole number, got {v}" if v > 0.5 and not v.is_integer() else None
        ),
    ] = None
    """GPUs per scoring task: at most 0.5 (tasks share a GPU) or a whole number."""
    executor_gpus: int | None = Field(None, ge=1)
    """GPUs per executor of the profile; needs ``task_gpus`` and dynamic allocation to take effect."""
    executor_memory_overhead: Annotated[
        Text | None,
        checked(
            lambda v: None if spark_size_mib(v) is not None else f"must be a Spark size such as 512m or 2g, got {v!r}"
        ),
    ] = None
    """Off-heap memory per executor of the profile (torch lives here), a Spark size such as ``2g``."""
    partitions: int | None = Field(None, ge=1)
    """Scoring tasks when the profile applies; default: ``scoring.partitions`` (or its default)."""
    discovery_script: Annotated[
        Text | None, checked(lambda v: None if v.strip() else "must be a path, got an empty string")
    ] = None
    """Executor-side path of the GPU discovery script for the profile's executors; default: the cluster's
    ``spark.executor.resource.gpu.discoveryScript``."""

    @model_validator(mode="after")
    def _combinations(self) -> ScoringResources:
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
            raise ConfigError(
                f"{where}.discovery_script is for the profile's executor GPUs; set {where}.executor_gpus too"
            )
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
    price_per_core_hour: Annotated[Number, Field(ge=0)] | None = None
    """What one CPU core costs per hour (any currency): set it, or ``price_per_gpu_hour``, and the run report states the
    run's cost and its cost per million rows scored (an unset price counts as zero)."""
    price_per_gpu_hour: Annotated[Number, Field(ge=0)] | None = None
    """What one GPU costs per hour, in the currency of ``price_per_core_hour``."""


GenerateConfig = GenerateOptions
"""The ``generate`` section, declared on the executors' side (:mod:`lakescore.udfs.options.generate`)."""

EmbedConfig = EmbedOptions
"""The ``embed`` section, declared on the executors' side (:mod:`lakescore.udfs.options.embed`)."""

TranscribeConfig = TranscribeOptions
"""The ``transcribe`` section, declared on the executors' side (:mod:`lakescore.udfs.options.transcribe`)."""


def _baseline(value: str) -> str | None:
    if value == "previous" or value.isdigit():
        return None
    return f"must be previous or a Delta version number, got {shown(value)}"


class DriftConfig(Section):
    """The drift gate: this run's predictions against the output's rows at a baseline version, before the publish.
    Every figure the task's outputs allow is computed and reported; a bound set here refuses the publish
    (``drift_exceeded``, exit 1) when the figure passes it. No baseline (a first run): skipped, with a note."""

    baseline: Annotated[Text, checked(_baseline)] = "previous"
    """The output version to compare with: ``previous`` (the output as this run found it) or a Delta version number."""
    max_label_js: Fraction | None = None
    """Tasks with a label (``classify``, ``image_classify``, ``generate`` with ``generate.choices``): refuse when the
    Jensen-Shannon distance (base 2) between this run's label shares and the baseline's exceeds this."""
    max_score_psi: Number | None = Field(None, ge=0)
    """Tasks with a numeric prediction (``score``, tabular ``prediction``): refuse when its population stability index
    over 10 quantile bins of the baseline exceeds this (0.1 is a common "moved", 0.25 a "shifted")."""
    min_id_cosine_p5: Number | None = Field(None, ge=-1, le=1)
    """Embedding tasks: refuse when the 5th percentile of the cosine between each id's embedding and its baseline
    embedding (ids in both, with an unchanged ``input_digest`` where both store it) falls below this."""

    @property
    def baseline_version(self) -> int | None:
        """The configured baseline as a version number; ``None`` for ``previous``."""
        return None if self.baseline == "previous" else int(self.baseline)

    def bounds(self) -> dict[str, Any]:
        """Every bound by its option name, ``None`` where not set."""
        return {name: getattr(self, name) for name in ("max_label_js", "max_score_psi", "min_id_cosine_p5")}


DRIFT_READS = {"max_label_js": "label", "max_score_psi": "score", "min_id_cosine_p5": "embedding"}
"""Each drift bound, and the output it reads (:class:`~lakescore.udfs.registry.OutputProfile`)."""


class ValidationConfig(Section):
    """The Great Expectations suite every run must pass before its output is published. Built in: row count,
    columns, types, no nulls in predictions and identity columns, one weights digest, this run's id."""

    enabled: bool = True
    """Validate before publishing; ``false`` publishes without the suite (the error-rate check still applies)."""
    min_rows: int | None = Field(None, ge=0)
    """Fail when fewer rows were scored (e.g. an upstream table that arrived half empty)."""
    value_ranges: ValueRanges = Field(default_factory=dict)
    """Column -> ``[min, max]`` every value must lie in, e.g. ``{score: [0, 1]}``."""
    max_null_fraction: NullFractions = Field(default_factory=dict)
    """Column -> the largest fraction of nulls allowed (for columns the suite does not require non-null)."""
    max_length_stops: Fraction | None = None
    """``generate``: fail when more than this fraction of rows stopped at ``generate.max_new_tokens``
    (``finish_reason`` ``length``: their text was cut); default: no limit."""
    drift: DriftConfig = Field(default_factory=DriftConfig)
    metrics: bool = True
    """Add one row per attempt of a run (published or not: its status, times, row counts, prediction profile and drift
    figures; a rerun of a run id adds its next attempt) to the metrics table; a failed write is logged and changes
    nothing about the run."""
    metrics_table: Text | None = None
    """The metrics table (Delta, table or path); default: ``<output>_metrics`` beside the output."""


class WriteConfig(Section):
    """How a run's rows reach the output table."""

    mode: Literal[WRITE_MODES] = Field("overwrite", json_schema_extra=cli("--write-mode"))
    """``overwrite``: the table holds the last run. ``replace_run``: only this run's rows are replaced.
    ``incremental``: only rows whose id is new, whose input changed (``input_digest``) or whose output came from
    other weights or another scoring spec are scored; the rest are kept; one ``MERGE`` applies the changes."""
    delete_missing: bool = Field(False, json_schema_extra=cli("--delete-missing"))
    """``incremental`` only: delete output rows whose id is no longer in the input (counted in the report either
    way)."""
    full_rescore: bool = Field(False, json_schema_extra=cli("--full-rescore"))
    """``incremental`` only: score every input row and replace the output with them in one overwrite commit, instead
    of comparing; also turns an output written by ``overwrite`` / ``replace_run`` into an incremental one."""
    retry_failed: bool = Field(False, json_schema_extra=cli("--retry-failed"))
    """``incremental`` only: score again the rows the errors table holds from the last run with a reason of the row's
    own (``null_input``, ``prompt_too_long``, ``scoring_error``, ...) although their input, weights and scoring spec are
    unchanged. By default such a row is not scored again: its dead letter is carried to this run's errors table
    (``carried``, ``first_run_id``) and does not count toward ``max_error_rate``. Rows an endpoint failed
    (``endpoint_error``, ``endpoint_unfinished``) are scored again either way."""
    deletion_vectors: bool = True
    """``incremental`` only: an output this mode creates gets Delta deletion vectors (``delta.enableDeletionVectors``),
    so each later ``MERGE`` writes the changed rows and marks the old ones deleted instead of rewriting every data
    file that holds a changed id. Readers need the ``deletionVectors`` table feature (Delta reader version 3). An
    existing output is never altered (``ALTER TABLE ... SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)``
    enables it there)."""
    chunk_rows: int | None = Field(None, ge=1)
    """Rows per resumable chunk: each chunk is committed to staging on its own, so a rerun after a crash
    scores only the chunks not yet committed. Default: chunks of about ``chunk_seconds`` of scoring each."""
    chunk_seconds: float = Field(600.0, gt=0)
    """Without ``chunk_rows``: about how long each chunk scores on the run's task slots, at the speed the preflight
    measured on a batch of the input, so that a crash costs at most about this much scoring and a cheap model's
    run is not cut into chunks it does not need (a power of two of them, so a rerun finds the chunks staged
    before even when it measures another speed)."""
    staging: Text | None = None
    """Where chunks are staged before publishing: a directory, or a table prefix ``catalog.schema.prefix``
    (tables ``<prefix>_<run key>``); default: beside the output (a table ``<output>__lakescore_staging_<run key>``
    for a table output, ``<output dir>/_lakescore_staging/<name>/<run key>`` for a path)."""
    allow_output_in_input: bool = False
    """Allow an output (or errors) path inside the input's directory, where the next read of the input may pick it
    up."""

    @model_validator(mode="after")
    def _incremental_only(self) -> WriteConfig:
        for key in ("delete_missing", "full_rescore", "retry_failed"):
            if getattr(self, key) and self.mode != "incremental":
                raise ConfigError(f"write.{key} applies to write.mode incremental only, not {self.mode!r}")
        return self


class RankConfig(Section):
    """Top-K per key: after scoring and before validation, keep the best ``top_k`` scored rows of each ``partition_by``
    key, best first by ``order_by``, numbered in a ``rank`` column (1 = best; equal values go to the smallest id). Rows
    ranked out are counted in the report (``ranked_out``), not written. Off unless ``top_k`` is set."""

    partition_by: Names = ()
    """The input columns whose values make a key, e.g. ``[user_id]`` (copied to the output after the id columns)."""
    order_by: Text | None = None
    """The task's output column the rows of a key are ranked by, e.g. ``score`` or ``prediction``."""
    descending: bool = True
    """Rank the largest ``order_by`` first (``false``: the smallest)."""
    top_k: int | None = Field(None, ge=1)
    """Rows kept per key."""

    @property
    def enabled(self) -> bool:
        return self.top_k is not None

    def ordering(self) -> tuple[str, int]:
        """``(order_by, top_k)`` of an enabled ranking (the validator sets both or neither); ``ConfigError`` when
        off."""
        if self.order_by is None or self.top_k is None:
            raise ConfigError("rank is off: set rank.partition_by, rank.order_by and rank.top_k")
        return self.order_by, self.top_k

    @model_validator(mode="after")
    def _complete(self) -> RankConfig:
        given = sorted(self.model_fields_set)
        missing = [
            key
            for key, value in (("partition_by", self.partition_by), ("order_by", self.order_by), ("top_k", self.top_k))
            if not value
        ]
        if given and missing:
            raise ConfigError(f"rank needs {', '.join(f'rank.{k}' for k in missing)} too (given: {', '.join(given)})")
        return self
