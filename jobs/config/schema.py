"""The whole job's schema (:class:`JobConfig`): its sections, top-level settings and the checks across them."""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Mapping
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from lakescore.jobs.config.hints import is_section, unwrapped
from lakescore.jobs.config.sections import (
    DRIFT_READS,
    EmbedConfig,
    GenerateConfig,
    ModelConfig,
    RankConfig,
    ResourcesConfig,
    ScoringConfig,
    SparkConfig,
    TranscribeConfig,
    ValidationConfig,
    WriteConfig,
)
from lakescore.jobs.config.values import (
    FILE_COLUMNS,
    FOLDER_FORMATS,
    INPUT_FORMATS,
    RUN_ID,
    RUN_ID_MAX,
    TASKS,
    IdColumns,
    Names,
    TaskName,
    comma_items,
    shown,
)
from lakescore.schemas.id_columns import CHUNK_INDEX, id_names
from lakescore.udfs.models.cpu_paths import CpuFacts, CpuPath, read_cpu_facts
from lakescore.udfs.options.base import ConfigError, Fraction, Section, Text, checked, cli
from lakescore.udfs.options.batch import BatchOptions
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.options.remote import MESSAGES_API, BatchableEndpoint
from lakescore.udfs.options.task import TaskEndpoint, TaskOptions
from lakescore.udfs.registry import (
    TASK_MODEL_OPTIONS,
    TASK_OPTION_SECTIONS,
    TASK_VALIDATION_OPTIONS,
    get_task,
)
from lakescore.udfs.registry import (
    TASKS as _TASKS,
)


def _run_date(value: str) -> str | None:
    try:
        date.fromisoformat(value)
    except ValueError:
        return f"must be YYYY-MM-DD, got {value!r}"
    return None


def _run_id(value: str) -> str | None:
    if RUN_ID.fullmatch(value):
        return None
    return (
        f"must be 1-{RUN_ID_MAX} characters of letters, digits, '.', '_' or '-', starting with a letter or digit "
        f"(it names a partition directory and sits in the publish predicate), got {shown(value)}"
    )


