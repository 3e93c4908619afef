"""The iterator-style Arrow function that scores rows on the executors (``mapInArrow``).

What crosses from the driver is a :class:`~lakescore.udfs.model_source.ModelSpec` and a
few names and numbers, never a model. Inside each Python worker the model
comes from :mod:`lakescore.udfs.model_cache` on the first non-empty Arrow batch and is
reused for every later batch and task that process runs.

Why ``mapInArrow`` rather than a pandas UDF in a ``select``: results go back as
Arrow arrays built from numpy buffers (a pandas UDF converts every array cell
to a Python list), the id column passes through as the Arrow array it arrived
as (no int64 -> float64 detour for nullable ids), and the same function runs in
a stage with its own resource profile (``mapInArrow(..., profile=...)``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import time
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Accumulator, TaskContext
from pyspark.sql.types import StructType

from lakescore.schemas.output import ERROR_COLUMNS
from lakescore.udfs.batching import (
    AdaptiveBudget,
    BatchPolicy,
    Scored,
    default_max_tokens,
    prefetch,
    score_matrix,
    score_texts,
    tokenize_present,
)
from lakescore.udfs.model_cache import LoadedModel, get_model
from lakescore.udfs.model_source import ModelSpec

__all__ = ["WorkerCounters", "make_scoring_function", "make_preflight_function", "PREFLIGHT_SCHEMA"]

ArrowScorer = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class WorkerCounters:
    """Spark accumulators the workers add to; read on the driver after the write."""

    def __init__(self, spark_context) -> None:
        self.model_loads: Accumulator = spark_context.accumulator(0)
        self.arrow_batches: Accumulator = spark_context.accumulator(0)
        self.rows: Accumulator = spark_context.accumulator(0)
        self.model_seconds: Accumulator = spark_context.accumulator(0.0)
        """Seconds the workers spent scoring prepared Arrow batches (preparation runs ahead in a thread)."""
        self.budget_halvings: Accumulator = spark_context.accumulator(0)
        """Times a task halved its token budget after a CUDA out-of-memory error."""


def make_scoring_function(
    spec: ModelSpec,
    *,
    id_col: str,
    input_cols: Sequence[str],
    schema: StructType,
    max_tokens: Optional[int],
    max_rows: int,
    counters: Optional[WorkerCounters] = None,
) -> ArrowScorer:
    """Build the function ``mapInArrow`` runs for ``spec.task``.

    Input batches hold ``id_col`` and ``input_cols`` (one text column for text
    tasks; the numeric feature columns, in the program's order, for ``tabular``).
    Output batches follow ``schema`` (:func:`lakescore.schemas.output.scored_schema`): the id
    as it came, the head's prediction columns (null for unscored rows),
    ``model_sha256`` of the weights this worker loaded, and ``_reason`` /
    ``_error`` / ``_input`` for rows that could not be scored (null input, bad
    feature value, a forward pass that failed even for the row alone).

    Each batch is prepared (tokenized, or converted to a float matrix) in a
    background thread while the model runs on the previous one, scored in
    batches of at most ``max_tokens`` padded tokens (default: per the device the
    worker resolved, :func:`~lakescore.udfs.batching.default_max_tokens`) and ``max_rows``
    rows (:mod:`lakescore.udfs.batching`), and returned in input order.
    A model that fails to load, or loads with other weights than
    ``spec.expect_sha256``, fails the task.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema)
    input_cols = tuple(input_cols)

    def score(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = iter(batches)
        first = next((b for b in batches if b.num_rows), None)
        if first is None:  # empty partition: no model load
            return
        model, device = _model_for_this_worker(spec, counters)
        runner = _MatrixRunner(model.scorer, input_cols) if spec.task == "tabular" else _TextRunner(model.scorer, input_cols[0])
        budget = AdaptiveBudget(BatchPolicy(max_tokens or default_max_tokens(device), max_rows))
        for batch, prepared in prefetch(itertools.chain([first], batches), runner.prepare):
            if batch.num_rows == 0:
                continue
            started = time.perf_counter()
            halvings = budget.halvings
            scored = runner.score(prepared, budget)
            elapsed = time.perf_counter() - started
            yield _result_batch(batch.column(id_col), model, scored, runner.raw_inputs(prepared, scored), arrow_schema)
            if counters is not None:
                counters.arrow_batches.add(1)
                counters.rows.add(batch.num_rows)
                counters.model_seconds.add(elapsed)
                if budget.halvings != halvings:
                    counters.budget_halvings.add(budget.halvings - halvings)

    return score


PREFLIGHT_SCHEMA = (
    "host string, pid int, device string, sha256 string, revision string, seconds double, "
    "error_type string, error string"
)
"""One row per preflight task: which worker loaded what, or why it could not."""


def make_preflight_function(spec: ModelSpec, counters: Optional[WorkerCounters] = None) -> ArrowScorer:
    """Build the function a preflight ``mapInArrow`` runs: load ``spec`` in this worker and score one sample.

    Input rows are ignored (one small partition per task). Each task yields one
    row of :data:`PREFLIGHT_SCHEMA`: host, pid, the device it resolved, the
    weights' sha256 and revision, the seconds it took, and, when loading or the
    sample failed, the exception's type and text. Failures are returned, not
    raised, so the driver fails the run once with the worker's own message
    instead of after ``spark.task.maxFailures`` retries of a model that cannot load.

    The model stays in this worker's cache (:mod:`lakescore.udfs.model_cache`), where the
    scoring tasks this worker runs next find it.
    """
    arrow_schema = _preflight_arrow_schema()

    def preflight(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        started = time.perf_counter()
        row: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
        try:
            model, device = _model_for_this_worker(spec, counters)
            sample = np.zeros((1, len(spec.feature_cols))) if spec.task == "tabular" else ["lakescore preflight"]
            rows = np.asarray(model.scorer.score(sample)).shape[0]
            if rows != 1:
                raise RuntimeError(f"the model returned {rows} rows for one input")
            row.update(device=device, sha256=model.sha256, revision=model.revision)
        except Exception as exc:  # reported to the driver, which fails the run before scoring
            row.update(error_type=type(exc).__name__, error=str(exc)[:2000])
        row["seconds"] = time.perf_counter() - started
        yield pa.RecordBatch.from_pylist([row], schema=arrow_schema)

    return preflight


def _preflight_arrow_schema() -> pa.Schema:
    """:data:`PREFLIGHT_SCHEMA` in Arrow terms (parsing the DDL would need a SparkContext, which workers lack)."""
    types = {"string": pa.string(), "int": pa.int32(), "double": pa.float64()}
    fields = [field.split() for field in PREFLIGHT_SCHEMA.split(",")]
    return pa.schema([(name, types[kind]) for name, kind in fields])


class _TextRunner:
    """Text heads: one string column, tokenized once per Arrow batch."""

    def __init__(self, head, text_col: str) -> None:
        self.head, self.text_col = head, text_col

    def prepare(self, batch: pa.RecordBatch):
        values = batch.column(self.text_col).to_pylist()
        return values, tokenize_present(values, self.head)

    def score(self, prepared, budget: AdaptiveBudget) -> Scored:
        values, features = prepared
        return score_texts(values, self.head, budget, features)

    def raw_inputs(self, prepared, scored: Scored) -> list[Optional[str]]:
        values, _ = prepared
        return [None if reason is None else values[i] for i, reason in enumerate(scored.reasons)]


class _MatrixRunner:
    """Tabular heads: numeric feature columns as one float64 matrix (nulls become NaN)."""

    def __init__(self, head, feature_cols: tuple[str, ...]) -> None:
        self.head, self.feature_cols = head, feature_cols

    def prepare(self, batch: pa.RecordBatch) -> np.ndarray:
        columns = [
            pc.cast(batch.column(name), pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)
            for name in self.feature_cols
        ]
        return np.column_stack(columns) if columns else np.zeros((batch.num_rows, 0))

    def score(self, matrix: np.ndarray, budget: AdaptiveBudget) -> Scored:
        return score_matrix(matrix, self.head, budget)

    def raw_inputs(self, matrix: np.ndarray, scored: Scored) -> list[Optional[str]]:
        return [
            None if reason is None else json.dumps(dict(zip(self.feature_cols, (_json_number(v) for v in matrix[i]))))
            for i, reason in enumerate(scored.reasons)
        ]


def _json_number(value: float) -> Any:
    return value if np.isfinite(value) else str(value)  # JSON has no NaN / Infinity


def _result_batch(
    ids: pa.Array, model: LoadedModel, scored: Scored, raw: list[Optional[str]], schema: pa.Schema
) -> pa.RecordBatch:
    ok = scored.ok
    if ok.any():
        columns = dict(model.scorer.columns(scored.outputs, ok))
    else:  # nothing scored, so no outputs to shape: every prediction column is null (heads never see this case)
        columns = {field.name: pa.nulls(len(ok), field.type) for field in list(schema)[1:]}
    columns["model_sha256"] = pa.array([model.sha256] * len(ok), type=pa.string())
    reason_col, error_col, input_col = ERROR_COLUMNS
    columns[reason_col] = pa.array(scored.reasons, type=pa.string())
    columns[error_col] = pa.array(scored.errors, type=pa.string())
    columns[input_col] = pa.array(raw, type=pa.string())
    arrays = [ids] + [columns[field.name] for field in list(schema)[1:]]
    arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _model_for_this_worker(spec: ModelSpec, counters: Optional[WorkerCounters]) -> tuple[LoadedModel, str]:
    """The cached model for ``spec`` on the device this task resolved (its GPU, or CPU), and that device."""
    from lakescore.udfs.devices import effective_dtype, resolve_device  # torch: workers only, not the driver

    _limit_torch_threads_to_task_cpus()
    device = resolve_device(spec.device)
    spec = dataclasses.replace(spec, device=device, dtype=effective_dtype(spec.dtype, device))
    model, loaded_now = get_model(spec)
    if loaded_now and counters is not None:
        counters.model_loads.add(1)
    return model, device


def _limit_torch_threads_to_task_cpus() -> None:
    """One torch thread per CPU Spark gave this task, so concurrent tasks do not oversubscribe cores."""
    import torch

    context = TaskContext.get()
    cpus = context.cpus() if context is not None else None
    if cpus and torch.get_num_threads() != cpus:
        torch.set_num_threads(cpus)
