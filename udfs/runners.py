"""Runners: how one Arrow batch of a task's input columns becomes model input, scores and raw inputs.

A runner sits between an Arrow batch and the batching core (:mod:`lakescore.udfs.batching`):
``prepare`` turns the batch into what the head takes (tokenized text, or a float
matrix) and may run ahead in a thread; ``score`` runs the core with the task's
token budget; ``raw_inputs`` gives the input of every row that could not be
scored, as text for the errors table. One runner per input kind
(:mod:`lakescore.udfs.registry`), never per task.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakescore.udfs.batching import AdaptiveBudget, Scored, score_matrix, score_texts, tokenize_present

__all__ = ["TextRunner", "MatrixRunner"]


class TextRunner:
    """Text heads: one string column, tokenized once per Arrow batch."""

    def __init__(self, head, input_cols: Sequence[str]) -> None:
        (self.text_col,) = input_cols
        self.head = head

    def prepare(self, batch: pa.RecordBatch):
        values = batch.column(self.text_col).to_pylist()
        return values, tokenize_present(values, self.head)

    def score(self, prepared, budget: AdaptiveBudget) -> Scored:
        values, features = prepared
        return score_texts(values, self.head, budget, features)

    def raw_inputs(self, prepared, scored: Scored) -> list[Optional[str]]:
        values, _ = prepared
        return [None if reason is None else values[i] for i, reason in enumerate(scored.reasons)]


class MatrixRunner:
    """Tabular heads: numeric feature columns as one float64 matrix (nulls become NaN)."""

    def __init__(self, head, input_cols: Sequence[str]) -> None:
        self.head, self.feature_cols = head, tuple(input_cols)

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
