"""Steps 1–2, read and check: the session, the model source, the input and the output targets, before any compute.

:func:`open_input` resolves the model (a missing local one fails before a session starts), takes or
builds the session, reads the input lazily and checks its input contract (columns and
types, per the task's input kind) on the schema alone. :func:`check_targets` proves that
the output and errors targets can take this run's schemas. Nothing here runs a Spark job
over the input's rows (a folder of images: one job over its file listing, no file read).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from lakescore.jobs.config import ConfigError, JobConfig
from lakescore.jobs.platform.files.hadoop_files import FILE_STATUS, file_bytes, file_status
from lakescore.jobs.platform.files.model_staging import stage_model
from lakescore.jobs.platform.spark.adapter import NotOnConnect, can_delete_paths, rows_counter
from lakescore.jobs.platform.spark.session import get_or_create_session
from lakescore.jobs.platform.tables import (
    OutputColumnsError,
    TableError,
    TableRef,
    check_output_target,
    check_writable_path,
    column,
    delta_history,
    is_delta,
    is_path,
    last_commit,
    read_files,
    read_input,
    read_pinned,
)
from lakescore.jobs.references import parse_table_name, require_catalog_accepts
from lakescore.jobs.steps.context import PythonWorkerStart, RunContext, Targets, scoring_layout
from lakescore.jobs.steps.staging import staging_location
from lakescore.schemas.contracts import (
    FILE_COLUMN,
    IMAGE_COLUMN,
    PROMPT_COLUMN,
    FeatureInputContract,
    InputContractError,
    PromptInputContract,
    one_column_contract,
    resolve_feature_cols,
)
from lakescore.schemas.output import column_types, errors_schema, output_schema
from lakescore.udfs.models.model_source import ModelSpec, needs_staging, resolve_model_dir
from lakescore.udfs.options.generate import template_columns, template_parts
from lakescore.udfs.registry import get_task

__all__ = [
    "model_spec",
    "resolve_model",
    "model_input",
    "open_input",
    "read_source",
    "check_table_names",
    "check_writable",
    "check_targets",
    "check_drift_baseline",
    "check_paths_writable",
]

log = logging.getLogger(__name__)


def model_spec(cfg: JobConfig, feature_cols: tuple[str, ...] = ()) -> ModelSpec:
    """The worker-side model key for ``cfg``: its ``model`` section's settings (``auto`` backend / dtype made concrete
    for this host's CPU, :meth:`~lakescore.jobs.config.JobConfig.model_on_cpu`), the task, the feature columns and the
    task's own settings section (``generate``)."""
    kind = cfg.input_kind
    other = kind.name if kind is not get_task(cfg.task).input_kind else None
    section = get_task(cfg.task).options_section
    return ModelSpec.of(
        cfg.task,
        cfg.model_on_cpu()[0],
        feature_cols,
        input_kind=other,
        **({section: cfg.task_options()} if section else {}),
    )


IMAGE_READER_BATCH_ROWS = 64
"""Rows Spark's vectorized Parquet and ORC readers put in one batch in a session built for a run that reads images:
the reader reserves a whole batch of the image column at once (4,096 rows by default, so hundreds of megabytes of
pictures written as one row group, as pandas writes them) in a heap a local driver shares with its tasks, and dies out
of memory. An image costs far more to decode and score than to read in small batches."""


def session_defaults(cfg: JobConfig) -> dict[str, str]:
    """The Spark settings a session built for ``cfg``'s run starts with (the user's ``spark.conf`` overrides them)."""
    if not cfg.input_kind.file_extensions:
        return {}
    rows = str(IMAGE_READER_BATCH_ROWS)
    return {"spark.sql.parquet.columnarReaderBatchSize": rows, "spark.sql.orc.columnarReaderBatchSize": rows}


