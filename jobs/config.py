"""Typed job configuration: YAML file, then ``--set`` overrides, then CLI flags.

Every environment-specific value lives here or in ``conf/*.yaml``; nothing below
``jobs/`` reads the environment on its own. :func:`load_config` validates the
whole tree before any Spark or model work starts, so a typo fails in
milliseconds with a message naming the key, never after a cluster spun up.

Layout of a config file (all keys optional except where the job needs them)::

    input: reviews.raw            # metastore table, or a Parquet / Delta path
    output: reviews.embeddings    # metastore table, or a Delta path
    task: embed
    id_col: review_id
    text_col: body
    model:
      source: /models/all-MiniLM-L6-v2
    spark:
      master: local[*]
    scoring:
      max_batch_tokens: 1024
    resources:
      scoring: {task_cpus: 4, task_gpus: 1}

Errors: :class:`ConfigError` (a :class:`ValueError`) naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import difflib
from datetime import date
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml

from lakescore.udfs.batching import default_max_tokens
from lakescore.udfs.model_source import BACKENDS, DEVICES, DTYPES, POOLING_MODES, QUANTIZATIONS
from lakescore.udfs.quantize import Tolerance
from lakescore.udfs.registry import TASK_MODEL_OPTIONS, TASK_NAMES, get_task

__all__ = [
    "ConfigError", "JobConfig", "config_from_mapping", "load_config", "spark_size_mib",
    "TASKS", "WRITE_MODES", "INPUT_FORMATS", "DEDUP_MODES", "DEVICES", "DTYPES", "BACKENDS", "QUANTIZATIONS",
]

TASKS = TASK_NAMES
"""Scoring tasks this version can run (:mod:`lakescore.udfs.registry`)."""
WRITE_MODES = ("overwrite", "replace_run", "incremental")
RUN_ID_MAX = 128
RUN_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_ID_MAX - 1}}}")
"""What a run id may be: safe as a partition directory name, in a SQL string literal and on one log line."""
INPUT_FORMATS = ("auto", "delta", "parquet")
DEDUP_MODES = ("auto", "on", "off")


class ConfigError(ValueError):
    """A configuration file, override or flag is missing, unknown or ill-typed."""


def _require_one_of(key: str, value: object, allowed: tuple) -> None:
    """Raise :class:`ConfigError` naming ``key`` and the choices unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Where the model comes from and how its outputs are shaped. Given as one string (``model: /models/minilm``),
    the section is its ``source``."""

    source: Optional[str] = None
    """A local model directory (tabular: a ``.pt``/``.pt2`` file), a Hadoop URI (``s3a://``, ``dbfs:/``), or a hub id."""
    revision: Optional[str] = None
    """Hub revision (branch, tag or commit); for other sources recorded as given."""
    device: str = "cpu"
    """``auto`` (CUDA when the worker sees a GPU), ``cpu`` or ``cuda``."""
    dtype: str = "float32"
    """``float32``, ``bfloat16`` or ``float16`` (CUDA only)."""
    expect_sha256: Optional[str] = None
    """Refuse to score unless the weights digest equals this hex (``--expect-sha256``)."""
    allow_pickle: bool = False
    """Allow pickle-based weights (``pytorch_model.bin``): loading them can run arbitrary code."""
    trust_remote_code: bool = False
    """Run model code shipped with the model (transformers ``trust_remote_code``)."""
    cache_dir: str = "~/.cache/lakescore/models"
    """Where the driver's host keeps its copy of a remote (``s3a://``, ``dbfs:/``...) model."""
    max_seq_length: Optional[int] = None
    """Token limit per text; default: the model's own sentence-transformers setting."""
    pooling: Optional[str] = None
    """Pooling for models without a sentence-transformers config (default ``mean``): one of sentence-transformers'
    modes, e.g. ``cls``, or ``lasttoken`` for a decoder embedder."""
    normalize: Optional[bool] = None
    """L2-normalise embeddings; default: as the model's own config says (plain HF dirs: true)."""
    prompt_name: Optional[str] = None
    """Embeddings: the model's prompt to prepend to every text, by its name in the model's sentence-transformers
    ``prompts`` (e.g. ``passage``, ``document``); default: the model's ``default_prompt_name``, else none."""
    backend: str = "torch"
    """What runs the forward: ``torch``, or ``onnx`` (ONNX Runtime, CPU, float32; exported once per host)."""
    quantize: str = "none"
    """``int8`` (ONNX backend): faster, lossy; the run refuses to score when a sample of its input is
    outside the tolerance below against float32. The tolerance guards ``dtype`` ``bfloat16`` / ``float16``
    runs the same way (every reduced-precision path, :attr:`lakescore.udfs.model_source.ModelSpec.reduced_precision`)."""
    quantize_min_cosine: float = Tolerance.min_cosine
    """Reduced-precision embeddings: the 1st percentile of per-row cosine to float32 on the sample must reach this."""
    quantize_min_agreement: float = Tolerance.min_agreement
    """Reduced-precision classifiers / token classifiers: the fraction of sampled rows with float32's label / entities."""
    quantize_max_prob_delta: float = Tolerance.max_prob_delta
    """Reduced-precision classifiers: the 99th percentile over sampled rows of the largest probability difference."""

    def tolerance(self) -> Tolerance:
        """The reduced-precision tolerance these settings give (int8, bfloat16, float16 against float32)."""
        return Tolerance(self.quantize_min_cosine, self.quantize_min_agreement, self.quantize_max_prob_delta)

    def _validate(self) -> None:
        _require_one_of("model.device", self.device, DEVICES)
        _require_one_of("model.dtype", self.dtype, DTYPES)
        if self.dtype == "float16" and self.device == "cpu":
            raise ConfigError("model.dtype float16 needs a GPU (device cuda or auto); use bfloat16 on CPU")
        if self.expect_sha256 is not None:
            digest = self.expect_sha256.strip().lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(f"model.expect_sha256 must be 64 hex digits, got {self.expect_sha256!r}")
        if self.max_seq_length is not None and self.max_seq_length < 1:
            raise ConfigError(f"model.max_seq_length must be >= 1, got {self.max_seq_length}")
        if self.pooling is not None:
            _require_one_of("model.pooling", self.pooling, POOLING_MODES)
        if self.prompt_name is not None and not self.prompt_name.strip():
            raise ConfigError("model.prompt_name must name one of the model's prompts, got an empty string")
        self._validate_backend()

    def _validate_backend(self) -> None:
        _require_one_of("model.backend", self.backend, BACKENDS)
        _require_one_of("model.quantize", self.quantize, QUANTIZATIONS)
        if self.backend == "onnx" and self.device == "cuda":
            raise ConfigError("model.backend onnx runs on CPU (ONNX Runtime's CPU build); use device cpu, or backend torch on a GPU")
        if self.backend == "onnx" and self.dtype != "float32":
            raise ConfigError(f"model.backend onnx runs float32 (or model.quantize int8), got model.dtype {self.dtype!r}")
        if self.quantize == "int8" and self.backend != "onnx":
            raise ConfigError("model.quantize int8 needs model.backend onnx")
        for key in ("quantize_min_cosine", "quantize_min_agreement", "quantize_max_prob_delta"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"model.{key} must be between 0 and 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class SparkConfig:
    """How the SparkSession is built when lakescore builds it (never on Databricks)."""

    master: str = "local[*]"
    remote: Optional[str] = None
    """A Spark Connect server, ``sc://host:port`` (``--remote``); unset: ``SPARK_REMOTE`` when the environment
    has it. The server owns jars, Delta and the metastore: the other keys of this section do not apply."""
    app_name: str = "lakescore"
    warehouse_dir: str = ".lakescore/warehouse"
    """Managed-table location; the local Derby metastore lives beside it."""
    metastore_dir: Optional[str] = None
    """Directory of the embedded Derby metastore; default: ``<warehouse_dir>/../metastore_db``."""
    jars_dir: str = "~/.cache/lakescore/jars"
    """Where ``lakescore fetch-jars`` puts the Delta (and S3A) jars, so sessions start without Maven."""
    class_archive: bool = True
    """Start the driver JVM from the host's class-data-sharing archive for its classpath, when ``lakescore
    fetch-jars`` built one (``<jars_dir>/class-archives/``): ~4 s less session start and ~4 s less first read
    on 2 cores. ``false``: the JVM parses every class at start-up, as it does where no archive exists."""
    worker_preload: bool = True
    """Executors' Python workers are forked from a daemon that has imported the scoring runtime (torch,
    transformers) once (:mod:`lakescore.jobs.platform.python_daemon`): each worker then loads only the weights,
    ~3.5 s less CPU per worker, and shares the imported modules' memory. ``false``: Spark's own daemon, each
    worker importing them itself. Ignored where ``conf`` sets ``spark.python.daemon.module``."""
    s3a: Optional[bool] = None
    """Put the Hadoop S3A connector on the classpath: ``null`` when the job's input or output
    is an ``s3a://`` path, ``true`` always (e.g. metastore tables stored on S3), ``false`` never
    (the platform's Spark already has it). The endpoint goes in ``conf`` (``spark.hadoop.fs.s3a.*``);
    credentials come from the environment (``AWS_ACCESS_KEY_ID``, ...), never from config files."""
    log_level: str = "WARN"
    conf: Mapping[str, str] = field(default_factory=dict)
    """Extra ``spark.*`` settings, passed through verbatim."""

    def _validate(self) -> None:
        levels = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE")
        if self.log_level.upper() not in levels:
            raise ConfigError(f"spark.log_level must be one of {', '.join(levels)}, got {self.log_level!r}")
        if self.remote is not None and not self.remote.startswith("sc://"):
            raise ConfigError(f"spark.remote must be a Spark Connect URL sc://host:port, got {self.remote!r}")


@dataclass(frozen=True)
class ScoringConfig:
    """How rows are cut into model batches and spread over tasks."""

    max_batch_tokens: Optional[int] = None
    """Padded tokens per forward batch (rows x longest row); default per device (cpu 1024)."""
    max_batch_rows: int = 256
    """Rows per forward batch at most, however short they are."""
    arrow_max_records_per_batch: int = 4096
    """Rows per Arrow batch handed to the UDF; rows are length-sorted within one."""
    arrow_max_bytes_per_batch: int = 64 << 20
    """Bytes per Arrow batch at most, so very long texts cannot blow up a worker."""
    partitions: Optional[int] = None
    """Scoring tasks; default: the cluster's default parallelism when the input has fewer."""
    dedup: str = "auto"
    """Score identical inputs (same ``input_digest``) once per chunk and fan the outputs out to every row having them:
    ``on``, ``off``, or ``auto``: on when a sample of the input repeats enough to pay for the shuffle."""

    def _validate(self) -> None:
        _require_one_of("scoring.dedup", self.dedup, DEDUP_MODES)
        for key in ("max_batch_rows", "arrow_max_records_per_batch", "arrow_max_bytes_per_batch"):
            if getattr(self, key) < 1:
                raise ConfigError(f"scoring.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ConfigError(f"scoring.max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.partitions is not None and self.partitions < 1:
            raise ConfigError(f"scoring.partitions must be >= 1, got {self.partitions}")

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


@dataclass(frozen=True)
class ScoringResources:
    """The Spark resource profile of the scoring stage (stage-level scheduling).

    Set any of ``task_cpus``, ``task_gpus``, ``executor_gpus`` or
    ``executor_memory_overhead`` and the scoring stage (after a repartition, so
    reading keeps the cluster's CPU parallelism) runs with its own profile. A
    master that cannot honour profiles (``local[...]``) runs without one and logs
    a warning; see :mod:`lakescore.jobs.platform.profiles` for what each cluster manager gets.
    """

    task_cpus: Optional[int] = None
    """CPUs per scoring task (and torch threads per task); default: ``spark.task.cpus``."""
    task_gpus: Optional[float] = None
    """GPUs per scoring task: at most 0.5 (tasks share a GPU) or a whole number."""
    executor_gpus: Optional[int] = None
    """GPUs per executor of the profile; needs ``task_gpus`` and dynamic allocation to take effect."""
    executor_memory_overhead: Optional[str] = None
    """Off-heap memory per executor of the profile (torch lives here), a Spark size such as ``2g``."""
    partitions: Optional[int] = None
    """Scoring tasks when the profile applies; default: ``scoring.partitions``, else the default parallelism."""
    discovery_script: Optional[str] = None
    """Executor-side path of the GPU discovery script for the profile's executors;
    default: the cluster's ``spark.executor.resource.gpu.discoveryScript``."""

    def _validate(self) -> None:
        where = "resources.scoring"
        if self.task_cpus is not None and self.task_cpus < 1:
            raise ConfigError(f"{where}.task_cpus must be >= 1, got {self.task_cpus}")
        if self.task_gpus is not None:
            if self.task_gpus <= 0:
                raise ConfigError(f"{where}.task_gpus must be > 0, got {self.task_gpus}")
            if self.task_gpus > 0.5 and not self.task_gpus.is_integer():
                raise ConfigError(f"{where}.task_gpus must be at most 0.5 or a whole number, got {self.task_gpus}")
        if self.executor_gpus is not None:
            if self.executor_gpus < 1:
                raise ConfigError(f"{where}.executor_gpus must be >= 1, got {self.executor_gpus}")
            if self.task_gpus is None:
                raise ConfigError(f"{where}.executor_gpus needs {where}.task_gpus (the GPUs each scoring task takes)")
            if self.task_gpus > self.executor_gpus:
                raise ConfigError(
                    f"{where}.task_gpus ({self.task_gpus:g}) exceeds {where}.executor_gpus ({self.executor_gpus}): "
                    "no executor could run a scoring task"
                )
        if self.executor_memory_overhead is not None and spark_size_mib(self.executor_memory_overhead) is None:
            raise ConfigError(
                f"{where}.executor_memory_overhead must be a Spark size such as 512m or 2g, got {self.executor_memory_overhead!r}"
            )
        if self.partitions is not None and self.partitions < 1:
            raise ConfigError(f"{where}.partitions must be >= 1, got {self.partitions}")
        if self.discovery_script is not None and not self.discovery_script.strip():
            raise ConfigError(f"{where}.discovery_script must be a path, got an empty string")
        if self.discovery_script is not None and self.executor_gpus is None:
            raise ConfigError(f"{where}.discovery_script is for the profile's executor GPUs; set {where}.executor_gpus too")

    @property
    def requested(self) -> bool:
        """Whether any task or executor resource is asked for (else the stage keeps the default profile)."""
        return any(
            v is not None for v in (self.task_cpus, self.task_gpus, self.executor_gpus, self.executor_memory_overhead)
        )


@dataclass(frozen=True)
class ResourcesConfig:
    """Per-stage resources (Spark resource profiles)."""

    scoring: ScoringResources = field(default_factory=ScoringResources)

    def _validate(self) -> None:
        pass


@dataclass(frozen=True)
class ValidationConfig:
    """The Great Expectations suite every run must pass before its output is published.

    Built in: row count, columns, types, no nulls in predictions and identity columns,
    one weights digest, this run's id. Added here by users: a minimum row count,
    value ranges and null fractions per column.
    """

    enabled: bool = True
    min_rows: Optional[int] = None
    """Fail when fewer rows were scored (e.g. an upstream table that arrived half empty)."""
    value_ranges: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Column -> ``[min, max]`` every value must lie in, e.g. ``{score: [0, 1]}``."""
    max_null_fraction: Mapping[str, float] = field(default_factory=dict)
    """Column -> the largest fraction of nulls allowed (for columns the suite does not require non-null)."""

    def _validate(self) -> None:
        if self.min_rows is not None and self.min_rows < 0:
            raise ConfigError(f"validation.min_rows must be >= 0, got {self.min_rows}")
        for column, bounds in self.value_ranges.items():
            if len(bounds) != 2 or bounds[0] > bounds[1]:
                raise ConfigError(f"validation.value_ranges.{column} must be [min, max] with min <= max, got {list(bounds)}")
        for column, fraction in self.max_null_fraction.items():
            if not 0 <= fraction <= 1:
                raise ConfigError(f"validation.max_null_fraction.{column} must be between 0 and 1, got {fraction}")


@dataclass(frozen=True)
class WriteConfig:
    """How a run's rows reach the output table."""

    mode: str = "overwrite"
    """``overwrite``: the table holds the last run. ``replace_run``: only this run's rows are replaced.
    ``incremental``: only rows whose id is new, whose input changed (``input_digest``) or whose output came from
    other weights or another scoring spec are scored; the rest are kept; one ``MERGE`` applies the changes."""
    delete_missing: bool = False
    """``incremental`` only: delete output rows whose id is no longer in the input (counted in the report either way)."""
    full_rescore: bool = False
    """``incremental`` only: score every input row and replace the output with them in one overwrite commit, instead
    of comparing; also turns an output written by ``overwrite`` / ``replace_run`` into an incremental one."""
    deletion_vectors: bool = True
    """``incremental`` only: an output this mode creates gets Delta deletion vectors (``delta.enableDeletionVectors``),
    so each later ``MERGE`` writes the changed rows and marks the old ones deleted instead of rewriting every data
    file that holds a changed id (on a nightly run that changes a few rows spread over the whole table, that is every
    file). Readers need the ``deletionVectors`` table feature (Delta reader version 3). An existing output is never
    altered: enable it there with ``ALTER TABLE ... SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)``."""
    chunk_rows: int = 2_000_000
    """Rows per resumable chunk: each chunk is committed to staging on its own, so a rerun after a crash
    scores only the chunks not yet committed."""
    staging: Optional[str] = None
    """Where chunks are staged before publishing: a directory, or a table prefix ``catalog.schema.prefix``
    (tables ``<prefix>_<run key>``); default: beside the output (a table ``<output>__lakescore_staging_<run key>``
    for a table output, ``<output dir>/_lakescore_staging/<name>/<run key>`` for a path)."""
    allow_output_in_input: bool = False
    """Allow an output (or errors) path inside the input's directory, where the next read of the input may pick it up."""

    def _validate(self) -> None:
        _require_one_of("write.mode", self.mode, WRITE_MODES)
        for key in ("delete_missing", "full_rescore"):
            if getattr(self, key) and self.mode != "incremental":
                raise ConfigError(f"write.{key} applies to write.mode incremental only, not {self.mode!r}")
        if self.chunk_rows < 1:
            raise ConfigError(f"write.chunk_rows must be >= 1, got {self.chunk_rows}")


@dataclass(frozen=True)
class JobConfig:
    """One scoring run, fully resolved. Build with :func:`load_config`."""

    input: Optional[str] = None
    output: Optional[str] = None
    input_format: str = "auto"
    """``auto`` (Delta if the path holds a Delta log, else Parquet), ``delta`` or ``parquet``."""
    task: str = "embed"
    id_col: Optional[str] = None
    text_col: Optional[str] = None
    """The text column (text tasks: ``classify``, ``embed``, ``ner``)."""
    feature_cols: tuple[str, ...] = ()
    """The numeric feature columns of a ``tabular`` model, in the order the program takes them."""
    feature_prefix: Optional[str] = None
    """``tabular``: use every input column starting with this prefix, in input order (when feature_cols is empty)."""
    errors: Optional[str] = None
    """Dead-letter table or path for rows that cannot be scored; default: ``<output>_errors``."""
    max_error_rate: float = 0.001
    """Fail the run (after writing the errors table, publishing nothing) when more rows than this fraction fail."""
    report: Optional[str] = None
    run_date: Optional[str] = None
    """``YYYY-MM-DD`` the run is for; the run id defaults to it (so reruns of one date replace each other)."""
    run_id: Optional[str] = None
    progress_seconds: int = 15
    """Seconds between progress lines while scoring; 0 turns them off."""
    model: ModelConfig = field(default_factory=ModelConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    def _validate(self) -> None:
        if not 0 <= self.max_error_rate <= 1:
            raise ConfigError(f"max_error_rate must be between 0 and 1, got {self.max_error_rate}")
        if self.run_date is not None:
            try:
                date.fromisoformat(self.run_date)
            except ValueError:
                raise ConfigError(f"run_date must be YYYY-MM-DD, got {self.run_date!r}") from None
        if self.run_id is not None and not RUN_ID.fullmatch(self.run_id):
            raise ConfigError(
                f"run_id must be 1-{RUN_ID_MAX} characters of letters, digits, '.', '_' or '-', starting with a letter "
                f"or digit (it names a partition directory and sits in the publish predicate), got {_shown(self.run_id)}"
            )
        _require_one_of("task", self.task, TASKS)
        if self.model.backend not in get_task(self.task).backends:
            raise ConfigError(
                f"model.backend {self.model.backend!r} cannot run task {self.task!r} "
                f"(it runs on {', '.join(get_task(self.task).backends)})"
            )
        for option in TASK_MODEL_OPTIONS:
            if getattr(self.model, option) is not None and option not in get_task(self.task).model_options:
                readers = ", ".join(name for name in TASKS if option in get_task(name).model_options)
                raise ConfigError(f"model.{option} applies to task {readers}, not {self.task!r}")
        if self.progress_seconds < 0:
            raise ConfigError(f"progress_seconds must be >= 0, got {self.progress_seconds}")
        if self.write.mode == "incremental" and self.validation.min_rows is not None:
            raise ConfigError(
                "validation.min_rows counts the rows a run publishes, which in write.mode incremental are only the "
                "changed ones; drop it for incremental runs"
            )
        _require_one_of("input_format", self.input_format, INPUT_FORMATS)

    def require_for_scoring(self) -> None:
        """Raise :class:`ConfigError` naming every setting a scoring run still lacks."""
        required = [
            ("input", self.input),
            ("output", self.output),
            ("model.source (--model)", self.model.source),
            ("id_col (--id-col)", self.id_col),
        ]
        reads_text = self.reads_text
        if reads_text:
            required.append(("text_col (--text-col)", self.text_col))
        else:
            required.append(("feature_cols (--feature-cols) or feature_prefix (--feature-prefix)", self.feature_cols or self.feature_prefix))
        missing = [flag for flag, value in required if not value]
        if missing:
            raise ConfigError("missing required setting(s): " + ", ".join(missing))
        if reads_text and self.id_col == self.text_col:
            raise ConfigError(f"id_col and text_col must differ, both are {self.id_col!r}")
        if not reads_text and self.text_col:
            raise ConfigError(f"text_col is for text tasks; task {self.task!r} reads feature_cols / feature_prefix")
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
    def reads_text(self) -> bool:
        """Whether the task reads one text column (else numeric feature columns), per the task registry."""
        return get_task(self.task).input_kind.is_text

    def resolved_run_id(self) -> Optional[str]:
        """The run id: given, else derived from ``run_date``, else ``None`` (the job makes one)."""
        return self.run_id or self.run_date

    def errors_ref(self) -> str:
        """The dead-letter table: configured, else ``<output>_errors`` beside the output (for a table, built
        from its parsed name: ``main.`my scores``` -> ``main.`my scores_errors```)."""
        from lakescore.jobs.platform.identifiers import parse_table_name
        from lakescore.jobs.platform.tables import is_path

        if self.errors:
            return self.errors
        if not self.output or is_path(self.output):
            return f"{(self.output or '').rstrip('/')}_errors"
        return str(parse_table_name(self.output, "output").with_suffix("_errors"))


def load_config(
    path: Optional[os.PathLike | str] = None,
    overrides: Sequence[str] = (),
    flags: Optional[Mapping[str, Any]] = None,
) -> JobConfig:
    """Build a validated :class:`JobConfig`.

    Precedence, lowest first: dataclass defaults, the YAML file at ``path``,
    ``overrides`` (``dotted.key=value`` strings, values parsed as YAML scalars),
    then ``flags`` (dotted keys to values; ``None`` values are ignored).

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
        _assign(tree, key.strip(), _parse_scalar(raw))
    for key, value in (flags or {}).items():
        if value is not None:
            _assign(tree, key, value)
    return _build(JobConfig, tree, prefix="")


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


def config_from_mapping(tree: Mapping[str, Any]) -> JobConfig:
    """A validated :class:`JobConfig` from the same tree a YAML file holds (sections as nested mappings).

    Raises :class:`ConfigError` exactly as :func:`load_config` does.
    """
    return _build(JobConfig, dict(tree), prefix="")


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
    cls: Any = JobConfig
    for i, part in enumerate(parts[:-1]):
        fields = {f.name for f in dataclasses.fields(cls)}
        if part not in fields:
            break  # _build names the unknown key
        hint = _without_none(typing.get_type_hints(cls)[part])
        origin = typing.get_origin(hint)
        if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
            return parts[: i + 1] + [".".join(parts[i + 1 :])]
        if not dataclasses.is_dataclass(hint):
            break
        cls = hint
    return parts


def _without_none(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _build(cls: type, data: Any, prefix: str) -> Any:
    """Instantiate dataclass ``cls`` from ``data``, checking keys and types recursively."""
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    hints = typing.get_type_hints(cls)
    unknown = [key for key in data if key not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(sorted(fields))}"
        raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{prefix}{name}")
    obj = cls(**kwargs)
    obj._validate()  # type: ignore[attr-defined]
    return obj


def _coerce(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, key)
    if dataclasses.is_dataclass(hint):
        return _build(hint, _shorthand(key, value), prefix=f"{key}.")
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}")
        if args[1] is str:  # Spark confs are strings on the JVM side; YAML may have parsed 8 or true.
            return {str(k): _spark_conf_value(v, f"{key}.{k}") for k, v in value.items()}
        return {str(k): _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if origin is tuple:
        if isinstance(value, str):  # --feature-cols a,b,c
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if hint is str:
        if isinstance(value, date):  # YAML reads 2026-11-20 as a date
            return value.isoformat()
        if isinstance(value, bool) and key in _ON_OFF_KEYS:  # YAML 1.1 reads on / off as true / false
            return "on" if value else "off"
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    raise TypeError(f"unsupported config type {hint!r} for {key}")  # a bug in this module, not user input


_ON_OFF_KEYS = frozenset({"scoring.dedup"})
"""String settings whose values include ``on`` / ``off``, which YAML reads as booleans."""


def _spark_conf_value(value: Any, key: str) -> str:
    if isinstance(value, (Mapping, list)) or value is None:
        raise ConfigError(f"{key} must be a single value (Spark conf keys are written whole), got {value!r}")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
