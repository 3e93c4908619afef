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

Errors: :class:`ConfigError` (a :class:`ValueError`) naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml

__all__ = ["ConfigError", "JobConfig", "load_config", "TASKS"]

TASKS = ("embed",)
"""Scoring tasks this version can run."""


class ConfigError(ValueError):
    """A configuration file, override or flag is missing, unknown or ill-typed."""


@dataclass(frozen=True)
class ModelConfig:
    """Where the model comes from and how its outputs are shaped."""

    source: Optional[str] = None
    """A local model directory or a Hugging Face hub id."""
    revision: Optional[str] = None
    """Hub revision (branch, tag or commit); ignored for local directories."""
    device: str = "cpu"
    max_seq_length: Optional[int] = None
    """Token limit per text; default: the model's own sentence-transformers setting."""
    pooling: Optional[str] = None
    """Pooling for models without a sentence-transformers config: ``mean`` or ``cls``."""
    normalize: Optional[bool] = None
    """L2-normalise embeddings; default: as the model's own config says (plain HF dirs: true)."""

    def _validate(self) -> None:
        if self.device != "cpu":
            raise ConfigError(f"model.device: only 'cpu' is supported in this version, got {self.device!r}")
        if self.max_seq_length is not None and self.max_seq_length < 1:
            raise ConfigError(f"model.max_seq_length must be >= 1, got {self.max_seq_length}")
        if self.pooling not in (None, "mean", "cls"):
            raise ConfigError(f"model.pooling must be 'mean' or 'cls', got {self.pooling!r}")


@dataclass(frozen=True)
class SparkConfig:
    """How the SparkSession is built when lakescore builds it (never on Databricks)."""

    master: str = "local[*]"
    app_name: str = "lakescore"
    warehouse_dir: str = ".lakescore/warehouse"
    """Managed-table location; the local Derby metastore lives beside it."""
    metastore_dir: Optional[str] = None
    """Directory of the embedded Derby metastore; default: ``<warehouse_dir>/../metastore_db``."""
    jars_dir: str = "~/.cache/lakescore/jars"
    """Where ``lakescore fetch-jars`` puts the Delta (and S3A) jars, so sessions start without Maven."""
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


DEFAULT_MAX_BATCH_TOKENS = {"cpu": 1024, "cuda": 65536}
"""Padded tokens per forward batch when ``scoring.max_batch_tokens`` is unset, per device.

CPU: measured with ``lakescore sweep`` (all-MiniLM-L6-v2, one torch thread per task, 300
long-tailed reviews): 1024 -> 42.9 rows/s, 4096 -> 33.4, 8192 -> 28.3, 32768 -> 16.2.
Small batches of equal length keep the activations in cache; run the sweep for other
models and hardware."""


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

    def _validate(self) -> None:
        for key in ("max_batch_rows", "arrow_max_records_per_batch", "arrow_max_bytes_per_batch"):
            if getattr(self, key) < 1:
                raise ConfigError(f"scoring.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ConfigError(f"scoring.max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.partitions is not None and self.partitions < 1:
            raise ConfigError(f"scoring.partitions must be >= 1, got {self.partitions}")

    def max_tokens_for(self, device: str) -> int:
        """The token budget for ``device``: the configured one, else the device default."""
        return self.max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS.get(device.split(":")[0], DEFAULT_MAX_BATCH_TOKENS["cpu"])


@dataclass(frozen=True)
class ValidationConfig:
    """The Great Expectations suite run on what was written."""

    enabled: bool = True

    def _validate(self) -> None:
        pass


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
    report: Optional[str] = None
    run_id: Optional[str] = None
    progress_seconds: int = 15
    """Seconds between progress lines while scoring; 0 turns them off."""
    model: ModelConfig = field(default_factory=ModelConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    def _validate(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.progress_seconds < 0:
            raise ConfigError(f"progress_seconds must be >= 0, got {self.progress_seconds}")
        if self.input_format not in ("auto", "delta", "parquet"):
            raise ConfigError(f"input_format must be auto, delta or parquet, got {self.input_format!r}")

    def require_for_scoring(self) -> None:
        """Raise :class:`ConfigError` naming every setting a scoring run still lacks."""
        missing = [
            flag
            for flag, value in (
                ("input", self.input),
                ("output", self.output),
                ("model.source (--model)", self.model.source),
                ("id_col (--id-col)", self.id_col),
                ("text_col (--text-col)", self.text_col),
            )
            if not value
        ]
        if missing:
            raise ConfigError("missing required setting(s): " + ", ".join(missing))
        if self.id_col == self.text_col:
            raise ConfigError(f"id_col and text_col must differ, both are {self.id_col!r}")


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


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _assign(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = _split_key(dotted)
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
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
        return _build(hint, value, prefix=f"{key}.")
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}")
        # Spark confs are strings on the JVM side; YAML may have parsed 8 or true.
        return {str(k): _spark_conf_value(v, f"{key}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    raise TypeError(f"unsupported config type {hint!r} for {key}")  # a bug in this module, not user input


def _spark_conf_value(value: Any, key: str) -> str:
    if isinstance(value, (Mapping, list)) or value is None:
        raise ConfigError(f"{key} must be a single value (Spark conf keys are written whole), got {value!r}")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