def open_input(cfg: JobConfig, spark: SparkSession | None = None) -> RunContext:
    """Resolve the model, take or build the session, read ``cfg.input`` pinned to one snapshot
    (:func:`~lakescore.jobs.platform.tables.read_pinned`) and check its contract.

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` for a model that cannot be
    found, :class:`~lakescore.jobs.platform.tables.TableError` for an unreadable input and
    :class:`~lakescore.schemas.contracts.InputContractError` for missing or ill-typed columns.
    """
    check_table_names(cfg)
    worker_imports = get_task(cfg.task).worker_imports(model_spec(cfg).backend, cfg.input_kind)
    session = functools.cache(
        lambda: (
            spark
            or get_or_create_session(
                cfg.spark, storage_refs(cfg), worker_imports, cfg.secret_env_names(), session_defaults(cfg)
            )[0]
        )
    )
    spec, model_dir = resolve_model(cfg, session)  # a missing local model fails here, before the session
    spark = session()
    layout = scoring_layout(spark, cfg)
    worker_start = PythonWorkerStart(spark, layout)  # its daemon imports the model runtime while this thread reads
    try:
        source, input_version, ignored = read_source(cfg, spark)
        source, input_cols = model_input(cfg, source)
    except BaseException:
        worker_start.cancel()
        raise
    if not cfg.column_setting:
        spec = dataclasses.replace(spec, feature_cols=input_cols)
    return RunContext(
        cfg,
        spark,
        source,
        input_cols,
        spec,
        layout,
        rows_counter(spark),
        model_dir,
        input_version,
        worker_start,
        ignored_files=ignored,
        input_pinned=_pinned(cfg, input_version),
    )


def resolve_model(
    cfg: JobConfig, session: Callable[[], SparkSession], feature_cols: tuple[str, ...] = ()
) -> tuple[ModelSpec, Path | None]:
    """The model spec of ``cfg`` (:func:`model_spec`) and the model's directory on this host: a Hadoop URI or an MLflow
    model staged first through ``session()`` (called only then), a local one found or
    :class:`~lakescore.udfs.models.model_source.ModelSourceError`; ``None`` for a model served elsewhere (no source,
    no files here). The job's run and the Python API resolve their model here."""
    spec = model_spec(cfg, feature_cols)
    if spec.source is None:
        return spec, None
    if needs_staging(spec.source):
        spec = stage_model(session(), spec, Path(cfg.model.cache_dir))
    return spec, resolve_model_dir(spec.source, spec.revision)


def _pinned(cfg: JobConfig, input_version: int | None) -> bool:
    """Whether :func:`read_source` pinned the input to one snapshot: a Delta version, or a Parquet path's listing (a
    table of another format is read as it is)."""
    return input_version is not None or (not cfg.reads_folder and TableRef.parse(cfg.input_ref(), "input").is_path)


def read_source(cfg: JobConfig, spark: SparkSession) -> tuple[DataFrame, int | None, int | None]:
    """``cfg.input`` read at one snapshot (:func:`~lakescore.jobs.platform.tables.read_pinned`): ``(DataFrame, Delta
    version, None)``; for ``input_format`` ``images`` or ``audio`` the folder's files of the task's extensions
    (:func:`~lakescore.jobs.platform.tables.read_files`): ``(DataFrame, None, other files ignored)``."""
    if not cfg.reads_folder:
        return (*read_pinned(spark, cfg.input_ref(), cfg.input_format), None)
    source, ignored = read_files(spark, cfg.input_ref(), cfg.input_kind.file_extensions)
    log.info(
        "input folder %s: %d other file(s) ignored (not %s)",
        cfg.input,
        ignored,
        "/".join(cfg.input_kind.file_extensions),
    )
    return with_empty_files(source), None, ignored


def with_empty_files(files: DataFrame) -> DataFrame:
    """``files`` (a ``binaryFile`` read) plus a row for each 0-byte file of its listing, which Spark's file scan
    leaves out: empty ``content`` (the image runner's ``null_input``, as for an empty file a path column names),
    length 0 and no modification time (the scan that would give it skips the file). One Spark job over the listing
    (no file is read) counts the rows; only when files are missing from them are their paths collected."""
    listed = files.inputFiles()
    if files.count() == len(listed):
        return files
    scanned = {row[0] for row in files.select("path").collect()}
    empty = sorted(set(map(_path_text, listed)) - scanned)
    log.info("input folder: %d empty file(s), dead-lettered null_input", len(empty))
    rows = [(path, None, 0, b"") for path in empty]
    return files.unionByName(files.sparkSession.createDataFrame(rows, files.schema)) if rows else files


