"""What the steps share: the run's context (:class:`RunContext`), its checked targets (:class:`Targets`) and where its
scoring stage runs (:class:`ScoringLayout`, its first Python worker started ahead: :class:`PythonWorkerStart`).

In a module of their own, below every step, so that steps import one another in one direction only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pyspark.resource import ResourceProfile
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType

from lakescore.jobs.config import JobConfig
from lakescore.jobs.platform.profiles import scoring_profile
from lakescore.jobs.platform.spark_adapter import cancel_tagged, job_tag
from lakescore.jobs.steps.staging import input_fingerprint
from lakescore.schemas.contracts import IMAGE_COLUMN
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.scoring_udf import RowCounter, start_worker

__all__ = ["ScoringLayout", "scoring_layout", "PythonWorkerStart", "RunContext", "Targets"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoringLayout:
    """Where the scoring stage runs: its resource profile (``None``: the default) and task count (``None``: as read)."""

    profile: Optional[ResourceProfile]
    partitions: Optional[int]


def scoring_layout(spark: SparkSession, cfg: JobConfig) -> ScoringLayout:
    """The scoring stage's layout for ``cfg`` on this session (:mod:`lakescore.jobs.platform.profiles` decides the profile, once)."""
    profile = scoring_profile(spark, cfg.resources.scoring) if cfg.resources.scoring.requested else None
    partitions = (cfg.resources.scoring.partitions if profile is not None else None) or cfg.scoring.partitions
    return ScoringLayout(profile, partitions)


class PythonWorkerStart:
    """One executor Python worker starting in a background Spark job, under the scoring stage's profile.

    Its executor's daemon imports the model runtime then (:mod:`lakescore.jobs.platform.local.python_daemon`), while the
    driver reads the input. The preflight waits for it (:meth:`wait`) before its own tasks take every slot: they
    then load only the weights, instead of holding the slots the driver's id check needs while the daemon starts.
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
                self._spark.range(1, numPartitions=1).mapInArrow(start_worker, "id long", profile=layout.profile).collect()
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
    """The model's input columns: the text column (or the rendered prompt), or the feature columns in the program's order."""
    spec: ModelSpec
    layout: ScoringLayout
    rows_counter: Optional[RowCounter]
    """Rows the workers scored so far, live (classic sessions; ``None`` over Spark Connect)."""
    model_dir: Optional[Path]
    """The model's files on the driver's host (the HTML report reads the tokenizer there); ``None`` for a model served
    elsewhere (``generate.endpoint``)."""
    input_version: Optional[int] = None
    """The Delta version of the input this run reads from start to end (``None``: not Delta; a Parquet input is
    pinned to the file listing taken at the start)."""
    worker_start: Optional[PythonWorkerStart] = None
    """The executor Python worker started while the input was read; the preflight waits for it."""
    started: float = dataclasses.field(default_factory=time.time)
    """When the run started (seconds since the epoch): staging another run committed later is not this run's to remove."""
    ignored_files: Optional[int] = None
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
        return input_fingerprint(self.source, file_stats=self.cfg.input_format == "images")


@dataclass(frozen=True)
class Targets:
    """The output and errors tables this run will write, checked before compute."""

    output_schema: StructType
    errors_schema: StructType
    errors_ref: str
    previous_version: Optional[int]
    """The output's Delta version before this run (``None``: it does not exist yet)."""
    replaces_layout: bool = False
    """The output holds the other write layout (with or without the incremental digest columns, or the file status
    columns) and this run's overwrite replaces its columns too."""
    file_status: bool = False
    """The output rows this run writes store each file's path, length and modification time
    (:data:`~lakescore.schemas.output.FILE_COLUMNS`): an incremental run over an image column of paths, without
    ``rank``, into an output that has those columns or does not exist yet (or that a full rescore rewrites)."""
