"""What the steps share: the run's context (:class:`RunContext`), its checked targets (:class:`Targets`), where its
scoring stage runs (:class:`ScoringLayout`, its first Python worker started ahead: :class:`PythonWorkerStart`), who
scores (:class:`ModelIdentity`) and how (:class:`Plan`: the id check's :class:`IdSplit`, an incremental run's
:class:`Changes` under its :class:`ScoringSpec`).

In a module of their own, below every step, so that steps import one another in one direction only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.resource import ResourceProfile
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from lakescore.jobs.config import JobConfig
from lakescore.jobs.platform.spark.adapter import cancel_tagged, job_tag
from lakescore.jobs.platform.spark.profiles import scoring_profile
from lakescore.jobs.steps.dead_letter import CARRIED, IdCheck
from lakescore.jobs.steps.dedup import Dedup
from lakescore.jobs.steps.staging import Staging, input_fingerprint
from lakescore.schemas.contracts import FILE_COLUMN, IMAGE_COLUMN
from lakescore.schemas.output import DIGEST_COLUMN, OUTPUT_VERSION
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.scoring_udf import RowCounter, start_worker

__all__ = [
    "ScoringLayout",
    "scoring_layout",
    "PythonWorkerStart",
    "RunContext",
    "Targets",
    "ModelIdentity",
    "IdSplit",
    "ScoringSpec",
    "Changes",
    "Plan",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoringLayout:
    """Where the scoring stage runs: its resource profile (``None``: the default) and task count (``None``: as read)."""

    profile: ResourceProfile | None
    partitions: int | None


def scoring_layout(spark: SparkSession, cfg: JobConfig) -> ScoringLayout:
    """The scoring stage's layout for ``cfg`` on this session (:mod:`lakescore.jobs.platform.spark.profiles` decides the
    profile, once)."""
    profile = scoring_profile(spark, cfg.resources.scoring) if cfg.resources.scoring.requested else None
    partitions = (cfg.resources.scoring.partitions if profile is not None else None) or cfg.scoring.partitions
    return ScoringLayout(profile, partitions)


class PythonWorkerStart:
    """One executor Python worker starting in a background Spark job, under the scoring stage's profile.

    Its executor's daemon imports the model runtime then (:mod:`lakescore.jobs.platform.spark.local.python_daemon`),
    while the driver reads the input. The preflight waits for it (:meth:`wait`) before its own tasks take every slot:
    they then load only the weights, instead of holding the slots the driver's id check needs while the daemon starts.
    One task: more would hold slots the read may need. A failure here is ignored; the preflight reports worker
    failures.
    """

    def __init__(self, spark: SparkSession, layout: ScoringLayout) -> None:
        self._spark = spark
        self._tag = f"lakescore-worker-start-{uuid.uuid4().hex[:12]}"
        self._thread = threading.Thread(target=self._run, args=(layout,), name="lakescore-worker-start", daemon=True)
        self._thread.start()

    def _run(self, layout: ScoringLayout) -> None:
        try:
            with job_tag(self._spark, self._tag):
                self._spark.range(1, numPartitions=1).mapInArrow(
                    start_worker, "id long", profile=layout.profile
                ).collect()
        except Exception as error:  # noqa: BLE001 (the preflight reports worker failures)
            log.debug("starting a Python worker ahead of the preflight failed: %s", error)

    def wait(self) -> None:
        """Return once the worker started (or its job failed or was cancelled)."""
        self._thread.join()

    def cancel(self) -> None:
        """Cancel the job if it still runs (the run failed before the preflight took over)."""
        if self._thread.is_alive():
            cancel_tagged(self._spark, self._tag)


@dataclass(frozen=True)
class RunContext:
    """What every later step needs: the config, the session, the checked input and how it is scored."""

    cfg: JobConfig
    spark: SparkSession
    source: DataFrame
    input_cols: tuple[str, ...]
    """The model's input columns: the text column (or the rendered prompt), or the feature columns in the program's
    order."""
    spec: ModelSpec
    layout: ScoringLayout
    rows_counter: RowCounter | None
    """Rows the workers scored so far, live (classic sessions; ``None`` over Spark Connect)."""
    model_dir: Path | None
    """The model's files on the driver's host (the HTML report reads the tokenizer there); ``None`` for a model served
    elsewhere (``generate.endpoint``)."""
    input_version: int | None = None
    """The Delta version of the input this run reads from start to end (``None``: not Delta; a Parquet input is
    pinned to the file listing taken at the start)."""
    worker_start: PythonWorkerStart | None = None
    """The executor Python worker started while the input was read; the preflight waits for it."""
    started: float = dataclasses.field(default_factory=time.time)
    """When the run started (seconds since the epoch): staging another run committed later is not this run's to
    remove."""
    ignored_files: int | None = None
    """``input_format`` ``images``: the files under the input folder that are not images (by extension), not read."""
    input_pinned: bool = False
    """The input is a Delta version or a Parquet path's file listing: reading it again gives the same rows."""

    @property
    def reads_paths(self) -> bool:
        """The model's input is the files an image column of paths names (:func:`read_image_files`)."""
        return self.input_cols[0] == IMAGE_COLUMN

    @property
    def rescannable(self) -> bool:
        """Reading the model's input again costs one scan of pinned files: no file an image column of paths names is
        read (:attr:`reads_paths`)."""
        return self.input_pinned and not self.reads_paths

    @property
    def id_fields(self) -> list[StructField]:
        """The id column(s) as the input has them."""
        return [self.source.schema[name] for name in self.cfg.id_cols]

    @property
    def row_fields(self) -> list[StructField]:
        """The input columns every output row copies (:attr:`~lakescore.jobs.config.JobConfig.row_cols`), as the input
        has them."""
        return [self.source.schema[name] for name in self.cfg.row_cols]

    @functools.cached_property
    def input_files_digest(self) -> str:
        """A digest of the files the pinned input reads (:func:`~lakescore.jobs.steps.staging.input_fingerprint`),
        listed once per run: the early comparison's key and the plan's both name it."""
        return input_fingerprint(self.source, file_stats=self.cfg.reads_folder)