def _path_text(uri: str) -> str:
    """A listed file's URI (``file:///a/b%20c.png``) as Hadoop's ``Path.toString`` writes it, which is how the
    ``binaryFile`` source's ``path`` column has it (``file:/a/b c.png``)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)  # a listed URI has its ? and # escaped: all of it after the authority is the path
    path = unquote(parts.path)
    return f"{parts.scheme}://{parts.netloc}{path}" if parts.netloc else f"{parts.scheme}:{path}"


def check_table_names(cfg: JobConfig) -> None:
    """Parse every table name the run uses (input, output, errors, ``write.staging`` prefix): a
    :class:`~lakescore.jobs.references.TableNameError` for an illegal one, before any session starts."""
    for what, ref in _table_refs(cfg):
        parse_table_name(ref, what)


def check_writable(run: RunContext) -> None:
    """Before any compute: the tables this run creates get names their catalog accepts, and staging can be
    cleaned up by this session (Spark Connect cannot delete a directory: stage into a table instead)."""
    cfg = run.cfg
    for what, ref in _table_refs(cfg):
        if what != "input":
            require_catalog_accepts(run.spark, parse_table_name(ref, what), what)
    staged_in_table = not is_path(cfg.write.staging) if cfg.write.staging else not is_path(cfg.output_ref())
    if not staged_in_table and not can_delete_paths(run.spark):
        raise NotOnConnect(
            f"over Spark Connect the staging area must be a table (lakescore cannot delete a directory through Spark "
            f"Connect): set write.staging to catalog.schema.prefix, or write to a table output (output {cfg.output!r})"
        )


def _table_refs(cfg: JobConfig) -> list[tuple[str, str]]:
    """``(what, reference)`` of every table (not path) the run reads or writes."""
    refs = [
        ("input", cfg.input),
        ("output", cfg.output),
        ("errors", cfg.errors_ref()),
        ("write.staging", cfg.write.staging),
    ]
    return [(what, ref) for what, ref in refs if ref and not is_path(ref)]


def check_targets(run: RunContext) -> Targets:
    """Prove the output and errors targets can take this run's schemas (``TableError`` otherwise)."""
    check_writable(run)
    cfg = run.cfg
    incremental = cfg.write.mode == "incremental"
    ranked = cfg.rank.enabled
    files = incremental and not ranked and run.reads_paths

    def schema(incremental: bool, files: bool) -> StructType:
        return output_schema(
            cfg.task,
            *run.row_fields,
            incremental=incremental,
            ranked=ranked,
            file_status=files,
            asked=cfg.asked_outputs(),
            chunked=cfg.chunked,
        )

    planned = schema(incremental, files)
    try:
        previous_version, replaces_layout = check_output_target(run.spark, cfg.output_ref(), planned), False
    except OutputColumnsError as mismatch:
        existing = column_types(mismatch.existing)
        if files and existing == column_types(schema(True, False)):
            # An incremental output written before outputs stored file status: a full rescore rewrites it with them;
            # an incremental run merges into it as it is, every file read for its digest.
            previous_version, replaces_layout = last_commit(run.spark, cfg.output_ref()).version, cfg.write.full_rescore
            if not replaces_layout:
                planned, files = schema(True, False), False
            return _targets(run, planned, previous_version, replaces_layout, files)
        others = [schema(not incremental, False)] + (
            [schema(True, True)] if run.reads_paths and not ranked and not incremental else []
        )
        if existing not in [column_types(other) for other in others]:
            raise
        _refuse_layout_switch(cfg)
        previous_version, replaces_layout = last_commit(run.spark, cfg.output_ref()).version, True
    return _targets(run, planned, previous_version, replaces_layout, files)


def _targets(
    run: RunContext, planned: StructType, previous_version: int | None, replaces_layout: bool, file_status: bool
) -> Targets:
    """:class:`Targets` for ``planned``, once the errors table and the paths the run writes are checked too."""
    cfg = run.cfg
    incremental = cfg.write.mode == "incremental"
    planned_errors = errors_schema(*run.id_fields, incremental=incremental)
    errors_ref = cfg.errors_ref()
    errors_layout_replaced = False
    try:
        # overwritten whole: no version needed
        check_output_target(run.spark, errors_ref, planned_errors, version=False)
    except OutputColumnsError as mismatch:
        # An errors table of the other write layout (with or without the incremental carry columns) is replaced whole,
        # columns too, by an overwrite; replace_run keeps other runs' rows, so it never replaces it.
        other = errors_schema(*run.id_fields, incremental=not incremental)
        if cfg.write.mode == "replace_run" or column_types(mismatch.existing) != column_types(other):
            raise
        errors_layout_replaced = True
    check_paths_writable(run)
    check_drift_baseline(run, previous_version)
    carried = (
        incremental and not errors_layout_replaced and previous_version is not None and is_delta(run.spark, errors_ref)
    )
    return Targets(
        planned,
        planned_errors,
        errors_ref,
        previous_version,
        replaces_layout,
        file_status,
        errors_layout_replaced,
        carried,
    )


