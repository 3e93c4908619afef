"""The public Python API behind :mod:`lakescore`: :func:`score`, :func:`transform`, :func:`pandas_udf`.

Every entry point takes the same settings as the YAML config and validates them the same way
(:class:`~lakescore.jobs.config.ConfigError` naming the key) before any Spark or model work.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from lakescore.jobs.config import ConfigError, JobConfig, Option, config_from_mapping, config_options
from lakescore.jobs.report.model import RunReport
from lakescore.jobs.score_job import run_and_record
from lakescore.jobs.steps.context import scoring_layout
from lakescore.jobs.steps.read import model_input, resolve_model
from lakescore.jobs.steps.score import score_dataframe
from lakescore.schemas.contracts import InputContractError
from lakescore.schemas.output import ERROR_COLUMNS, WORKER_COLUMN, scored_schema
from lakescore.udfs.models.model_fit import check_model_fits
from lakescore.udfs.models.model_source import (
    ModelSourceError,
    ModelSpec,
    refuse_pickle_weights,
    require_directory,
    verify_sha256,
    weights_sha256,
)
from lakescore.udfs.pandas_udf import make_pandas_udf
from lakescore.udfs.registry import TASK_NAMES, TASK_OPTION_SECTIONS, get_task

__all__ = ["score", "transform", "pandas_udf"]

_OPTIONS = {
    o.name: o
    for o in config_options()
    if o.section in ("model", "scoring", *TASK_OPTION_SECTIONS) and o.key != "model.source"
}
_OPTIONS.update(
    {  # a task section's own sections (generate.endpoint, generate.server): one keyword each, a dict
        o.section.split(".")[1]: Option(".".join(o.section.split(".")[:2]), dict, None, "")
        for o in config_options()
        if o.section.split(".")[0] in TASK_OPTION_SECTIONS and o.section.count(".") >= 1
    }
)
"""The keyword options of :func:`transform` and :func:`pandas_udf`, by field name: every ``model.*`` setting but the
source (their ``model`` argument), every ``scoring.*`` one and the tasks' own (``generate.*``: ``max_new_tokens``, ...,
and ``endpoint`` / ``server`` as dicts)."""
_TASK_SUBSECTIONS = {
    (o.section.split(".")[0], o.section.split(".")[1]): Option(".".join(o.section.split(".")[:2]), dict, None, "")
    for o in config_options()
    if o.section.split(".")[0] in TASK_OPTION_SECTIONS and o.section.count(".") >= 1
}
"""A task section's own sections by ``(task section, keyword)``: where two tasks share a keyword (``endpoint``,
``server``), the run's task takes its own (``generate.endpoint`` or ``embed.endpoint``)."""


def score(spark: SparkSession | None = None, **config: Any) -> RunReport:
    """Run the whole scoring job and return its report; writes the JSON report when ``report`` is set (for a run that
    raises too, as the CLI does), and the run's row in the metrics table (``validation.metrics``).

    ``config`` takes the YAML config's keys, sections as dicts, e.g.
    ``score(input="db.reviews", output="db.embeddings", task="embed", id_col="id", text_col="body",
    model={"source": "/models/minilm"}, write={"mode": "replace_run"}, run_date="2026-11-23")``;
    ``model="/models/minilm"`` is its ``source`` alone.
    ``spark``: the session to run in (a notebook's); default: lakescore builds one from ``config["spark"]``.

    Raises what the CLI maps to exit code 2 before any compute (:class:`~lakescore.jobs.config.ConfigError`,
    :class:`~lakescore.schemas.contracts.InputContractError`, :class:`~lakescore.jobs.platform.tables.TableError`,
    :class:`~lakescore.udfs.models.model_source.ModelSourceError`) and
    :class:`~lakescore.jobs.platform.tables.WriteConflictError` when a concurrent run won. A failed validation,
    error-rate or drift check does not raise: the report's ``status`` says so and nothing was published.
    """
    return run_and_record(config_from_mapping(config), spark)


