"""The task registry: every task lakescore runs, and everything that depends on its name.

A task is a name, an input kind and a head loader. What the rest of lakescore
needs to know about a task is derived here, so nothing else branches on the
task name:

* config validation and the CLI's choices (:data:`TASK_NAMES`);
* the input contract and the errors table's raw-input column (:attr:`Task.input_kind`:
  ``text`` reads one string column, ``features`` numeric columns, ``image`` one binary column of encoded images,
  ``audio`` one of encoded recordings);
* the runner that turns Arrow batches into model input (:attr:`InputKind.runner`);
* the preflight sample every executor scores before the run (:meth:`InputKind.preflight_sample`);
* the modules a worker imports, for the Python daemon to import before it forks workers (:meth:`Task.worker_imports`);
* the output columns, from :mod:`lakescore.schemas.output` (:meth:`Task.output_fields_for`: the task's own, and
  those its settings ask for, :attr:`Task.setting_outputs`);
  a head returns one Arrow array per output field, in that order, and never names them;
* which output columns the run's prediction profile and drift figures read (:meth:`Task.output_profile`).

Adding a task: one head module in ``udfs/`` (``tokenize``/``forward``/``columns``/``score``
and a ``load_<head>(spec, model_dir)`` function), one :class:`Task` entry in :data:`TASKS`,
one entry in :data:`lakescore.schemas.output.PREDICTIONS`, tests against the reference
library on a tiny seeded model. This module imports no model library: loaders import
their head lazily, so the driver and the CLI stay light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.options.generate import FINISH_REASONS

if TYPE_CHECKING:  # the registry stays import-light: the CLI reads it before any Spark or model work
    import pyarrow as pa
    from pyspark.sql.types import StructField

    from lakescore.udfs.heads.protocol import Head
    from lakescore.udfs.remote.batch_lines import BatchLines

__all__ = [
    "named",
    "InputKind",
    "OutputProfile",
    "Task",
    "TEXT",
    "PROMPT",
    "FEATURES",
    "IMAGE",
    "IMAGE_PROMPT",
    "AUDIO",
    "TASKS",
    "TASK_NAMES",
    "get_task",
    "named_columns",
]


def named(ref: str) -> Any:
    """What ``"module:name"`` names, its module imported now: how the registry refers to executor code (loaders,
    runners, model checks) without importing it."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class InputKind:
    """What a task reads: ``text`` (one string column), ``features`` (numeric columns) or ``image`` (one binary
    column of encoded images)."""

    name: str
    runner_ref: str
    """``"module:Class"`` of the runner that prepares Arrow batches for the head (:mod:`lakescore.udfs.runners`),
    imported on first use as the loaders are: the registry names the executors' code, it does not import it."""
    worker_imports: tuple[str, ...] = ()
    """Modules every head of this kind imports in a worker, whatever its backend."""
    row_keys: bool = False
    """The runner reads each row's id too (``key_col``), to seed what it draws for the row (generation's sampling)."""
    column_setting: str | None = None
    """The config setting naming the one input column (``text_col``, ``image_col``); ``None``: numeric feature
    columns."""
    runner_settings: tuple[str, ...] = ()
    """The ``scoring.*`` settings this kind's runner takes as keyword arguments (config validation refuses them for
    the other kinds)."""
    file_extensions: tuple[str, ...] = ()
    """The file name extensions (lower case) a folder input of this kind reads (``input_format`` ``images``); ``()``:
    this kind reads tables only."""
    prompted: bool = False
    """The kind reads a rendered prompt (``generate.prompt_template``, required) beside its column: the job adds the
    prompt as the last input column."""
    prefix_cached: bool = False
    """The kind's rows are prompts that an engine's prefix cache or a provider's prompt cache reuses when they share a
    prefix: over an endpoint or a served engine the scoring stage orders them by prompt (``scoring.group_prefixes``)."""
    timed_rows: int = 64
    """Copies of the preflight sample the preflight scores as one batch, timed (the fastest of a few calls, so a first
    call's warm-up is not counted): the model's seconds per row, by which the scoring stage decides whether shuffling
    the rows for finer progress is worth its cost. 0: not timed."""

    @property
    def is_text(self) -> bool:
        return self.name == "text"

    @property
    def one_column(self) -> bool:
        """Whether the task reads one column (text or images), digested and shown in the errors table as it is."""
        return self.column_setting is not None

    @property
    def runner(self) -> type:
        """``runner(head, input_cols)``: prepares Arrow batches for the head."""
        return named(self.runner_ref)

    def preflight_sample(self, spec: ModelSpec, rows: int = 1) -> Any:
        """``rows`` copies of one input row, as the head's ``score`` takes them, for the executors' preflight."""
        import numpy as np

        if self.name == "image":
            from lakescore.udfs.images import preflight_image

            return [preflight_image()] * rows
        if self.name == "audio":
            from lakescore.udfs.audio import preflight_audio

            return [preflight_audio()] * rows
        return ["lakescore preflight"] * rows if self.is_text else np.zeros((rows, len(spec.feature_cols)))


