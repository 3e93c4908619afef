"""Runners: how one Arrow batch of a task's input columns becomes model input, scores and raw inputs.

A runner sits between an Arrow batch and the batching core (:mod:`lakescore.udfs.batching`):
``prepare`` turns the batch into what the head takes (decoded and tokenized text, or a float
matrix) and may run ahead in a thread; ``score`` runs the core with the task's token budget;
``raw_inputs`` gives the input of every row that could not be scored, as text for the errors
table. One runner per input kind (:mod:`lakescore.udfs.registry`), never per task.

Preparation fails per row, never per batch: a text that is not valid UTF-8 (Parquet and Spark
accept such bytes) is ``invalid_text``, a text the tokenizer rejects is ``prepare_error``; the
other rows of the batch are scored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakescore.udfs.batching import AdaptiveBudget, Scored, score_matrix, score_texts, tokenize_present

__all__ = ["RowFailure", "PreparedTexts", "TextRunner", "MatrixRunner", "decode_texts"]


@dataclass(frozen=True)
class RowFailure:
    """Why preparation could not handle a row: reason code, error text, and the raw input as text."""

    reason: str
    error: str
    raw: Optional[str]


@dataclass
class PreparedTexts:
    """A text batch ready to score: the texts (``None`` where null or refused), their tokenization, refused rows."""

    texts: list[Optional[str]]
    features: Any
    refused: dict[int, RowFailure] = field(default_factory=dict)


def decode_texts(column: pa.Array) -> tuple[list[Optional[str]], dict[int, RowFailure]]:
    """The strings of ``column``, decoded per row: invalid UTF-8 becomes ``None`` plus an ``invalid_text`` failure.

    The failure's raw input shows the bytes with Python's ``backslashreplace`` escapes (``\\xff``).
    Valid columns take Arrow's own conversion (one call, no per-row Python decode).
    """
    try:
        return column.to_pylist(), {}
    except UnicodeDecodeError:
        pass
    binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
    texts: list[Optional[str]] = []
    refused: dict[int, RowFailure] = {}
    for i, value in enumerate(column.view(binary).to_pylist()):
        try:
            texts.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError as exc:
            texts.append(None)
            refused[i] = RowFailure("invalid_text", f"not valid UTF-8: {exc}", value.decode("utf-8", "backslashreplace"))
    return texts, refused


def _refuse(scored: Scored, refused: dict[int, RowFailure]) -> Scored:
    """``scored`` with each refused row's own reason and error (they were scored as null inputs)."""
    for i, failure in refused.items():
        scored.reasons[i], scored.errors[i] = failure.reason, failure.error
    return scored


class TextRunner:
    """Text heads: one string column, decoded and tokenized once per Arrow batch."""

    def __init__(self, head, input_cols: Sequence[str]) -> None:
        (self.text_col,) = input_cols
        self.head = head

    def prepare(self, batch: pa.RecordBatch) -> PreparedTexts:
        texts, refused = decode_texts(batch.column(self.text_col))
        try:
            features = tokenize_present(texts, self.head)
        except Exception:  # one text the tokenizer rejects: find it, keep its neighbours
            self._refuse_untokenizable(texts, refused)
            features = tokenize_present(texts, self.head)
        return PreparedTexts(texts, features, refused)

    def _refuse_untokenizable(self, texts: list[Optional[str]], refused: dict[int, RowFailure]) -> None:
        for i, text in enumerate(texts):
            if text is None:
                continue
            try:
                tokenize_present([text], self.head)
            except Exception as exc:
                texts[i] = None
                refused[i] = RowFailure("prepare_error", f"{type(exc).__name__}: {exc}"[:2000], text)

    def score(self, prepared: PreparedTexts, budget: AdaptiveBudget) -> Scored:
        return _refuse(score_texts(prepared.texts, self.head, budget, prepared.features), prepared.refused)

    def raw_inputs(self, prepared: PreparedTexts, scored: Scored) -> list[Optional[str]]:
        raw = [None if reason is None else prepared.texts[i] for i, reason in enumerate(scored.reasons)]
        for i, failure in prepared.refused.items():
            raw[i] = failure.raw
        return raw


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