@dataclass(frozen=True)
class Targets:
    """The output and errors tables this run will write, checked before compute."""

    output_schema: StructType
    errors_schema: StructType
    errors_ref: str
    previous_version: int | None
    """The output's Delta version before this run (``None``: it does not exist yet)."""
    replaces_layout: bool = False
    """The output holds the other write layout (with or without the incremental digest columns, or the file status
    columns) and this run's overwrite replaces its columns too."""
    file_status: bool = False
    """The output rows this run writes store each file's path, length and modification time
    (:data:`~lakescore.schemas.output.FILE_COLUMNS`): an incremental run over an image column of paths, without
    ``rank``, into an output that has those columns or does not exist yet (or that a full rescore rewrites)."""
    errors_layout_replaced: bool = False
    """The errors table holds the other write layout (with or without the incremental carry columns,
    :data:`~lakescore.schemas.output.CARRY_COLUMNS`) and this run's overwrite of it replaces its columns too."""
    errors_carried: bool = False
    """Incremental mode on an existing output whose errors table has the carry columns: its dead letters of the row's
    own fault are carried, not scored again, while their input, weights and spec are unchanged."""


@dataclass(frozen=True)
class ModelIdentity:
    """Who scored: written into every row and into the report."""

    model_id: str
    revision: str | None
    sha256: str
    preflight_loads: int = 0
    """Python workers that loaded the model during the preflight (the run report's ``workers.model_loads`` adds the
    scoring stage's)."""
    precision_check: dict | None = None
    """A reduced-precision run's check against float32 (``path``, ``sample_rows`` and the head's figures, e.g.
    ``cosine_p1``), which it passed; ``None`` when nothing lossy ran or the task reads no text."""
    model_files: dict = field(default_factory=dict)
    """The digests of the model's files besides its weights as the executors loaded them
    (:func:`~lakescore.udfs.models.model_source.model_file_digests`): part of the scoring spec incremental runs
    compare."""
    gpus: int = 0
    """GPUs the preflight's workers loaded the model on (distinct host and CUDA device; 0: it runs on CPUs)."""
    traffic: dict = field(default_factory=dict)
    """What a head over an endpoint sent for the preflight, summed over its tasks (requests, retries, 429s, answers
    without usage, tokens): part of the run's figures and cost. Empty for the others."""
    row_seconds: float | None = None
    """The slowest worker's model seconds per row on a batch of the preflight sample (``None``: not timed, see
    :attr:`~lakescore.udfs.registry.InputKind.timed_rows`)."""
    probe_deferred: bool = False
    """A head over an endpoint sent no request yet: :meth:`~lakescore.jobs.steps.served_model.ServedModel.probe`
    sends the sample once the plan has rows to score."""


@dataclass(frozen=True)
class IdSplit:
    """The id check's counts, the rows that can be scored and the rows refused for their id."""

    ids: IdCheck
    scorable: DataFrame
    refused: DataFrame