TEXT = InputKind(
    "text",
    "lakescore.udfs.runners:TextRunner",
    ("transformers.tokenization_utils_tokenizers",),
    column_setting="text_col",
)
PROMPT = InputKind(  # not timed: a batch of prompts is a whole generation each
    "text",
    "lakescore.udfs.runners:PromptRunner",
    ("transformers.tokenization_utils_tokenizers",),
    row_keys=True,
    column_setting="text_col",
    prefix_cached=True,
    timed_rows=0,
)
"""One string column, as :data:`TEXT`, read as prompts (rendered by the job from ``generate.prompt_template``)."""
FEATURES = InputKind("features", "lakescore.udfs.runners:MatrixRunner")
IMAGE = InputKind(
    "image",
    "lakescore.udfs.runners:ImageRunner",
    ("PIL.Image", "PIL.ImageOps", "transformers.models.auto.image_processing_auto"),
    column_setting="image_col",
    runner_settings=("max_image_pixels",),
    file_extensions=("jpg", "jpeg", "png", "webp", "gif", "bmp", "tiff", "tif"),
    timed_rows=8,  # an image costs milliseconds at least: a few tell that
)
"""One binary column of encoded images (a folder of image files is read as one: ``input_format`` ``images``)."""
IMAGE_PROMPT = InputKind(  # not timed: a row is a whole generation
    "image",
    "lakescore.udfs.runners:ImagePromptRunner",
    (*IMAGE.worker_imports, "transformers.models.auto.processing_auto"),
    row_keys=True,
    column_setting="image_col",
    runner_settings=IMAGE.runner_settings,
    file_extensions=IMAGE.file_extensions,
    prompted=True,
    timed_rows=0,
)
"""Images read as :data:`IMAGE` reads them, each with its row's prompt rendered from ``generate.prompt_template``."""
AUDIO = InputKind(
    "audio",
    "lakescore.udfs.audio_runner:AudioRunner",
    ("soundfile", "soxr", "transformers.models.auto.feature_extraction_auto"),
    column_setting="audio_col",
    file_extensions=("wav", "flac", "ogg", "oga", "opus", "mp3", "aiff", "aif"),
    timed_rows=0,  # a recording is seconds to hours of windows: one row's time says little of the next
)
"""One binary column of encoded recordings (a folder of audio files is read as one: ``input_format`` ``audio``)."""


@dataclass(frozen=True)
class OutputProfile:
    """Which output columns a run's prediction profile and drift figures read, by what they hold (``None``: none)."""

    label: str | None = None
    """A categorical prediction: its shares, and the Jensen-Shannon distance between two runs' shares."""
    score: str | None = None
    """A numeric prediction: its deciles, and the population stability index between two runs."""
    embedding: str | None = None
    """A vector: the deciles of its L2 norm, and the cosine between two runs' vectors of one id."""
    text: str | None = None
    """Generated text: the deciles of its length in characters."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns named, each once."""
        return tuple(dict.fromkeys(c for c in (self.label, self.score, self.embedding, self.text) if c))


def _generated_profile(options: Any) -> OutputProfile:
    """``generate``: with ``choices`` the text is one of them, a label; else free text, profiled by its length."""
    if options is not None and options.choices:
        return OutputProfile(label="generated_text")
    return OutputProfile(text="generated_text")


