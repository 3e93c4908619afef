"""Step 3a, preflight: the executors' Python workers load the model and score a sample before any row.

One small ``mapInArrow`` task per scoring slot, under the scoring stage's resource
profile, loads the model where it will score, hashes its weights and scores one sample
(:func:`lakescore.udfs.scoring_udf.make_preflight_function`). A reduced-precision model (int8, bfloat16,
float16) is also checked against float32 on a sample of the run's own input (:data:`SAMPLE_ROWS` rows): outside
``model.quantize_*`` tolerance, the run fails here, before any row is scored. It runs in a background
job while the driver checks targets and ids (:class:`ExecutorPreflight`); the workers that
score next find the model in their cache. The driver itself never imports torch. A head over an endpoint only reads
its ``/v1/models`` here when its paid sample request waits for a plan with rows to send
(:meth:`~lakescore.jobs.steps.served_model.ServedModel.probe`).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakescore.jobs.platform.spark.adapter import cancel_tagged, default_parallelism, job_tag
from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.context import ModelIdentity, RunContext, ScoringLayout
from lakescore.schemas.traffic import Traffic
from lakescore.udfs.models.model_fit import check_model_fits
from lakescore.udfs.models.model_source import ModelIntegrityError, ModelSourceError, ModelSpec, UnfitModelError
from lakescore.udfs.models.quantize import QuantizationToleranceError, Tolerance
from lakescore.udfs.registry import get_task
from lakescore.udfs.remote.answers import EndpointRefused
from lakescore.udfs.remote.engine import EngineStartError
from lakescore.udfs.scoring_udf import PREFLIGHT_SCHEMA, make_preflight_function

__all__ = [
    "preflight_model",
    "ExecutorPreflight",
    "precision_check_sample",
    "SAMPLE_ROWS",
    "raise_worker_failure",
    "remote_options",
    "summed_traffic",
]

log = logging.getLogger(__name__)

SAMPLE_ROWS = 256
"""Input texts a reduced-precision run scores both ways (float32 and its own path) before it starts."""

_OWN_LINE = {
    cls.__name__: cls
    for cls in (ModelIntegrityError, QuantizationToleranceError, UnfitModelError, EndpointRefused, EngineStartError)
}
"""Worker errors whose message is the operator's whole line: raised on the driver as they are."""