@dataclass(frozen=True)
class ScoringSpec:
    """Everything besides the input and the weights that a prediction depends on, in three parts: ``settings`` (the
    configured ones that change numbers, :meth:`~lakescore.udfs.models.model_source.ModelSpec.scoring_settings`),
    ``files`` (the digests of the model's other files, configs and tokenizer included, as the workers loaded them; for a
    model served elsewhere, what the endpoint's ``/v1/models`` said of it) and
    ``output_version`` (:data:`~lakescore.schemas.output.OUTPUT_VERSION`). What a worker resolves from these (its
    ``max_seq_length``, pooling, normalisation, prompt, label map) follows from them, so editing any file the model
    reads changes the digest."""

    parts: dict

    @classmethod
    def of(cls, spec: ModelSpec, model_files: dict) -> ScoringSpec:
        parts = {"settings": spec.scoring_settings(), "files": dict(model_files), "output_version": OUTPUT_VERSION}
        return cls(
            json.loads(json.dumps(parts, default=str))
        )  # as a commit's metadata gives it back: lists, not tuples

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of :attr:`parts`: the ``spec_digest`` of every row scored with this spec."""
        return hashlib.sha256(json.dumps(self.parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()

    def changes_since(self, previous: dict | None) -> list[str] | None:
        """What differs from ``previous`` (the parts an earlier run recorded), one phrase each, e.g.
        ``max_seq_length 256 -> 8`` or ``file sentence_bert_config.json changed``; ``None`` when nothing does."""
        if previous == self.parts:
            return None
        if not isinstance(previous, dict):
            return ["the output's scoring spec was not recorded (written by an earlier lakescore)"]
        changes = []
        before, after = previous.get("settings") or {}, self.parts["settings"]
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                changes.append(f"{key} {_shown(before.get(key))} -> {_shown(after.get(key))}")
        before, after = previous.get("files") or {}, self.parts["files"]
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                what = "added" if name not in before else "removed" if name not in after else "changed"
                # a model served elsewhere has no files: what stands for them is the endpoint's answer (/v1/models)
                changes.append(f"{'the endpoint' if name.startswith('/') else 'file'} {name} {what}")
        if previous.get("output_version") != self.parts["output_version"]:
            changes.append(
                f"lakescore output version {previous.get('output_version')} -> {self.parts['output_version']}"
            )
        return changes or ["the scoring spec's layout"]


def _shown(value) -> str:
    return json.dumps(value)


@dataclass(frozen=True)
class Changes:
    """What an incremental run scores, keeps, carries and finds missing. ``rows_to_score`` + ``rows_kept`` +
    ``rows_carried`` = the scorable rows."""

    to_score: DataFrame
    """The scorable rows (input columns and :data:`DIGEST_COLUMN`) that need the model this run."""
    rows_to_score: int
    rows_kept: int
    """Scorable rows whose output row is current: same digest, weights and spec. Not scored, not rewritten."""
    rows_missing: int
    """Output rows whose id is not in the input at all."""
    missing_ids: DataFrame
    """Those ids, in one column named as the id column."""
    distinct_to_score: int | None
    """Distinct inputs among the rows to score, estimated (``approx_count_distinct``, a null input counting as
    one) in the job that counts them; ``None`` when there is no output yet and nothing was counted."""
    spec: ScoringSpec
    """What this run scores with besides the weights; its digest is every scored row's ``spec_digest``."""
    spec_changes: list[str] | None
    """What differs from the scoring spec the output's last run recorded (:meth:`ScoringSpec.changes_since`): every
    row of the output is scored again. ``None`` when nothing differs, or there is no output yet."""
    model_sha256: str
    """The weights an output row must carry to be current (it is scored again otherwise)."""
    previous_version: int | None
    """The output version compared with (``None``: no output yet, every row is new)."""
    table: Staging | None = None
    """Where ``to_score`` and ``missing_ids`` were written once (``None`` when there is no output yet and ``to_score``
    is the input)."""
    rows_carried: int = 0
    """Scorable rows dead-lettered by an earlier run for a reason of their own, with the same digest, weights and
    spec: not scored, their dead letter carried to this run's errors table (:meth:`carried`)."""
    carried_reasons: dict[str, int] = field(default_factory=dict)
    """Reason -> carried rows."""

    def carried(self) -> DataFrame | None:
        """The carried rows (the input's columns, :data:`DIGEST_COLUMN` and
        :data:`~lakescore.jobs.steps.dead_letter.CARRIED`); ``None`` when none."""
        if not self.rows_carried or self.table is None:
            return None
        return self.table.table().where(F.col(CARRIED).isNotNull())