@dataclass(frozen=True)
class Task:
    """One scoring task: its name, input kind and the head loader ``"module:function"``."""

    name: str
    input_kind: InputKind
    loader: str | Callable[[ModelSpec, Path | None], Head]
    """``loader(spec, model_dir) -> head``, or its ``"module:function"`` (imported on first use): the head in this
    process over :attr:`input_kind`."""
    summary: str = ""
    other_inputs: tuple[InputKind, ...] = ()
    """Input kinds the task reads besides :attr:`input_kind`, each when its column setting is given (``generate`` reads
    images with prompts when ``image_col`` is set): :meth:`input_kind_for`."""
    backends: tuple[str, ...] = ("torch", "onnx")
    """What can run this task's forward (:mod:`lakescore.udfs.models.backends`); config validation reads it."""
    forward_imports: tuple[str, ...] | None = None
    """The modules this task's forward imports, when it runs none of :mod:`lakescore.udfs.models.backends`."""
    model_options: tuple[str, ...] = ()
    """The ``model.*`` settings only this task reads (see :data:`TASK_MODEL_OPTIONS`); config validation refuses
    them for the other tasks."""
    options_section: str | None = None
    """The config section (and :class:`ModelSpec` field) holding this task's own settings, e.g. ``generate``."""
    optional_outputs: tuple[str, ...] = ()
    """Output columns that may be null on a scored row (``choice_logprobs`` without ``choices``): the suite does not
    require them non-null."""
    setting_outputs: Mapping[str, str] = field(default_factory=dict)
    """Output column -> the boolean setting of the task's own section that adds it (``token_logprobs``:
    ``generate.logprobs``; the columns are :data:`lakescore.schemas.output.ASKED_PREDICTIONS`). Without the setting the
    column is not written at all: :meth:`output_fields_for` says which columns a run writes."""
    output_value_sets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Output column -> the values it may hold: the suite checks every published row."""
    validation_options: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """The ``validation.*`` settings only this task reads (config validation refuses them for the other tasks), each
    capping the share of published rows whose output ``column`` holds ``value``: name -> ``(column, value)``."""
    profile: OutputProfile | Callable[[Any], OutputProfile] = OutputProfile()
    """Which output columns the prediction profile and the drift gate read, or a function of the task's own settings
    (:meth:`output_profile`) that says so."""
    architectures: tuple[str, ...] = ()
    """Parts of a transformers class name that fit this task (``ForSequenceClassification``): a model whose
    ``config.json`` ``architectures`` hold none is refused on the driver (:mod:`lakescore.udfs.models.model_fit`).
    ``()``: any architecture (a base model is read from any checkpoint)."""
    model_check: str | None = None
    """``"module:function"``, ``check(spec, model_dir, config)``: the driver's check of the task's settings against
    the model's ``config.json`` (a dict), raising :class:`~lakescore.udfs.models.model_source.UnfitModelError`."""
    pairs: bool = False
    """Whether the task reads a second text column (``text_pair_col``) and scores each row's two texts as one pair, as a
    cross-encoder does; config validation refuses ``text_pair_col`` for the other tasks."""
    expands: str | None = None
    """The boolean property of the task's own settings section that makes one input row many output rows (``embed``:
    ``chunked``, a document and its chunks, :data:`lakescore.schemas.output.CHUNK_COLUMNS`): the scoring function then
    stages one row per input with the rows it becomes in one list column, and the publish writes them one per row."""
    other_loaders: Mapping[tuple[str, bool], str] = field(default_factory=dict)
    """The task's other heads' loaders (``"module:function"``), by the input kind they read and whether they score
    over the wire (the task's own settings say ``remote``: an endpoint or a served engine): :meth:`load` chooses."""
    batch_lines: str | None = None
    """``"module:function"``, ``lines(spec, output_types) -> BatchLines``: what the task's rows become as lines of a
    provider's Batch API (``<section>.endpoint.batch``, :mod:`lakescore.udfs.remote.batch_lines`); ``None``: the task
    does not go out as batch lines, and config validation refuses the section."""
    in_job: bool = True
    """Whether the scoring job and the Python API run this task (:data:`TASK_NAMES`). ``False``: its head runs and is
    tested here, but the job does not read its input yet, so config validation refuses it rather than run it
    half-wired."""

    def input_kind_for(self, setting: Callable[[str], Any]) -> InputKind:
        """The input kind a run reads: the first of :attr:`other_inputs` whose column setting ``setting(name)`` gives,
        else :attr:`input_kind`."""
        return next(
            (kind for kind in self.other_inputs if kind.column_setting and setting(kind.column_setting)),
            self.input_kind,
        )

    def input_kind_of(self, spec: ModelSpec) -> InputKind:
        """The input kind a worker's :class:`ModelSpec` reads (its ``input_kind`` names one of :attr:`other_inputs`)."""
        return next((kind for kind in self.other_inputs if kind.name == spec.input_kind), self.input_kind)

    def worker_imports(self, backend: str, kind: InputKind | None = None) -> tuple[str, ...]:
        """The modules a Python worker scoring this task on ``backend`` imports: the scoring runtime, the input
        kind's and the forward's. A daemon imports them once before forking workers
        (:mod:`lakescore.jobs.platform.spark.local.python_daemon`)."""
        if self.forward_imports is not None:
            forward = self.forward_imports
        else:
            from lakescore.udfs.models.backends import WORKER_IMPORTS

            forward = WORKER_IMPORTS[backend]
        return ("lakescore.udfs.scoring_udf", *(kind or self.input_kind).worker_imports, *forward)

    def output_profile(self, options: Any = None) -> OutputProfile:
        """The profiled output columns of a run with the task's own settings ``options`` (``generate``:
        :class:`~lakescore.udfs.options.generate.GenerateOptions`; ``None`` for tasks without a section)."""
        return self.profile(options) if callable(self.profile) else self.profile

    def load(self, spec: ModelSpec, model_dir: Path | None) -> Head:
        """The head for ``spec`` from the files in ``model_dir`` (``None`` for an endpoint): the one of
        :attr:`other_loaders` for the input kind ``spec`` reads and whether its settings are remote, else
        :attr:`loader`; loader errors propagate."""
        options = self.options_of(spec)
        key = (self.input_kind_of(spec).name, bool(options is not None and options.remote))
        loader = self.other_loaders.get(key, self.loader)
        return (named(loader) if isinstance(loader, str) else loader)(spec, model_dir)

    def lines_for(self, spec: ModelSpec) -> BatchLines:
        """The run's :class:`~lakescore.udfs.remote.batch_lines.BatchLines` (:attr:`batch_lines`)."""
        if self.batch_lines is None:
            raise ValueError(f"task {self.name} has no provider batch lines")
        return named(self.batch_lines)(spec, self.output_arrow_types_for(self.options_of(spec)))

    def options_of(self, holder: Any) -> Any:
        """The task's own settings section of ``holder`` (the job's config or a worker's :class:`ModelSpec`, which both
        carry it by :attr:`options_section`'s name); ``None`` for a task without one."""
        return getattr(holder, self.options_section, None) if self.options_section else None

    def asked_outputs(self, options: Any = None) -> tuple[str, ...]:
        """The optional output columns (:attr:`setting_outputs`) the task's settings ``options`` ask for."""
        return tuple(
            column
            for column, setting in self.setting_outputs.items()
            if options is not None and getattr(options, setting, False)
        )

    def chunked(self, options: Any = None) -> bool:
        """Whether a run with the task's settings ``options`` makes several output rows of one input row
        (:attr:`expands`)."""
        return bool(self.expands and options is not None and getattr(options, self.expands))

    def output_fields_for(self, options: Any = None) -> list[StructField]:
        """The prediction columns a run with the task's settings ``options`` writes, in output order
        (:mod:`lakescore.schemas.output`): the task's own, then those its settings ask for."""
        from lakescore.schemas.output import prediction_fields

        return prediction_fields(self.name, self.asked_outputs(options))

    def output_arrow_types_for(self, options: Any = None) -> list[pa.DataType]:
        """The Arrow types of :meth:`staged_fields_for`, as the scoring function's batches carry them."""
        from pyspark.sql.pandas.types import to_arrow_type

        return [to_arrow_type(field.dataType) for field in self.staged_fields_for(options)]

    def staged_fields_for(self, options: Any = None) -> list[StructField]:
        """The prediction columns as the scoring function returns them (one row per input row): those of
        :meth:`output_fields_for`, or for a run that makes many rows of one (:meth:`chunked`) the one list of them
        (:func:`lakescore.schemas.output.staged_prediction_fields`)."""
        from lakescore.schemas.output import staged_prediction_fields

        return staged_prediction_fields(self.name, self.asked_outputs(options), self.chunked(options))

    @property
    def output_fields(self) -> list[StructField]:
        """The prediction columns this task writes when its settings ask for no optional one."""
        return self.output_fields_for(None)

    @property
    def output_arrow_types(self) -> list[pa.DataType]:
        """The Arrow types of :attr:`output_fields`."""
        return self.output_arrow_types_for(None)


