"""The iterator pandas UDF that scores a text column on the executors.

What crosses from the driver is a :class:`~udfs.model_source.ModelSpec` and a
few numbers, never a model. Inside each Python worker the model comes from
:mod:`udfs.model_cache` on the first non-empty Arrow batch and is reused for
every later batch and task that process runs.
"""

from __future__ import annotations

import itertools
import time
from typing import Iterator, Optional

import pandas as pd
from pyspark import Accumulator, TaskContext
from pyspark.sql.functions import pandas_udf

from schemas.output import scored_struct
from udfs.batching import BatchPolicy, prefetch, score_texts, tokenize_present
from udfs.model_cache import get_model
from udfs.model_source import ModelSpec

__all__ = ["WorkerCounters", "make_scoring_udf"]


class WorkerCounters:
    """Spark accumulators the workers add to; read on the driver after the write."""

    def __init__(self, spark_context) -> None:
        self.model_loads: Accumulator = spark_context.accumulator(0)
        self.arrow_batches: Accumulator = spark_context.accumulator(0)
        self.rows: Accumulator = spark_context.accumulator(0)
        self.model_seconds: Accumulator = spark_context.accumulator(0.0)
        """Seconds the workers spent scoring tokenized Arrow batches (tokenization runs ahead in a thread)."""


def make_scoring_udf(spec: ModelSpec, *, policy: BatchPolicy, counters: Optional[WorkerCounters] = None):
    """Build the scoring UDF for ``spec.task`` over one string column.

    Input: a string column (nulls allowed). Output: a struct of
    :func:`schemas.output.scored_struct` for ``spec.task``; for ``embed`` that is
    ``embedding`` (array<float>, null where the text was null) and
    ``model_sha256`` (digest of the weights this worker actually loaded).

    Each Arrow batch is tokenized once (the next one in a background thread while
    the model runs), scored in token-budget batches bounded by ``policy``
    (:mod:`udfs.batching`) and returned in input order. Errors while loading or
    scoring fail the task (Spark retries it, then fails the job).
    """

    def score(texts: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        texts = iter(texts)
        first = next(texts, None)
        if first is None:  # empty partition: no model load
            return
        model = _model_for_this_worker(spec, counters)
        head = model.scorer

        def tokenize(batch: pd.Series):
            values = batch.tolist()
            return values, tokenize_present(values, head)

        for batch, (values, features) in prefetch(itertools.chain([first], texts), tokenize):
            started = time.perf_counter()
            outputs, valid = score_texts(values, head, policy, features)
            elapsed = time.perf_counter() - started
            embeddings = pd.Series([row if ok else None for row, ok in zip(outputs, valid)], dtype=object)
            yield pd.DataFrame({"embedding": embeddings, "model_sha256": model.sha256})
            if counters is not None:
                counters.arrow_batches.add(1)
                counters.rows.add(len(batch))
                counters.model_seconds.add(elapsed)

    return pandas_udf(score, returnType=scored_struct(spec.task))


def _model_for_this_worker(spec: ModelSpec, counters: Optional[WorkerCounters]):
    _limit_torch_threads_to_task_cpus()
    model, loaded_now = get_model(spec)
    if loaded_now and counters is not None:
        counters.model_loads.add(1)
    return model


def _limit_torch_threads_to_task_cpus() -> None:
    """One torch thread per CPU Spark gave this task, so concurrent tasks do not oversubscribe cores."""
    import torch

    context = TaskContext.get()
    cpus = context.cpus() if context is not None else None
    if cpus and torch.get_num_threads() != cpus:
        torch.set_num_threads(cpus)