def transform(
    df: DataFrame,
    *,
    task: str,
    model: str | Path | Mapping[str, Any],
    text_col: str | None = None,
    feature_cols: Sequence[str] | None = None,
    id_col: str | None = None,
    image_col: str | None = None,
    audio_col: str | None = None,
    **options: Any,
) -> DataFrame:
    """``df`` scored lazily: no write, no validation, the job's batching core and model cache. ``model``: its source
    (a path, URI or hub id), or the config's ``model`` section as a dict.

    Columns: every column of ``df`` (only ``id_col`` when given), then the task's prediction
    columns (:mod:`lakescore.schemas.output`; null where a row could not be scored), ``model_sha256``,
    and ``_reason`` / ``_error`` saying why a row was not scored. ``text_col`` for text tasks (``generate``: the
    prompt as the model reads it, or ``prompt_template=`` naming columns, each row's prompt rendered as the job renders
    it; ``id_col`` then seeds each row's sampling), ``image_col`` (binary: encoded images;
    string: paths of image files) for image tasks, ``audio_col`` (the same, of audio files) for ``transcribe``,
    ``feature_cols`` (in the model's order) for feature tasks. ``options``: any ``model.*`` or ``scoring.*`` setting by
    its name (``device``, ``dtype``, ``max_seq_length``, ``max_batch_tokens``, ...; docs/configuration.md lists them),
    validated as the config is. Arrow batch sizes are the session's own and ``dedup`` is the job's: both are refused
    here.

    Raises :class:`~lakescore.jobs.config.ConfigError` for a bad setting,
    :class:`~lakescore.schemas.contracts.InputContractError` for missing, ill-typed or colliding
    columns and :class:`~lakescore.udfs.models.model_source.ModelSourceError` for a model that cannot be
    found or that the workers would refuse (no weights, refused pickle weights, an unreadable config,
    other weights than ``expect_sha256``), all before any Spark job runs.
    """
    cfg = _notebook_config(
        task, model, feature_cols, options, text_col=text_col, image_col=image_col, audio_col=audio_col, id_col=id_col
    )
    if len(cfg.id_cols) > 1:
        raise ConfigError(f"transform keeps one id column, got {list(cfg.id_cols)}; omit id_col to keep every column")
    keep = [id_col] if id_col else list(df.columns)
    df, input_cols = model_input(cfg, df, "the DataFrame")
    taken = sorted(set(keep) & set(scored_schema(task, asked=cfg.asked_outputs(), chunked=cfg.chunked).names))
    if taken:
        raise InputContractError(f"the DataFrame already has column(s) {taken} that task {task!r} writes; rename them")
    spec = _resolved_spec(df.sparkSession, cfg, input_cols)
    scored = score_dataframe(
        df, cfg, spec, keep, input_cols, layout=scoring_layout(df.sparkSession, cfg), key_col=id_col
    )
    return scored.drop(ERROR_COLUMNS[2], WORKER_COLUMN)


def pandas_udf(
    *, task: str, model: str | Path | Mapping[str, Any], feature_cols: Sequence[str] | None = None, **options: Any
):
    """An iterator-style pandas UDF that scores with ``model``: ``df.select(udf("body"))``.

    Text tasks take one string column; feature tasks one numeric column per ``feature_cols``
    entry, in that order (the names document the model's order). Returns the task's one output
    column (e.g. ``embedding``), or a struct of its output columns (e.g. ``label``, ``score``,
    ``probs``); null where a row could not be scored. ``options`` as for :func:`transform`.
    The model loads once per Python worker; rows are length-sorted and token-budgeted inside each
    Arrow batch, order restored. Slower than :func:`transform` (pandas conversion per batch).

    Raises :class:`~lakescore.jobs.config.ConfigError` or :class:`~lakescore.udfs.models.model_source.ModelSourceError`
    when the settings or the model are wrong (as for :func:`transform`), before any Spark job runs.
    """
    cfg = _notebook_config(task, model, feature_cols, options)
    spec = _resolved_spec(SparkSession.getActiveSession(), cfg, tuple(cfg.feature_cols))
    return make_pandas_udf(spec, max_tokens=cfg.scoring.max_batch_tokens, max_rows=cfg.scoring.max_batch_rows)