_LABELLED = OutputProfile(label="label", score="score")
_EMBEDDED = OutputProfile(embedding="embedding")

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            "classify",
            TEXT,
            "lakescore.udfs.heads.classify:load_classifier",
            "sequence classification: label, score, probs",
            profile=_LABELLED,
            architectures=("ForSequenceClassification",),
            pairs=True,
        ),
        Task(
            "embed",
            TEXT,
            "lakescore.udfs.heads.embed:load_embedder",
            "sentence embeddings, as sentence-transformers",
            model_options=("pooling", "normalize", "prompt_name"),
            profile=_EMBEDDED,
            options_section="embed",
            expands="chunked",
            other_loaders={("text", True): "lakescore.udfs.remote.embed:load_remote_embedder"},
            model_check="lakescore.udfs.options.embed:check_chunk_limit",
            batch_lines="lakescore.udfs.remote.embed:embed_lines",
        ),
        Task(
            "ner",
            TEXT,
            "lakescore.udfs.heads.ner:load_token_classifier",
            "token classification: entities per text",
            architectures=("ForTokenClassification",),
        ),
        Task(
            "image_classify",
            IMAGE,
            "lakescore.udfs.heads.image_classify:load_image_classifier",
            "image classification: label, score, probs",
            backends=("torch",),
            profile=_LABELLED,
            architectures=("ForImageClassification",),
        ),
        Task(
            "image_embed",
            IMAGE,
            "lakescore.udfs.heads.image_embed:load_image_embedder",
            "image embeddings: CLIP-style image tower, else the pooled output",
            backends=("torch",),
            profile=_EMBEDDED,
        ),
        Task(
            "tabular",
            FEATURES,
            "lakescore.udfs.heads.tabular:load_tabular",
            "a TorchScript / torch.export program",
            backends=("torch",),
            forward_imports=("torch",),
            profile=OutputProfile(score="prediction"),
        ),
        Task(
            "generate",
            PROMPT,
            "lakescore.udfs.heads.generate:load_generator",
            "a language model over each prompt (with ``image_col``, a vision-language model over each image and "
            "prompt): text, a choice, or JSON",
            other_inputs=(IMAGE_PROMPT,),
            backends=("torch",),
            options_section="generate",
            optional_outputs=("choice_logprobs",),
            setting_outputs={"token_logprobs": "logprobs"},
            output_value_sets={"finish_reason": FINISH_REASONS},
            validation_options={"max_length_stops": ("finish_reason", "length")},
            profile=_generated_profile,
            # causal or encoder-decoder language models: the class names of transformers' AutoModelForCausalLM and
            # AutoModelForSeq2SeqLM (tests/unit/test_heads.py checks them against transformers' own mappings)
            architectures=(
                "CausalLM",
                "LMHead",
                "ConditionalGeneration",
                "MTModel",
                "EncoderDecoder",
                "GenerationDecoder",
                "TextToText",
            ),
            model_check="lakescore.udfs.options.generate:check_context",
            other_loaders={
                ("image", False): "lakescore.udfs.heads.image_prompts:load_image_prompt_generator",
                ("text", True): "lakescore.udfs.remote.generate:load_remote_generator",
                ("image", True): "lakescore.udfs.remote.image_prompts:load_remote_image_generator",
            },
            batch_lines="lakescore.udfs.remote.generate:generate_lines",
        ),
        Task(
            "transcribe",
            AUDIO,
            "lakescore.udfs.heads.transcribe:load_transcriber",
            "speech to text (Whisper or a CTC model such as wav2vec2): text, duration_s, sample_rate, segments",
            backends=("torch",),
            options_section="transcribe",
            setting_outputs={"segments": "return_timestamps"},
            profile=OutputProfile(text="text"),
            architectures=("WhisperForConditionalGeneration", "ForCTC"),
            other_loaders={("audio", True): "lakescore.udfs.remote.transcribe:load_remote_transcriber"},
        ),
    )
}
"""Task name -> :class:`Task`: the only place a task name means anything."""