def preflight_model(
    spark: SparkSession,
    spec: ModelSpec,
    layout: ScoringLayout,
    tag: str | None = None,
    sample: Sequence[str] = (),
    tolerance: Tolerance | None = None,
    probe: bool = True,
) -> ModelIdentity:
    """Load the model where it will score, in the executors' Python workers, and score one sample there.

    Runs one small task per scoring slot (``layout.partitions``, else the cluster's
    parallelism) under the scoring stage's resource profile, before any input row
    is scored: a model that cannot load fails the run here, and the workers that
    score next find it in their cache. Its Spark job carries ``tag``
    (:func:`~lakescore.jobs.platform.spark.adapter.job_tag`), so another thread can cancel it
    (:func:`~lakescore.jobs.platform.spark.adapter.cancel_tagged`), in classic and Connect sessions alike.

    With a reduced-precision ``spec`` (``spec.reduced_precision``) and a ``sample`` of input texts, one task also
    compares its outputs with float32's on the sample (for int8 the float32 graph, checked against torch at export);
    outside ``tolerance`` it raises :class:`~lakescore.udfs.models.quantize.QuantizationToleranceError`
    naming the figures. ``probe`` false: a head over an endpoint sends no request here (its identity is what its
    ``/v1/models`` says) and the identity says :attr:`ModelIdentity.probe_deferred`.

    Raises :class:`~lakescore.udfs.models.model_source.ModelIntegrityError` when a worker's weights
    differ from ``spec.expect_sha256`` or two workers hashed different weights, and
    :class:`~lakescore.udfs.models.model_source.ModelSourceError` naming the host when a worker could
    not load the model or score the sample. Returns the identity every worker agreed on.
    """
    tasks = layout.partitions or default_parallelism(spark)
    probe = make_preflight_function(spec, sample, tolerance, probe)
    with job_tag(spark, tag) if tag else nullcontext():  # this thread's job below, nothing the caller's thread runs
        rows = (
            spark.range(tasks, numPartitions=tasks)
            .mapInArrow(probe, PREFLIGHT_SCHEMA, profile=layout.profile)
            .collect()
        )
    raise_worker_failure(spec, rows)
    digests = sorted({r.sha256 for r in rows})
    if len(digests) != 1:
        hosts = ", ".join(sorted({f"{r.host}: {r.sha256}" for r in rows}))
        raise ModelIntegrityError(
            f"executors found different weights for model {spec.source!r} ({hosts}); refusing to score"
        )
    if len({r.files for r in rows}) != 1:
        hosts = ", ".join(sorted({r.host for r in rows}))
        raise ModelIntegrityError(
            f"executors found different model files (configs, tokenizer) for model {spec.source!r} on {hosts}; "
            "refusing to score"
        )
    loads = sorted(r.seconds for r in rows)
    timed = [r.row_seconds for r in rows if r.row_seconds is not None]
    log.info(
        "model ready in %d executor task(s) on %s (slowest %.1f s%s; weights sha256 %s)",
        len(rows),
        ", ".join(sorted({r.device for r in rows})),
        loads[-1],
        f", {max(timed) * 1e6:.1f} us a row on a batch of its sample" if timed else "",
        digests[0],
    )
    checked = next((r for r in rows if r.fidelity), None)
    if checked is not None:
        log.info(
            "%s model within tolerance of float32 on %d sampled rows: %s",
            spec.reduced_precision,
            len(sample),
            checked.fidelity,
        )
    return ModelIdentity(
        model_id=spec.source
        if spec.source is not None
        else remote_options(spec, "endpoint").model,  # an endpoint's: its name
        revision=rows[0].revision,
        sha256=digests[0],
        preflight_loads=sum(bool(r.loaded) for r in rows),
        model_files=json.loads(rows[0].files),
        gpus=len({(r.host, r.device) for r in rows if (r.device or "").startswith("cuda")}),
        row_seconds=None if any(r.row_seconds is None for r in rows) else max(r.row_seconds for r in rows),
        traffic=summed_traffic(r.traffic for r in rows),
        probe_deferred=not all(r.probed for r in rows),
        precision_check=None
        if checked is None
        else {"path": spec.reduced_precision, "sample_rows": len(sample), **json.loads(checked.fidelity)},
    )


def summed_traffic(traffics) -> dict:
    """The preflight tasks' ``traffic`` (JSON texts of :class:`~lakescore.schemas.traffic.Traffic`) summed; empty when
    no request was sent."""
    total = sum((Traffic.of(json.loads(text or "{}")) for text in traffics), Traffic())
    return total.as_dict() if total.requests else {}


def remote_options(spec: ModelSpec, name: str) -> Any:
    """The task's ``endpoint`` or ``server`` section (``generate.server``, ``embed.server``), or ``None``."""
    return getattr(get_task(spec.task).options_of(spec), name, None)


def raise_worker_failure(spec: ModelSpec, rows: Sequence) -> None:
    """Raise the first failure among the preflight's ``rows`` (:data:`~lakescore.udfs.scoring_udf.PREFLIGHT_SCHEMA`):
    an integrity, tolerance or unfit-model error as the worker worded it, any other as
    :class:`~lakescore.udfs.models.model_source.ModelSourceError` naming the executor. All before compute: exit 2."""
    failed = [r for r in rows if r.error_type]
    if not failed:
        return
    r = failed[0]
    if r.error_type in _OWN_LINE:
        raise _OWN_LINE[r.error_type](r.error)
    raise ModelSourceError(
        f"model {spec.source!r} failed to load or score a sample on executor {r.host} (pid {r.pid}): "
        f"{r.error_type}: {r.error}"
    )