def _notebook_config(
    task: str,
    model: str | Path | Mapping[str, Any],
    feature_cols: Sequence[str] | None,
    options: Mapping[str, Any],
    **columns: str | None,
) -> JobConfig:
    """The typed config of a notebook call (``columns``: ``text_col``, ``image_col``, ``audio_col``, ``id_col``);
    :class:`ConfigError` for unknown or bad settings, or a feature task without ``feature_cols``."""
    section = dict(model) if isinstance(model, Mapping) else {"source": str(model)}
    tree: dict[str, Any] = {"task": task, "model": section, "scoring": {}}
    own = get_task(task).options_section if task in TASK_NAMES else None
    for key, value in options.items():
        option = (_TASK_SUBSECTIONS.get((own, key)) if own is not None else None) or _OPTIONS.get(key)
        if option is None:
            taken = [name for name, o in _OPTIONS.items() if not o.job_only]
            close = difflib.get_close_matches(key, taken, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown option {key!r}; {hint}options: {', '.join(taken)}")
        if option.job_only:
            raise ConfigError(f"option {key!r} ({option.key}) applies to the scoring job only (lakescore.score)")
        tree.setdefault(option.section, {})[key] = value
    cfg = config_from_mapping({**tree, **columns, "feature_cols": list(feature_cols or ())})
    if cfg.model.quantize != "none":  # the tolerance check is a preflight of the job (score), which these lack
        raise ConfigError(
            f"quantize={cfg.model.quantize!r} is checked against float32 before a scoring job starts; use "
            "lakescore.score, or backend='onnx' without quantize here"
        )
    if not cfg.column_setting and not feature_cols:
        raise ConfigError(f"task {task!r} reads numeric features: pass feature_cols")
    return cfg


def _resolved_spec(spark: SparkSession | None, cfg: JobConfig, feature_cols: tuple[str, ...]) -> ModelSpec:
    """The model spec (:func:`~lakescore.jobs.steps.read.resolve_model`, a remote model staged through ``spark``);
    fails fast when the model is missing or the workers would refuse it (:func:`_check_model`)."""

    def session() -> SparkSession:
        if spark is None:
            raise ConfigError(
                f"model {cfg.model.source!r} is remote: start a SparkSession first, so lakescore can stage it"
            )
        return spark

    spec, model_dir = resolve_model(cfg, session, () if cfg.column_setting else feature_cols)
    if model_dir is not None:  # None: generate.endpoint, no files here; the workers' first request is its check
        _check_model(spec, model_dir, cfg.column_setting is not None)
    return spec


def _check_model(spec: ModelSpec, model_dir: Path, transformers_dir: bool) -> None:
    """Raise :class:`ModelSourceError` here for what the workers' loaders would refuse in the first Spark job: a text
        or image model (``transformers_dir``) that is a file, holds only pickle weights (without ``allow_pickle``), has
        no ``config.json`` (nor a sentence-transformers ``modules.json``) or a config that is not JSON; no weight file;
        weights other than ``expect_sha256``; an architecture of another kind than the task's, or settings the model
        cannot take
    (:func:`~lakescore.udfs.models.model_fit.check_model_fits`). The job checks the same on its executors (preflight);
    these calls have no preflight."""
    if transformers_dir:
        require_directory(model_dir, spec.task)
        refuse_pickle_weights(model_dir, spec.allow_pickle)
        if not (model_dir / "config.json").is_file() and not (model_dir / "modules.json").is_file():
            raise ModelSourceError(f"model directory {model_dir} has no config.json")
        for config in sorted(model_dir.glob("*config*.json")) + sorted(model_dir.glob("modules.json")):
            try:
                json.loads(config.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ModelSourceError(f"model config {config} cannot be read as JSON: {exc}") from exc
        check_model_fits(spec, model_dir)  # a classifier's checkpoint given to generate: refused here, as the job does
    verify_sha256(weights_sha256(model_dir), spec.expect_sha256, spec.source)