TASK_NAMES: tuple[str, ...] = tuple(name for name, task in TASKS.items() if task.in_job)
"""The tasks the scoring job runs: config validation's and the CLI's choices."""

TASK_MODEL_OPTIONS: tuple[str, ...] = tuple(dict.fromkeys(o for task in TASKS.values() for o in task.model_options))
"""Every task-specific ``model.*`` setting: one a task does not list is a mistake for that task."""

TASK_VALIDATION_OPTIONS: tuple[str, ...] = tuple(
    dict.fromkeys(o for task in TASKS.values() for o in task.validation_options)
)
"""Every task-specific ``validation.*`` setting."""

TASK_OPTION_SECTIONS: tuple[str, ...] = tuple(task.options_section for task in TASKS.values() if task.options_section)
"""Every task's own config section (``generate``): setting one for another task is a mistake."""


def get_task(name: str) -> Task:
    """The registered task ``name``; ``ValueError`` naming the known tasks otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}") from None


def named_columns(task: str, arrays: Sequence[pa.Array], options: Any = None) -> Mapping[str, pa.Array]:
    """A head's output arrays keyed by the output column names of the task with its settings ``options``
    (``ValueError`` on a count mismatch)."""
    names = [f.name for f in get_task(task).output_fields_for(options)]
    if len(arrays) != len(names):
        raise ValueError(f"the {task} head returned {len(arrays)} columns for the {len(names)} outputs {names}")
    return dict(zip(names, arrays))
