"""The iterator-style Arrow function that scores rows on the executors (``mapInArrow``).

What crosses from the driver is a :class:`~lakescore.udfs.models.model_source.ModelSpec` and a
few names and numbers, never a model. Inside each Python worker the model
comes from :mod:`lakescore.udfs.models.model_cache` on the first non-empty Arrow batch and is
reused for every later batch and task that process runs.

Why ``mapInArrow`` rather than a pandas UDF in a ``select``: results go back as
Arrow arrays built from numpy buffers (a pandas UDF converts every array cell
to a Python list), the id column passes through as the Arrow array it arrived
as (no int64 -> float64 detour for nullable ids), and the same function runs in
a stage with its own resource profile (``mapInArrow(..., profile=...)``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import itertools
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.types import StructType

from lakescore.schemas.output import WORKER_COLUMN
from lakescore.schemas.traffic import Traffic
from lakescore.udfs.batching import (
    AdaptiveBudget,
    BatchPolicy,
    Scored,
    TextHead,
    default_max_tokens,
    prefetch,
    score_texts,
)
from lakescore.udfs.heads.protocol import (
    ChecksFidelity,
    ChunksDocuments,
    Head,
    MetersTraffic,
    PlansOwnBudget,
    ServedElsewhere,
)
from lakescore.udfs.models.model_cache import LoadedModel, get_model
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.models.quantize import Tolerance, check_fidelity
from lakescore.udfs.registry import get_task
from lakescore.udfs.runners import CountsTokens

__all__ = [
    "RowCounter",
    "ScoredBatch",
    "score_batches",
    "make_scoring_function",
    "make_preflight_function",
    "PREFLIGHT_SCHEMA",
    "fidelity_figures",
    "start_worker",
    "batch_policy",
    "model_for_this_worker",
]

ArrowScorer = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class RowCounter(Protocol):
    """What the scoring workers add each batch's rows to, for live progress on the driver.

    A classic session's accumulator (:func:`lakescore.jobs.platform.spark.adapter.rows_counter`);
    ``None`` where there is none (Spark Connect). The run report never depends on it: worker
    metrics travel in the scored rows (:data:`~lakescore.schemas.output.WORKER_COLUMN`).
    """

    def add(self, rows: int) -> None: ...


def make_scoring_function(
    spec: ModelSpec,
    *,
    keep_cols: Sequence[str],
    input_cols: Sequence[str],
    schema: StructType,
    max_tokens: int | None,
    max_rows: int,
    rows_counter: RowCounter | None = None,
    runner_options: Mapping[str, Any] | None = None,
    tally_rows: bool = False,
) -> ArrowScorer:
    """Build the function ``mapInArrow`` runs for ``spec.task``.

    Input batches hold ``keep_cols`` and ``input_cols`` (one text column for text
    tasks; the numeric feature columns, in the program's order, for feature tasks).
    Output batches follow ``schema`` (:func:`lakescore.schemas.output.scored_schema`): the
    ``keep_cols`` as they came (the job keeps the id), the task's prediction columns (null for unscored rows),
    ``model_sha256`` of the weights this worker loaded, ``_reason`` / ``_error`` / ``_input`` for
    rows that could not be scored (null input, bad feature value, a forward pass that failed even
    for the row alone), and ``_worker``: this batch's worker metrics on its first row, null on the
    others (summed by the job for the run report, in classic and Spark Connect sessions alike). With ``tally_rows``
    no scored row carries them: each batch is followed by its tally row, every column null but ``model_sha256`` and
    ``_worker`` (:meth:`ScoredBatch.tally`), for a caller that drops scored rows before counting them (a ranked run).

    Each batch is prepared (tokenized, or converted to a float matrix) in a
    background thread while the model runs on the previous one, scored in
    batches of at most ``max_tokens`` padded tokens (default: per the device the
    worker resolved, :func:`~lakescore.udfs.batching.default_max_tokens`, or the head's own
    ``default_max_tokens(device)`` where it has one) and ``max_rows``
    rows (:mod:`lakescore.udfs.batching`), and returned in input order. Each batch's rows are
    added to ``rows_counter`` when one is given (live progress). ``runner_options`` go to the input kind's runner
    (:mod:`lakescore.udfs.runners`; the image runner's pixel limits). A model that fails to load, or
    loads with other weights than ``spec.expect_sha256``, fails the task.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema)
    keep_cols = tuple(keep_cols)
    task = get_task(spec.task)
    prediction_types = task.output_arrow_types_for(task.options_of(spec))

    def score(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch, scored in score_batches(
            spec, input_cols, batches, prediction_types, max_tokens, max_rows, runner_options
        ):
            if scored is not None:
                if rows_counter is not None:
                    rows_counter.add(batch.num_rows)
                yield scored.record_batch([batch.column(name) for name in keep_cols], arrow_schema, not tally_rows)
                if tally_rows:
                    yield scored.tally(arrow_schema)

    return score


@dataclass(frozen=True)
class ScoredBatch:
    """One Arrow batch's outcome, row *i* for input row *i*: the task's prediction arrays (null where a
    row was not scored), the weights digest, and per row the reason, error text and raw input of unscored rows;
    then what scoring the batch cost: model seconds, token-budget halvings, model loads (1 on the batch that loaded it),
    and what a head over the wire sent for it (:class:`~lakescore.schemas.traffic.Traffic`: for generation the prompt
    tokens read and tokens generated too)."""

    predictions: list[pa.Array]
    sha256: str
    reasons: list[str | None]
    errors: list[str | None]
    raw_inputs: list[str | None]
    seconds: float = 0.0
    halvings: int = 0
    loads: int = 0
    traffic: Traffic = dataclasses.field(default_factory=Traffic)

    def record_batch(self, kept: list[pa.Array], schema: pa.Schema, with_metrics: bool = True) -> pa.RecordBatch:
        """``kept`` columns, predictions, ``model_sha256``, the error columns and ``_worker`` (this batch's
        :meth:`metrics` on its first row, or with ``with_metrics`` false on none), as ``schema`` says."""
        n = len(self.reasons)
        worker = [self.metrics()] + [None] * (n - 1) if with_metrics else [None] * n
        arrays = (
            kept
            + self.predictions
            + [
                pa.repeat(pa.scalar(self.sha256, pa.string()), n),  # in Arrow's C++: a Python list costs per row
                pa.array(self.reasons, type=pa.string()),
                pa.array(self.errors, type=pa.string()),
                pa.array(self.raw_inputs, type=pa.string()),
                pa.array(worker, type=schema.field(WORKER_COLUMN).type),
            ]
        )
        arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def tally(self, schema: pa.Schema) -> pa.RecordBatch:
        """One row of ``schema`` holding this batch's :meth:`metrics` in ``_worker`` and its ``model_sha256``, every
        other column null."""
        values = {"model_sha256": [self.sha256], WORKER_COLUMN: [self.metrics()]}
        return pa.RecordBatch.from_arrays(
            [pa.array(values.get(f.name, [None]), type=f.type) for f in schema], schema=schema
        )

    def metrics(self) -> dict[str, Any]:
        """This batch's :data:`~lakescore.schemas.output.WORKER_METRICS`."""
        return {
            "model_loads": self.loads,
            "arrow_batches": 1,
            "batch_rows": len(self.reasons),
            "model_seconds": self.seconds,
            "budget_halvings": self.halvings,
            **self.traffic.as_dict(),
        }


def score_batches(
    spec: ModelSpec,
    input_cols: Sequence[str],
    batches: Iterable[pa.RecordBatch],
    prediction_types: Sequence[pa.DataType],
    max_tokens: int | None,
    max_rows: int,
    runner_options: Mapping[str, Any] | None = None,
) -> Iterator[tuple[pa.RecordBatch, ScoredBatch | None]]:
    """Score each Arrow batch's ``input_cols`` with this worker's cached model: ``(batch, outcome)`` in order.

    The one scoring loop behind both the ``mapInArrow`` function and the pandas UDF
    (:mod:`lakescore.udfs.pandas_udf`). An empty batch yields ``None`` and, before the
    first row, loads no model. ``prediction_types`` are the Arrow types of the task's output
    columns (for batches in which no row could be scored). Preparation (tokenizing, or
    converting features) of the next batch runs in a thread while the model scores this one.
    """
    batches = iter(batches)
    for first in batches:  # empty batches before the first row need no model
        if first.num_rows:
            break
        yield first, None
    else:
        return
    model, resolved, loads = model_for_this_worker(spec)
    runner = get_task(spec.task).input_kind_of(spec).runner(model.scorer, tuple(input_cols), **(runner_options or {}))
    budget = AdaptiveBudget(batch_policy(model, resolved.device, max_tokens, max_rows))
    for batch, prepared in prefetch(itertools.chain([first], batches), runner.prepare):
        if batch.num_rows == 0:
            yield batch, None
            continue
        started, halvings, sent = time.perf_counter(), budget.halvings, _traffic(model.scorer)
        scored = runner.score(prepared, budget)
        seconds = time.perf_counter() - started
        traffic = _traffic(model.scorer) - sent
        # the runner counts a row's tokens where a row is a request (generate); where a request carries many rows
        # (a remote embed head) the tokens are what the server's usage reported for the batch's requests
        if isinstance(runner, CountsTokens):
            counted = runner.token_traffic(scored) if scored.ok.any() else Traffic()
            traffic = dataclasses.replace(
                traffic,
                tokens_in=counted.tokens_in,
                tokens_in_cached=counted.tokens_in_cached,
                tokens_in_cache_write=counted.tokens_in_cache_write,
                tokens_out=counted.tokens_out,
            )
        yield (
            batch,
            ScoredBatch(
                _prediction_arrays(model, scored, prediction_types),
                model.sha256,
                scored.reasons,
                scored.errors,
                runner.raw_inputs(prepared, scored),
                seconds=seconds,
                halvings=budget.halvings - halvings,
                loads=loads,
                traffic=traffic,
            ),
        )
        loads = 0


def _traffic(head: Head) -> Traffic:
    """What a head over the wire sent so far in this process (nothing for the others)."""
    return head.traffic() if isinstance(head, MetersTraffic) else Traffic()


PREFLIGHT_SCHEMA = (
    "host string, pid int, device string, sha256 string, revision string, seconds double, loaded boolean, "
    "error_type string, error string, fidelity string, files string, row_seconds double, traffic string, probed boolean"
)
"""One row per preflight task: which worker loaded what (``loaded``: this task loaded it), or why it could not;
``fidelity``: the JSON figures of the quantization check (:func:`fidelity_figures`), from the one task that ran it;
``files``: the JSON :func:`~lakescore.udfs.models.model_source.model_file_digests` of the model files this worker loaded
(a model served elsewhere: what its endpoint's ``/v1/models`` said of it, :attr:`LoadedModel.files`); ``traffic``: what
a head over an endpoint sent for the preflight (JSON of :class:`~lakescore.schemas.traffic.Traffic`), which the run's
figures and cost include; ``probed``: whether the task scored its sample (false: a head over an endpoint whose request
waits for ``probe``, :func:`make_preflight_function`)."""


def make_preflight_function(
    spec: ModelSpec,
    sample: Sequence[str] = (),
    tolerance: Tolerance | None = None,
    probe: bool = True,
) -> ArrowScorer:
    """Build the function a preflight ``mapInArrow`` runs: load ``spec`` in this worker and score one sample.

    ``probe`` false: a head over an endpoint (:class:`~lakescore.udfs.models.model_cache.ServedElsewhere`) is made (its
    ``/v1/models`` identity) but sends no request, and its row says ``probed`` false; the driver sends the sample in a
    second preflight once it knows rows will be scored, so a run with nothing to score pays for nothing.

    Input rows are ignored (one small partition per task). Each task yields one
    row of :data:`PREFLIGHT_SCHEMA`: host, pid, the device it resolved, the
    weights' sha256, the digests of its other model files and the revision, the seconds it took, whether it loaded the
    model (or found it cached) and, when loading or the sample failed, the exception's type and text. Failures
    are returned, not raised, so the driver fails the run once with the worker's own message
    instead of after ``spark.task.maxFailures`` retries of a model that cannot load.

    A reduced-precision ``spec`` (int8, bfloat16, float16: ``spec.reduced_precision``) with a ``sample`` of the
    run's input texts: the first task also scores the sample both ways (:func:`fidelity_figures`) and fails with
    :class:`~lakescore.udfs.models.quantize.QuantizationToleranceError` outside ``tolerance``.

    The model stays in this worker's cache (:mod:`lakescore.udfs.models.model_cache`), where the
    scoring tasks this worker runs next find it.
    """
    arrow_schema = _preflight_arrow_schema()

    def preflight(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        started = time.perf_counter()
        row: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
        try:
            model, resolved, loads = model_for_this_worker(spec)
            kind = get_task(spec.task).input_kind_of(spec)
            row["probed"] = probe or not isinstance(model.scorer, ServedElsewhere)
            if row["probed"]:
                sent = _traffic(model.scorer)
                try:
                    rows = np.asarray(model.scorer.score(kind.preflight_sample(spec))).shape[0]
                finally:  # a refused preflight's request was sent too
                    row["traffic"] = json.dumps((_traffic(model.scorer) - sent).as_dict())
                if rows != 1:
                    raise RuntimeError(f"the model returned {rows} rows for one input")
            if (
                kind.timed_rows and row["probed"] and not isinstance(model.scorer, ServedElsewhere)
            ):  # (no paid requests)
                row["row_seconds"] = _seconds_per_row(
                    model, kind.preflight_sample(spec, kind.timed_rows), kind.timed_rows
                )
            row.update(
                device=resolved.device,
                sha256=model.sha256,
                revision=model.revision,
                loaded=bool(loads),
                files=json.dumps(model.files, sort_keys=True),
            )
            if resolved.reduced_precision and sample and _first_task():
                figures = fidelity_figures(resolved, model, sample)
                row["fidelity"] = json.dumps(figures)
                check_fidelity(figures, tolerance or Tolerance(), len(sample), spec.source, resolved.reduced_precision)
        except BaseException as exc:  # reported to the driver, which fails the run before scoring
            # a native library's panic (pyo3's PanicException) is a BaseException: reported as well, not let through
            if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            row.update(error_type=type(exc).__name__, error=str(exc)[:2000])
        row["seconds"] = time.perf_counter() - started
        yield pa.RecordBatch.from_pylist([row], schema=arrow_schema)

    return preflight


_TIMING_SECONDS = 0.25
"""How long the preflight's timing calls may take together before it stops at the calls made: a model slow enough to
spend it is slow whatever its warm-up, and every second here is a second before scoring starts."""


def _seconds_per_row(model: LoadedModel, batch: Any, rows: int, calls: int = 3) -> float:
    """The model's seconds per row on ``batch``: the fastest of up to ``calls`` calls (the first pays for warm-up, e.g.
    a TorchScript program optimising for a new shape; no more once :data:`_TIMING_SECONDS` are spent), an upper bound
    where a call's own overhead is a row's cost."""
    fastest, spent = math.inf, 0.0
    for _ in range(calls):
        started = time.perf_counter()
        model.scorer.score(batch)
        took = time.perf_counter() - started
        fastest, spent = min(fastest, took), spent + took
        if spent > _TIMING_SECONDS:
            break
    return fastest / rows


def start_worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function that reads its input and yields nothing: its task only makes the executor
    start a Python worker (and the daemon it forks from), ahead of the tasks that need one."""
    for _ in batches:
        pass
    yield from ()


def fidelity_figures(spec: ModelSpec, model: LoadedModel, sample: Sequence[str]) -> dict[str, float]:
    """The head's ``fidelity`` figures of reduced-precision ``model`` against float32 on ``sample``, both through
    the batching core with the default budget (the reference model is loaded for this, on the same backend and
    device, and not cached).

    int8's reference is the float32 ONNX graph of the same weights, which its export checked against float32
    torch (:func:`~lakescore.udfs.models.onnx_export.check_graph`), so the worker that checks imports no torch
    (the daemon preloads none for this backend), which leaves the run faster and its workers smaller than a
    torch reference would. bfloat16's and float16's is the
    float32 torch model, on the same device: its weights (twice the reduced-precision model's) are held beside
    the model while the check runs, then freed."""
    reference_spec = spec.float32_reference()
    loaded = get_task(spec.task).load(reference_spec, model.model_dir)
    # a head over chunks is checked on its embedder: the chunks of a sample text are texts like any other; the check
    # runs text heads only (the batching core's), as the caller's text input kind says
    reference = cast(TextHead, loaded.embedder if isinstance(loaded, ChunksDocuments) else loaded)
    scorer = model.scorer.embedder if isinstance(model.scorer, ChunksDocuments) else model.scorer
    if not isinstance(scorer, ChecksFidelity):
        raise ValueError(f"the {spec.task} head has no reduced-precision check; run it at float32")
    policy = BatchPolicy(default_max_tokens(reference_spec.device), 256)
    texts = list(sample)
    expected = score_texts(texts, reference, policy).outputs
    del reference
    _return_freed_memory()
    return scorer.fidelity(expected, score_texts(texts, cast(TextHead, scorer), policy).outputs)


def _return_freed_memory() -> None:
    """Give the heap's free pages back to the OS (glibc's ``malloc_trim``; a no-op elsewhere).

    Freeing a model leaves its buffers in the allocator's free lists, so the worker keeps the
    memory for the rest of the run; trimming after the reference model is dropped gives back what it can."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _first_task() -> bool:
    context = TaskContext.get()
    return context is None or context.partitionId() == 0


def _preflight_arrow_schema() -> pa.Schema:
    """:data:`PREFLIGHT_SCHEMA` in Arrow terms (parsing the DDL would need a SparkContext, which workers lack)."""
    types = {"string": pa.string(), "int": pa.int32(), "double": pa.float64(), "boolean": pa.bool_()}
    fields = [field.split() for field in PREFLIGHT_SCHEMA.split(",")]
    return pa.schema([(name, types[kind]) for name, kind in fields])


def _prediction_arrays(model: LoadedModel, scored: Scored, types: Sequence[pa.DataType]) -> list[pa.Array]:
    """The head's output columns for ``scored`` (one per output field), or all-null columns when no row was scored."""
    ok = scored.ok
    if not ok.any():  # nothing scored, so no outputs to shape (heads never see this case)
        return [pa.nulls(len(ok), t) for t in types]
    arrays = list(model.scorer.columns(scored.outputs, ok))
    if len(arrays) != len(types):
        raise ValueError(
            f"the {model.scorer.__class__.__name__} head returned {len(arrays)} columns for {len(types)} outputs"
        )
    return arrays


def batch_policy(model: LoadedModel, device: str, max_tokens: int | None, max_rows: int) -> BatchPolicy:
    """The forward batches' bounds for ``model`` on ``device``: ``max_tokens`` (default: the head's own
    ``default_max_tokens(device)`` where it has one, else :func:`~lakescore.udfs.batching.default_max_tokens`) and
    ``max_rows``."""
    default = model.scorer.default_max_tokens if isinstance(model.scorer, PlansOwnBudget) else default_max_tokens
    return BatchPolicy(max_tokens or default(device), max_rows)


def model_for_this_worker(spec: ModelSpec) -> tuple[LoadedModel, ModelSpec, int]:
    """The cached model for ``spec`` on the device this task resolved (its GPU, or CPU), the spec it loaded (the
    device and dtype as they run here: float16 on a CPU runs float32), and 1 when this call loaded it (0: it was
    cached)."""
    from lakescore.udfs.models.devices import (  # torch: workers only
        bound_tokenizer_threads,
        effective_dtype,
        resolve_device,
    )

    device = "cpu" if spec.backend == "onnx" else resolve_device(spec.device)  # ORT's CPU build; no torch import
    spec = dataclasses.replace(spec, device=device, dtype=effective_dtype(spec.dtype, device))
    context = TaskContext.get()
    cpus = context.cpus() if context is not None else None
    if cpus:
        bound_tokenizer_threads(cpus)  # before anything in this process tokenizes: the pool is sized once
    model, loaded_now = get_model(spec)
    _limit_torch_threads(cpus)
    return model, spec, int(loaded_now)


def _limit_torch_threads(cpus: int | None) -> None:
    """One torch thread per CPU Spark gave this task, so concurrent tasks do not oversubscribe cores.

    Only where torch is loaded already: a worker on the ONNX backend never imports it (its
    sessions take their threads from the task when created, :func:`lakescore.udfs.models.forwards.load_forward`).
    """
    torch = sys.modules.get("torch")
    if torch is not None and cpus and torch.get_num_threads() != cpus:
        torch.set_num_threads(cpus)