class JobConfig(Section):
    """One scoring run, fully resolved. Build with :func:`load_config` or :func:`config_from_mapping`."""

    input: Text | None = Field(None, json_schema_extra=cli("--input", sweep=True))
    """The table (``db.table``, ``catalog.schema.table``) or Parquet / Delta path to score."""
    output: Text | None = Field(None, json_schema_extra=cli("--output"))
    """The Delta table or path the scores go to, written as ``write.mode`` says."""
    input_format: Literal[INPUT_FORMATS] = Field("auto", json_schema_extra=cli("--input-format", sweep=True))
    """How to read a path input: ``auto`` (Delta if the path holds a Delta log, else Parquet), ``delta``, ``parquet``,
    or ``images``: every image file under the folder, recursively (by extension, any case: jpg, jpeg, png, webp, gif,
    bmp, tif, tiff; other files are ignored and counted), its path the id column and its bytes the image column;
    ``audio``: every audio file under the folder the same way (wav, flac, ogg, oga, opus, mp3, aiff, aif), its bytes
    the audio column."""
    task: TaskName = Field(
        "embed",
        json_schema_extra=cli("--task", sweep=True),
        description="What the model computes: "
        + ", ".join(f"``{t.name}`` ({t.summary})" for t in _TASKS.values())
        + ".",
    )
    id_col: IdColumns | None = Field(None, json_schema_extra=cli("--id-col"))
    """The input column copied unchanged to the output to identify each row: string, integer or decimal, under any
    name Delta stores (``review.id`` too; no space or ``,;{}()=``); or a list of such columns that together identify
    it (a composite id: ``[user_id, item_id]``, a flag takes ``user_id,item_id``)."""
    text_col: Text | None = Field(None, json_schema_extra=cli("--text-col", sweep=True))
    """The string column to score (text tasks: ``classify``, ``embed``, ``ner``; ``generate`` without
    ``generate.prompt_template``: the prompt), under any name (``review text`` too)."""
    text_pair_col: Text | None = Field(None, json_schema_extra=cli("--text-pair-col"))
    """``classify``: a second string column; each row's ``text_col`` and this column go to the model as one pair
    (query and passage, as a cross-encoder reads them), truncated longest side first; a row with either side null or
    empty is ``null_input``."""
    image_col: Text | None = Field(None, json_schema_extra=cli("--image-col"))
    """The image column to score (image tasks: ``image_classify``, ``image_embed``; ``generate`` with
    ``generate.prompt_template``: a vision-language model reads each image with its row's prompt): binary, each value a
    file's bytes in any format Pillow reads (JPEG, PNG, WebP, GIF, BMP, TIFF, ...), or string, each value the path of
    such a file (``s3a://``, ``dbfs:/``, ``file:``, any URI Hadoop reads; without a scheme, a path of ``fs.defaultFS``:
    local in local mode), read on the executors through Hadoop's filesystem with the ``spark.hadoop.*`` settings; a
    missing file is ``missing_file``. Set by ``input_format`` ``images``."""
    audio_col: Text | None = Field(None, json_schema_extra=cli("--audio-col"))
    """The recording column to transcribe (``transcribe``): binary, each value an audio file's bytes (WAV, FLAC, OGG,
    MP3, ...), or string, each value the path of such a file, read as ``image_col``'s paths are; a missing file is
    ``missing_file``. Set by ``input_format`` ``audio``."""
    feature_cols: Names = Field((), json_schema_extra=cli("--feature-cols"))
    """``tabular``: the numeric feature columns, in the order the program takes them (a flag takes ``a,b,c``)."""
    feature_prefix: Text | None = Field(None, json_schema_extra=cli("--feature-prefix"))
    """``tabular``: use every input column starting with this prefix, in input order (when ``feature_cols`` is
    empty)."""
    errors: Text | None = Field(None, json_schema_extra=cli("--errors"))
    """Dead-letter table or path for rows that cannot be scored; default: ``<output>_errors``."""
    max_error_rate: Fraction = 0.001
    """Fail the run (publishing nothing; the errors table is left as it was, the rows' reasons are in the report and
    the run's staging) when this run's new failures are more than this fraction of the input's rows (the output's
    scope: in ``write.mode: incremental`` the kept rows count, and failures carried from an earlier run, not scored
    again, count in the rows but not as new failures: ``write.retry_failed``)."""
    report: Text | None = Field(None, json_schema_extra=cli("--report", "JSON"))
    """Where to write the JSON run report (the HTML page goes beside it)."""
    run_date: Annotated[Text | None, checked(_run_date)] = Field(
        None, json_schema_extra=cli("--run-date", "YYYY-MM-DD")
    )
    """``YYYY-MM-DD`` the run is for; the run id defaults to it (so reruns of one date replace each other)."""
    run_id: Annotated[Text | None, checked(_run_id)] = Field(None, json_schema_extra=cli("--run-id"))
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
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    transcribe: TranscribeConfig = Field(default_factory=TranscribeConfig)
    rank: RankConfig = Field(default_factory=RankConfig)

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = {key: lists_from_text(key, shorthand(key, value)) for key, value in data.items()}
        setting = FOLDER_FORMATS.get(data.get("input_format"))
        if setting is not None:  # a folder's files: the id and the file's column are Spark's
            columns = {"id_col": FILE_COLUMNS["id_col"], setting: FILE_COLUMNS["image_col"]}
            data.update({key: name for key, name in columns.items() if data.get(key) is None})
        return data

    @model_validator(mode="after")
    def _combinations(self) -> JobConfig:
        task = get_task(self.task)
        if self.model.backend not in (*task.backends, "auto"):
            raise ConfigError(
                f"model.backend {self.model.backend!r} cannot run task {self.task!r} (it runs on "
                f"{', '.join(task.backends)})"
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
        for option, reads in DRIFT_READS.items():
            if getattr(self.validation.drift, option) is not None and getattr(profile, reads) is None:
                raise ConfigError(
                    f"validation.drift.{option} compares the {reads} output, which task {self.task!r} does not write "
                    "with these settings"
                )
        for section in TASK_OPTION_SECTIONS:
            given = sorted(getattr(self, section).model_fields_set)
            if given and section != task.options_section:
                raise ConfigError(f"{section}.{given[0]} applies to task {section}, not {self.task!r}")
        kind = self.input_kind
        if self.text_pair_col is not None and not task.pairs:
            readers = ", ".join(name for name in TASKS if get_task(name).pairs)
            raise ConfigError(f"text_pair_col applies to task {readers}, not {self.task!r}")
        folder = FOLDER_FORMATS.get(self.input_format)
        if folder is not None and kind.column_setting != folder:
            readers = ", ".join(name for name in TASKS if get_task(name).input_kind.column_setting == folder)
            raise ConfigError(f"input_format {self.input_format} is for task {readers}, not {self.task!r}")
        options = self.task_options()
        remotes = (("endpoint", options.endpoint), ("server", options.server)) if options is not None else ()
        for name, remote in remotes if kind.prompted else ():
            if remote is not None and remote.api not in ("chat", MESSAGES_API):
                raise ConfigError(
                    f"{kind.column_setting} with generate.{name}.api {remote.api}: an image is sent as a chat "
                    f"message's image_url part, which the completions API has no place for; set "
                    f"generate.{name}.api: chat"
                )
        for option in _RUNNER_SETTINGS:
            if getattr(self.scoring, option) is not None and option not in kind.runner_settings:
                readers = ", ".join(name for name in TASKS if option in get_task(name).input_kind.runner_settings)
                raise ConfigError(f"scoring.{option} applies to task {readers}, not {self.task!r}")
        if self.scoring.dedup == "on" and not self.deterministic:
            raise ConfigError(
                "scoring.dedup on scores one row per distinct input, but sampled generation (generate.temperature > 0) "
                "draws each row's text on its own; use dedup auto or off, or temperature 0"
            )
        reduced = self.model.quantize if self.model.quantize != "none" else self.model.dtype
        if (
            reduced not in ("float32", "auto") and not kind.is_text
        ):  # a lossy path runs only where its tolerance check does
            raise ConfigError(
                f"{reduced} is checked against float32 on a sample of the input before a run scores, which lakescore "
                f"does for text tasks only; task {self.task!r} runs float32 (drop model.dtype / model.quantize)"
            )
        if self.rank.enabled and self.chunked:
            raise ConfigError(
                "rank keeps the best rows of a key, and embed.chunk makes a document many rows whose "
                "embedding is no order; drop rank or embed.chunk"
            )
        if self.rank.enabled:
            fields = {f.name: f for f in self.output_fields()}
            if self.rank.order_by not in fields:
                raise ConfigError(
                    f"rank.order_by must be one of task {self.task!r}'s output columns "
                    f"({', '.join(fields)}), got {self.rank.order_by!r}"
                )
            if fields[self.rank.order_by].dataType.typeName() in ("array", "struct", "map"):
                raise ConfigError(
                    f"rank.order_by {self.rank.order_by!r} holds {fields[self.rank.order_by].dataType.simpleString()}"
                    "; rank by a column of single values (a number or a string)"
                )
        if self.provider_batch:
            self._check_provider_batch()
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
            ("model.source (--model)", self.model.source or self.endpoint()),
            ("id_col (--id-col)", self.id_col),
        ]
        setting = self.column_setting
        if setting:  # a prompt template names its own columns
            required.append((f"{setting} (--{setting.replace('_', '-')})", self.input_col or self.prompt_template))
        else:
            required.append(
                (
                    "feature_cols (--feature-cols) or feature_prefix (--feature-prefix)",
                    self.feature_cols or self.feature_prefix,
                )
            )
        missing = [flag for flag, value in required if not value]
        if self.input_kind.prompted and not self.prompt_template:
            missing.append("generate.prompt_template (--prompt-template), the prompt each image is read with")
        if missing:
            raise ConfigError("missing required setting(s): " + ", ".join(missing))
        if setting and self.input_col in self.id_cols:
            raise ConfigError(f"id_col and {setting} must differ, both are {self.input_col!r}")
        if self.text_pair_col is not None and self.text_pair_col in (*self.id_cols, self.input_col):
            raise ConfigError(f"text_pair_col {self.text_pair_col!r} must differ from id_col and {setting}")
        for other in _COLUMN_SETTINGS:
            if other != setting and getattr(self, other):
                readers = [get_task(name) for name in TASKS if get_task(name).input_kind.column_setting == other]
                reads = f"reads {setting}" if setting else "reads feature_cols / feature_prefix"
                raise ConfigError(
                    f"{other} is for {readers[0].input_kind.name} tasks ({', '.join(t.name for t in readers)}); "
                    f"task {self.task!r} {reads}"
                )
        if self.errors and self.errors == self.output:
            raise ConfigError(f"errors and output must differ, both are {self.errors!r}")
        self._check_writes_apart_from_input()

    def _check_writes_apart_from_input(self) -> None:
        """Refuse an output or errors target that is the input, or (unless allowed) a path inside its directory."""
        source = _location(self.input_ref())
        for key, ref in (("output", self.output_ref()), ("errors", self.errors_ref())):
            target = _location(ref)
            if target == source:
                raise ConfigError(f"{key} {ref!r} is the input: the run would overwrite what it reads")
            inside = _is_path(self.input_ref()) and target.startswith(source.rstrip("/") + "/")
            if inside and not self.write.allow_output_in_input:
                raise ConfigError(
                    f"{key} {ref!r} is inside the input directory {self.input!r}, where the next read of the input "
                    "would pick it up; write elsewhere, or set write.allow_output_in_input"
                )

    @property
    def id_cols(self) -> tuple[str, ...]:
        """The id column(s) as every step takes them: one name, or a composite id's names in the configured order
        (``()``: unset). ``id_col`` is the setting as written (one name stays a string)."""
        return id_names(self.id_col)

    @property
    def row_cols(self) -> tuple[str, ...]:
        """The input columns every output row copies: the id column(s), then ``rank.partition_by``'s others."""
        return tuple(dict.fromkeys([*self.id_cols, *self.rank.partition_by]))

    @property
    def column_setting(self) -> str | None:
        """The setting naming the task's one input column (``text_col``, ``image_col``), per the task registry;
        ``None`` for a task that reads numeric feature columns."""
        return self.input_kind.column_setting

    @property
    def input_kind(self):
        """The :class:`~lakescore.udfs.registry.InputKind` this run reads, per the task registry: the task's own, or
        another it reads when that kind's column setting is given (``generate`` with ``image_col``)."""
        return get_task(self.task).input_kind_for(lambda setting: getattr(self, setting, None))

    @property
    def input_col(self) -> str | None:
        """The task's one input column as configured (``text_col`` or ``image_col``); ``None`` for feature tasks."""
        return getattr(self, self.column_setting) if self.column_setting else None

    @property
    def reads_folder(self) -> bool:
        """Whether the input is a folder of files (``input_format`` ``images`` or ``audio``), not a table."""
        return self.input_format in FOLDER_FORMATS

    @property
    def prompt_template(self) -> str | None:
        """The template each row's prompt is rendered from (``generate.prefix_template`` then ``prompt_template``), for
        a task that reads prompts (else ``None``)."""
        return self.generate.template if self.input_kind.row_keys else None

    @property
    def deterministic(self) -> bool:
        """Whether a row's output depends only on its input (all tasks but sampled generation): what dedup needs."""
        options = self.task_options()
        return options.deterministic if options is not None else True

    def model_on_cpu(self, facts: CpuFacts | None = None) -> tuple[ModelConfig, CpuPath | None]:
        """The ``model`` section with ``auto`` backend / dtype made concrete for a CPU with ``facts`` (default: this
        host's, :func:`~lakescore.udfs.models.cpu_paths.read_cpu_facts`), and the path chosen (``None``: none was
        ``auto``); a lossy path only for a task whose input is text (the ones with a tolerance check)."""
        if "auto" not in (self.model.backend, self.model.dtype):
            return self.model, None
        return self.model.on_cpu(facts or read_cpu_facts(), self.input_kind.is_text)

    @property
    def groups_prefixes(self) -> bool:
        """Whether the scoring stage orders the rows by their rendered prompt (``scoring.group_prefixes``): for prompts
        an engine or provider caches by prefix (:attr:`~lakescore.udfs.registry.InputKind.prefix_cached`), each sent
        as a request of its own (an endpoint or a served engine), where the order changes no answer, or generated here
        by a head that computes a shared prefix once (``generate.share_prefix_tokens``), which needs a prefix's rows in
        one task."""
        options = self.task_options()
        grouping = options is not None and (
            options.remote or (isinstance(options, GenerateOptions) and options.shares_prefixes)
        )
        return self.scoring.group_prefixes and self.input_kind.prefix_cached and grouping

    def task_options(self) -> TaskOptions | None:
        """The task's own settings section, which its head takes as it is (``generate``: :class:`GenerateOptions`),
        else ``None``."""
        section = get_task(self.task).options_section
        options: TaskOptions | None = getattr(self, section) if section else None  # a field named by the registry
        return options

    @property
    def provider_batch(self) -> bool:
        """Whether the rows go through the endpoint provider's Batch API (``generate.endpoint.batch``,
        ``embed.endpoint.batch``)."""
        endpoint = self.endpoint()
        return isinstance(endpoint, BatchableEndpoint) and endpoint.batch is not None

    def batch_endpoint(self) -> tuple[TaskEndpoint, BatchOptions]:
        """The endpoint of a :attr:`provider_batch` run and its ``batch`` settings; :class:`ConfigError` for a run
        that sends its rows one request at a time."""
        endpoint = self.endpoint()
        if not isinstance(endpoint, BatchableEndpoint) or endpoint.batch is None:
            raise ConfigError("this run has no provider batch: set generate.endpoint.batch or embed.endpoint.batch")
        return endpoint, endpoint.batch

    def _check_provider_batch(self) -> None:
        """Refuse, in one line before compute, what a provider batch run cannot do."""
        task = get_task(self.task)
        batch = f"{task.options_section}.endpoint.batch"
        if task.batch_lines is None:
            raise ConfigError(f"{batch}: task {self.task} does not go through a provider's Batch API; drop it")
        if self.rank.enabled:
            raise ConfigError(
                "rank keeps the best rows of a key as the rows are scored; a provider batch "
                f"({batch}) returns them in any order, hours later: drop rank or batch"
            )
        if self.input_kind.prompted:
            raise ConfigError(
                f"{self.input_kind.column_setting} with {batch}: images with prompts go "
                f"through the per-row endpoint only (drop {batch})"
            )
        if self.scoring.dedup == "on":
            raise ConfigError(
                f"scoring.dedup on with {batch}: each row's line is sent as its own request "
                "(its custom_id); set scoring.dedup off or auto"
            )

    def endpoint(self) -> TaskEndpoint | None:
        """The task's remote endpoint settings (``generate.endpoint``, ``embed.endpoint``), or ``None``: one place that
        knows where they are."""
        options = self.task_options()
        return options.endpoint if options is not None else None

    def secret_env_names(self) -> tuple[str, ...]:
        """The environment variables that hold the run's secrets (the endpoint's ``api_key_env``)."""
        endpoint = self.endpoint()
        return (endpoint.api_key_env,) if endpoint is not None and endpoint.api_key_env else ()

    def output_fields(self) -> list:
        """The prediction columns this run writes: the task's own, then those its settings ask for
        (:meth:`~lakescore.udfs.registry.Task.output_fields_for`)."""
        return get_task(self.task).output_fields_for(self.task_options())

    @property
    def chunked(self) -> bool:
        """Whether an input row becomes many output rows (``embed.chunk``: a document, its chunks), identified by the
        ids and ``chunk_index``."""
        return get_task(self.task).chunked(self.task_options())

    @property
    def output_key_cols(self) -> tuple[str, ...]:
        """The columns identifying an output row: the id column(s), and for a chunked run ``chunk_index``."""
        return (*self.id_cols, CHUNK_INDEX) if self.chunked else self.id_cols

    def asked_outputs(self) -> tuple[str, ...]:
        """The optional prediction columns this run's task settings ask for (``token_logprobs``)."""
        return get_task(self.task).asked_outputs(self.task_options())

    def resolved_run_id(self) -> str | None:
        """The run id: given, else derived from ``run_date``, else ``None`` (the job makes one)."""
        return self.run_id or self.run_date

    def input_ref(self) -> str:
        """``input``, set in every run :meth:`require_for_scoring` passed; :class:`ConfigError` when it is not."""
        if self.input is None:
            raise ConfigError("missing required setting(s): input")
        return self.input

    def output_ref(self) -> str:
        """``output``, set in every run :meth:`require_for_scoring` passed; :class:`ConfigError` when it is not."""
        if self.output is None:
            raise ConfigError("missing required setting(s): output")
        return self.output

    def errors_ref(self) -> str:
        """The dead-letter table: configured, else ``<output>_errors`` beside the output (for a table, built
        from its parsed name: ``main.`my scores``` -> ``main.`my scores_errors```)."""
        return self.errors or self._beside_output("_errors")

    def metrics_ref(self) -> str:
        """The metrics table: ``validation.metrics_table``, else ``<output>_metrics`` beside the output, named as
        :meth:`errors_ref` names the errors table."""
        return self.validation.metrics_table or self._beside_output("_metrics")

    def _beside_output(self, suffix: str) -> str:
        from lakescore.jobs.references import is_path, parse_table_name

        if not self.output or is_path(self.output):
            return f"{(self.output or '').rstrip('/')}{suffix}"
        return str(parse_table_name(self.output, "output").with_suffix(suffix))