class ExecutorPreflight:
    """Context manager: :func:`preflight_model` runs in a background Spark job while the block runs.

    On entering, the driver checks its own copy of the model against the task first
    (:func:`~lakescore.udfs.models.model_fit.check_model_fits`: the architecture, and settings such as ``generate``'s
    ``max_new_tokens`` against the model's context): :class:`~lakescore.udfs.models.model_source.UnfitModelError` before
    any executor job. The preflight first waits for the Python worker :func:`~lakescore.jobs.steps.read.open_input`
    started (:class:`PythonWorkerStart`). If the block raises, the preflight (and that worker's job) is cancelled
    before the error propagates. :meth:`identity` waits for the preflight and returns (or raises) its outcome.
    ``probe`` false: a head over an endpoint sends no request (:func:`preflight_model`'s ``probe``).
    """

    def __init__(self, run: RunContext, probe: bool = False) -> None:
        self._run = run
        self._probe = probe
        self._tag = f"lakescore-preflight-{uuid.uuid4().hex[:12]}"
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._cancelled = threading.Event()

    def __enter__(self) -> ExecutorPreflight:
        try:  # the driver's copy of the model first: a model that cannot fit the task starts no executor job
            if self._run.model_dir is not None:  # None: a model served elsewhere, checked by the executors' request
                check_model_fits(self._run.spec, self._run.model_dir)
        except BaseException:
            if self._run.worker_start is not None:
                self._run.worker_start.cancel()
            raise
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakescore-preflight")
        self._future = self._pool.submit(self._preflight)
        return self

    def _started(self) -> tuple[ThreadPoolExecutor, Future]:
        """The pool and the preflight's future that ``__enter__`` made; ``RuntimeError`` outside the ``with`` block."""
        if self._pool is None or self._future is None:
            raise RuntimeError("ExecutorPreflight is used outside its with block")
        return self._pool, self._future

    def _preflight(self) -> ModelIdentity:
        run = self._run
        sample = precision_check_sample(run.source, run.spec, run.input_cols)
        if run.worker_start is not None:
            run.worker_start.wait()
        if self._cancelled.is_set():  # the block failed meanwhile: start no job (its error is what propagates)
            raise RuntimeError("preflight cancelled")
        return preflight_model(
            run.spark, run.spec, run.layout, self._tag, sample, run.cfg.model.tolerance(), self._probe
        )

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._cancelled.set()
            if self._run.worker_start is not None:
                self._run.worker_start.cancel()
            cancel_tagged(self._run.spark, self._tag)
        self._started()[0].shutdown(wait=True)

    def identity(self) -> ModelIdentity:
        """The identity every executor agreed on; the preflight's error if it failed."""
        return self._started()[1].result()

    @contextmanager
    def abandoned_if_it_fails(self) -> Iterator[None]:
        """Run the block, whose work is useless without the model, so that a failed preflight ends it at once: the
        block's Spark jobs (this thread's) carry a tag the preflight cancels when it fails, and the preflight's
        error is raised in place of the cancellation's. A block entered after the preflight failed does not run."""
        spark = self._run.spark
        future = self._started()[1]
        tag = f"lakescore-needs-model-{uuid.uuid4().hex[:12]}"
        future.add_done_callback(lambda done: cancel_tagged(spark, tag) if done.exception() is not None else None)
        try:
            if future.done():
                future.result()  # failed already: its error, before any job
            with job_tag(spark, tag):
                yield
        except Exception:
            error = future.exception() if future.done() else None
            if error is not None:
                raise error from None
            raise


def precision_check_sample(source: DataFrame, spec: ModelSpec, input_cols: Sequence[str]) -> list[Any]:
    """Up to :data:`SAMPLE_ROWS` non-null texts of the input (``(text, text_pair)`` tuples for pairs: two text
    columns) for a reduced-precision text model; ``[]`` otherwise."""
    if not spec.reduced_precision or not get_task(spec.task).input_kind_of(spec).is_text:
        return []
    texts = [column(c) for c in input_cols]
    present = texts[0].isNotNull()
    for side in texts[1:]:  # a pair with a null or empty side is not scored
        present &= side.isNotNull() & (F.length(side) > 0) & (F.length(texts[0]) > 0)
    rows = source.select(*texts).where(present).limit(SAMPLE_ROWS).collect()
    return [r[0] if len(texts) == 1 else tuple(r) for r in rows]