def check_drift_baseline(run: RunContext, latest: int | None) -> None:
    """Raise :class:`~lakescore.jobs.config.ConfigError` when ``validation.drift.baseline`` names a version of the
    output (whose latest is ``latest``) that cannot be read or lacks a column the drift gate compares: the gate
    would otherwise publish unchecked. Only an output that does not exist yet passes (the drift step notes it)."""
    cfg = run.cfg
    version = cfg.validation.drift.baseline_version
    if version is None or latest is None:
        return
    key = f"validation.drift.baseline is {version}"
    if version <= latest:
        try:
            columns = read_input(run.spark, cfg.output_ref(), "delta", version=version).columns  # the log only, no rows
        except TableError:
            pass  # e.g. a version whose log was cleaned up: named below with the versions that remain
        else:
            missing = [c for c in get_task(cfg.task).output_profile(cfg.task_options()).columns if c not in columns]
            if not missing:
                return
            raise ConfigError(
                f"{key}, but version {version} of output {cfg.output!r} has no column {missing[0]!r} "
                "to compare with; name a version this task wrote, or previous"
            )
    versions = sorted(entry.version for entry in delta_history(run.spark, cfg.output_ref()))
    held = f"versions {versions[0]} to {versions[-1]}" if len(versions) > 1 else f"only version {versions[0]}"
    raise ConfigError(
        f"{key}, but output {cfg.output!r} has no readable version {version} (it has {held}); "
        "name one of those, or previous"
    )


def _refuse_layout_switch(cfg: JobConfig) -> None:
    """Raise ``TableError`` unless this run may replace an output written by the other layout: an overwrite replaces an
    incremental output, a full rescore makes any output incremental; ``replace_run`` keeps other runs' rows, so never.
    """
    if cfg.write.mode == "overwrite" or cfg.write.full_rescore:
        return
    if cfg.write.mode == "incremental":
        raise TableError(
            f"output {cfg.output!r} was written by write.mode overwrite or replace_run and has no input_digest / "
            "spec_digest columns to compare with; score every row once and make it incremental with --full-rescore "
            "(write.full_rescore: true)"
        )
    raise TableError(
        f"output {cfg.output!r} is an incremental output (it has input_digest / spec_digest columns), which "
        "write.mode replace_run cannot add rows to; replace it with --write-mode overwrite, or keep it incremental"
    )


def check_paths_writable(run: RunContext) -> None:
    """Before any compute: a file can be created where each path the run writes (output, errors, staging) will be,
    so a read-only or forbidden location fails here (``TableError``), not after the model has scored. Tables are
    the catalog's to place; over Spark Connect nothing is probed."""
    cfg = run.cfg
    staging = staging_location(cfg.output_ref(), cfg.write.staging, key="").rstrip("/")  # every run key's parent
    for what, ref in (("output", cfg.output_ref()), ("errors table", cfg.errors_ref()), ("staging", staging)):
        if is_path(ref):
            check_writable_path(run.spark, ref, what)


def model_input(cfg: JobConfig, source: DataFrame, where: str | None = None) -> tuple[DataFrame, tuple[str, ...]]:
    """``source`` with the model's input columns, after checking the input contract on the schema (no compute): the
    text or image column, the feature columns, (a prompted task with ``generate.prompt_template``) the rendered
    prompt, added as :data:`~lakescore.schemas.contracts.PROMPT_COLUMN`, or (an image column of paths) each file's
    bytes, added as :data:`~lakescore.schemas.contracts.IMAGE_COLUMN`, then the paths. ``where`` names ``source`` in
    errors (default: the configured input). The job's run and the Python API's ``transform`` resolve their input
    here; :class:`~lakescore.jobs.config.ConfigError` when the settings name no input column."""
    where = where or f"input {cfg.input!r}"
    for name in cfg.rank.partition_by:
        if name not in source.columns:
            raise InputContractError(
                f"rank.partition_by column {name!r} not found in {where}; available columns: "
                f"{', '.join(source.columns)}"
            )
    kind, template, input_col = cfg.input_kind, cfg.prompt_template, cfg.input_col
    if template and not kind.prompted:
        return render_prompts(template, cfg.id_cols, source, where), (PROMPT_COLUMN,)
    if kind.prompted and not template:  # the job's config refuses these first (require_for_scoring)
        raise ConfigError(
            f"task {cfg.task!r} with {kind.column_setting} reads each image with a prompt: pass prompt_template"
        )
    if kind.one_column and not input_col:
        hint = " (or prompt_template)" if kind.row_keys else ""
        raise ConfigError(f"task {cfg.task!r} reads {kind.name}: pass {kind.column_setting}{hint}")
    if cfg.column_setting and input_col:
        one_column_contract(kind.name, cfg.id_cols, input_col, cfg.text_pair_col).check(source.schema, where)
        source, input_cols = one_column_input(cfg, source, where)
        if kind.prompted and template:  # the prompt each image is read with: the last input column
            return render_prompts(template, cfg.id_cols, source, where), (*input_cols, PROMPT_COLUMN)
        return source, input_cols
    features = resolve_feature_cols(source.schema, cfg.feature_cols, cfg.feature_prefix, where)
    FeatureInputContract(cfg.id_cols, features).check(source.schema, where)
    return source, features