_COLUMN_SETTINGS = tuple(
    dict.fromkeys(t.input_kind.column_setting for t in _TASKS.values() if t.input_kind.column_setting)
)
"""Every setting naming a task's one input column: one the task does not read is a mistake."""

_RUNNER_SETTINGS = tuple(dict.fromkeys(o for t in _TASKS.values() for o in t.input_kind.runner_settings))
"""Every ``scoring.*`` setting only some input kinds' runners read (``max_image_pixels``)."""


def _is_path(ref: str) -> bool:
    """A path, not a table name: :func:`lakescore.jobs.references.is_path`'s rule, without importing Spark."""
    return any(ch in ref for ch in "/\\:")


def _location(ref: str) -> str:
    """``ref`` in a comparable form: a local path absolute, a URI as given, a table name lowercased."""
    if not _is_path(ref):
        return ref.lower()
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", ref) and not ref.startswith("file:"):
        return ref.rstrip("/")
    return os.path.abspath(ref.removeprefix("file:").removeprefix("//"))


SHORTHANDS = {"model": "source"}
"""Sections that may be given as one value, which sets one of their keys: ``model: /models/minilm`` is
``model: {source: /models/minilm}`` (in YAML, ``--set`` and the Python API alike)."""


def shorthand(key: str, value: Any) -> Any:
    """``value`` of section ``key`` as a mapping when it is a shorthand's single value (a string or path); else as it
    is."""
    if key in SHORTHANDS and isinstance(value, (str, os.PathLike)):
        return {SHORTHANDS[key]: os.fspath(value)}
    return value


def lists_from_text(key: str, value: Any) -> Any:
    """Section ``key``'s list settings given as text (``a,b``) as their items: the executors' sections
    (:mod:`lakescore.udfs.options.base`) take lists only, so the config reads the text form at its boundary."""
    section = JobConfig.model_fields.get(key)
    if section is None or not isinstance(value, Mapping) or not is_section(section.annotation):
        return value
    declared = section.annotation.model_fields
    return {
        name: comma_items(item)
        if isinstance(item, str)
        and name in declared
        and typing.get_origin(unwrapped(declared[name].annotation)[0]) is tuple
        else item
        for name, item in value.items()
    }