@dataclass(frozen=True)
class Plan:
    """How this run scores: its id, the model pinned to the weights the executors hashed, the chunks."""

    run_id: str
    identity: ModelIdentity
    spec: ModelSpec
    """The model spec pinned to ``identity.sha256``: a worker with other weights fails its task."""
    split: IdSplit
    chunks: int
    staging: Staging
    done: frozenset[int]
    """Chunks an earlier attempt of the same run already committed to staging."""
    changes: Changes | None = None
    """``write.mode: incremental``: the rows to score, kept and missing (``None`` in the other modes: score every
    row)."""
    dedup: Dedup = Dedup("off", False)
    """What ``scoring.dedup`` decided: whether identical inputs are scored once per chunk."""
    digested: DataFrame | None = None
    """The scorable rows with their digest, when deduplicating outside incremental mode."""
    prepared: Staging | None = None
    """More than one chunk: where the rows to score are written once, partitioned by chunk, so the input is
    scanned once rather than once per chunk (:meth:`~lakescore.jobs.steps.staging.Staging.write_chunked`)."""
    rescanned: bool = False
    """More than one chunk without :attr:`prepared`: each chunk reads its rows from the pinned input
    (:func:`~lakescore.jobs.steps.staging.chunk_column` of :func:`~lakescore.jobs.steps.rank.chunk_columns`)."""
    prepared_ready: bool = False
    """Whether an earlier attempt of the same run already wrote :attr:`prepared`."""
    file_status: bool = False
    """The output rows store each file's path, length and modification time (:attr:`Targets.file_status`): the rows
    to score carry :data:`~lakescore.schemas.contracts.FILE_COLUMN` into staging."""
    ranked: bool = False
    """``rank``: the chunks are cut by the rank key and only each key's kept rows are staged
    (:func:`~lakescore.jobs.steps.rank.keep_top`)."""
    tag: str | None = None
    """The ``userMetadata`` of every commit this run makes (staging chunks, output, errors table):
    :func:`~lakescore.jobs.platform.tables.run_metadata` of the run id and the report's path."""

    @property
    def input_scans(self) -> int:
        """Reads of the rows to score by the scoring step: one per chunk left for a one-chunk or :attr:`rescanned`
        run, else one (writing :attr:`prepared`), or none when there is nothing left to score or an earlier attempt
        wrote it."""
        left = self.chunks - len(self.done)
        if left == 0 or self.prepared_ready:
            return 0
        return left if self.prepared is None else 1

    def incremental_changes(self) -> Changes:
        """:attr:`changes`, for the steps only an incremental run reaches; ``ValueError`` in the other modes."""
        if self.changes is None:
            raise ValueError(f"run {self.run_id}: only write.mode incremental has changes to apply")
        return self.changes

    @property
    def changed(self) -> Staging | None:
        """Incremental mode on an existing output: the table the rows to score and the missing ids were written to
        once (:func:`~lakescore.jobs.steps.staging.changed_rows`), dropped with staging after the publish."""
        return self.changes.table if self.changes is not None else None

    @property
    def scorable(self) -> DataFrame:
        """The rows this run scores: every scorable row, or in incremental mode the new and changed ones
        (with their digest; with their digest too when deduplicating)."""
        if self.changes is not None:
            return self.changes.to_score
        return self.digested if self.digested is not None else self.split.scorable

    @property
    def scorable_rows(self) -> int:
        return (
            self.changes.rows_to_score
            if self.changes is not None
            else self.split.ids.rows - self.split.ids.refused_rows
        )

    @property
    def rows_kept(self) -> int:
        """Scorable rows whose output row is current and stays as it is (incremental mode; else 0)."""
        return self.changes.rows_kept if self.changes is not None else 0

    @property
    def rows_carried(self) -> int:
        """Scorable rows whose dead letter is carried from an earlier run, not scored (incremental mode; else 0)."""
        return self.changes.rows_carried if self.changes is not None else 0

    def kept_columns(self, row_cols: Sequence[str]) -> list[str]:
        """The input columns the scoring function copies into staging: :meth:`row_columns`, and the digest in
        incremental mode or when deduplicating."""
        digest = [DIGEST_COLUMN] if self.changes is not None or self.dedup.used else []
        return [*self.row_columns(row_cols), *digest]

    def row_columns(self, row_cols: Sequence[str]) -> list[str]:
        """The input columns each output row takes from its own input row: ``row_cols`` (the id column(s), a ranked
        run's key columns), and with :attr:`file_status` :data:`~lakescore.schemas.contracts.FILE_COLUMN`."""
        return [*row_cols, *([FILE_COLUMN] if self.file_status else [])]