def render_prompts(template: str, id_cols: tuple[str, ...], source: DataFrame, where: str) -> DataFrame:
    """``source`` plus each row's prompt rendered from ``template``
    (:data:`~lakescore.schemas.contracts.PROMPT_COLUMN`):
    its literal text and named columns cast to strings, concatenated; null where a named column is null. Rendering
    in Spark makes the prompt the model's input everywhere: its digest, dedup, and the errors table's raw input."""
    PromptInputContract(id_cols, template_columns(template)).check(source.schema, where)
    if PROMPT_COLUMN in source.columns:
        raise InputContractError(
            f"{where} has a column named {PROMPT_COLUMN!r}, which lakescore renders prompts into; rename it"
        )
    parts = [
        part
        for literal, name in template_parts(template)
        for part in ([F.lit(literal)] if literal else []) + ([column(name).cast("string")] if name else [])
    ]
    return source.withColumn(PROMPT_COLUMN, F.concat(*parts) if parts else F.lit(""))


def one_column_input(cfg: JobConfig, source: DataFrame, where: str) -> tuple[DataFrame, tuple[str, ...]]:
    """``source`` and the model's input columns for a task reading ``cfg.input_col`` (its contract checked): the
    column itself, or for a string column of a kind that reads files (images) the files' bytes read from the paths
    (:func:`read_image_files`), then the paths; for text pairs, the text column then ``text_pair_col``.
    :class:`~lakescore.jobs.config.ConfigError` when the settings name no input column."""
    input_col = cfg.input_col
    if input_col is None:
        raise ConfigError(f"task {cfg.task!r} reads {cfg.input_kind.name}: pass {cfg.input_kind.column_setting}")
    if cfg.text_pair_col is not None:
        return source, (input_col, cfg.text_pair_col)
    reads_files = cfg.input_kind.file_extensions
    if reads_files and isinstance(source.schema[input_col].dataType, StringType):
        files = read_image_files(source, input_col, cfg.scoring.arrow_max_bytes_per_batch, where)
        return files, (IMAGE_COLUMN, input_col)
    return source, (input_col,)


def read_image_files(source: DataFrame, path_col: str, max_bytes: int, where: str) -> DataFrame:
    """``source`` plus the bytes of the file each row's ``path_col`` names
    (:data:`~lakescore.schemas.contracts.IMAGE_COLUMN`; null for a null path or a missing file), read lazily on the
    executors through the Hadoop filesystem of the path's scheme (:mod:`lakescore.jobs.platform.files.hadoop_files`),
    with the session's ``spark.hadoop.*`` settings, and the path with the file's length and modification time
    (:data:`~lakescore.schemas.contracts.FILE_COLUMN`, got without reading it). Only the Spark jobs that need the bytes
    read them (the digest, the scoring). Where a Spark Connect server refuses that reader's jar, Python reads local,
    ``file:`` and ``dbfs:/`` paths (:mod:`lakescore.udfs.image_files`), in slices of at most ``max_bytes``.

    Why not Spark's ``binaryFile`` source: that source takes its paths on the driver and fails the whole read when
    one is missing, where a missing file must be one row's ``missing_file``."""
    for name in (IMAGE_COLUMN, FILE_COLUMN):
        if name in source.columns:
            raise InputContractError(
                f"{where} has a column named {name!r}, which lakescore reads image files into; rename it"
            )
    path = column(path_col)
    status = file_status(source.sparkSession, path)
    described = F.struct(path.alias("path"), *[status[f.name].alias(f.name) for f in FILE_STATUS.fields])
    return source.withColumn(FILE_COLUMN, described).withColumn(
        IMAGE_COLUMN, file_bytes(source.sparkSession, path, max_bytes)
    )


def storage_refs(cfg: JobConfig) -> tuple[str, ...]:
    """Every location the run touches, so the session gets the connectors they need (e.g. S3A)."""
    return tuple(ref for ref in (cfg.input, cfg.output, cfg.errors_ref(), cfg.model.source, cfg.write.staging) if ref)
