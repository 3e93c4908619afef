"""Length-bucketed, token-budget batching: the core every text task head scores through.

Rows arrive in table order, where a 1,500-word review sits next to a one-liner
and a fixed-size batch is padded to its longest row. This module

1. tokenizes each incoming Arrow batch once (the head's tokenizer, padded to
   that batch's longest row, truncated at the model's limit),
2. orders rows by token length, longest first (as ``SentenceTransformer.encode``
   orders by characters),
3. cuts consecutive runs into forward batches bounded by a **token budget**
   (rows x longest row, i.e. the padded tokens the model computes on) and a row
   cap, trimming each batch's padding to its own longest row,
4. scatters the outputs back, so output row *i* always belongs to input row *i*.

Short rows therefore go through in large batches and long rows in small ones,
with almost no padding either way. Pure Python / numpy / torch tensors:
unit-tested without Spark.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Protocol, Sequence, TypeVar

import numpy as np
import torch

__all__ = ["BatchPolicy", "TextHead", "plan_batches", "take_rows", "tokenize_present", "score_texts", "prefetch"]

Features = Mapping[str, Any]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class BatchPolicy:
    """Bounds of one forward batch: padded tokens (rows x longest row) and rows."""

    max_tokens: int
    max_rows: int

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_rows < 1:
            raise ValueError(f"max_tokens and max_rows must be >= 1, got {self.max_tokens} and {self.max_rows}")


class TextHead(Protocol):
    """What a task head provides to the core: tokenization and a forward pass."""

    padding_side: str
    """``right`` (BERT-like) or ``left`` (many decoder models): where padding sits in a row."""

    def tokenize(self, texts: list[str]) -> Features:
        """Tokenize ``texts`` padded to their longest row; must include ``attention_mask`` of shape (n, L)."""

    def forward(self, features: Features) -> np.ndarray:
        """Outputs for a batch of tokenized rows, one row of outputs per input row."""


def plan_batches(lengths: Sequence[int] | np.ndarray, policy: BatchPolicy) -> list[np.ndarray]:
    """Split row indices into forward batches, longest rows first.

    Each batch holds consecutive rows of the length order, as many as fit
    ``rows * longest <= max_tokens`` and ``rows <= max_rows`` (at least one
    row, so a row longer than the budget still runs, alone).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(1, int(lengths[order[start]]))
        rows = max(1, min(policy.max_rows, policy.max_tokens // longest))
        batches.append(order[start : start + rows])
        start += rows
    return batches


def take_rows(features: Features, rows: np.ndarray, width: int, padding_side: str = "right") -> dict[str, Any]:
    """The ``rows`` of padded ``features``, padding trimmed to ``width`` tokens.

    Tensors shaped (n, L, ...) are cut to (len(rows), width, ...) on the side the
    padding is on; tensors shaped (n, ...) are cut to their rows; anything else
    (scalars, per-call settings) passes through unchanged.
    """
    mask = features["attention_mask"]
    n, padded = int(mask.shape[0]), int(mask.shape[1])
    index = _as_index(rows, mask)
    out: dict[str, Any] = {}
    for key, value in features.items():
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) == 0 or int(shape[0]) != n:
            out[key] = value
            continue
        value = value[index]
        if len(shape) >= 2 and int(shape[1]) == padded:
            value = value[:, :width] if padding_side == "right" else value[:, padded - width :]
        out[key] = value
    return out


def tokenize_present(texts: Sequence[Optional[str]], head: TextHead) -> Optional[Features]:
    """The head's tokenization of the non-null ``texts``, in order; ``None`` when all are null.

    What :func:`score_texts` accepts as ``features``, so tokenization can run ahead.
    """
    present = [texts[i] for i in np.flatnonzero(_valid_mask(texts))]
    return head.tokenize(present) if present else None


def score_texts(
    texts: Sequence[Optional[str]], head: TextHead, policy: BatchPolicy, features: Optional[Features] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Score ``texts`` through ``head`` in token-budget batches; return ``(outputs, valid)``.

    ``outputs[i]`` belongs to ``texts[i]``. ``valid`` is False where the text was null
    (``None`` or NaN); such rows are never tokenized and their output row is zeros.
    ``features`` may hold the head's tokenization of the non-null texts, done
    ahead of time (see :func:`prefetch`).

    Raises ``ValueError`` if the head returns the wrong number of rows.
    """
    valid = _valid_mask(texts)
    present = np.flatnonzero(valid)
    if len(present) == 0:
        return np.zeros((len(texts), 0), dtype=np.float32), valid
    if features is None:
        features = tokenize_present(texts, head)
    lengths = _row_lengths(features["attention_mask"])

    outputs: Optional[np.ndarray] = None
    for rows in plan_batches(lengths, policy):
        batch = take_rows(features, rows, max(1, int(lengths[rows[0]])), head.padding_side)
        scored = np.asarray(head.forward(batch))
        if scored.shape[0] != len(rows):
            raise ValueError(f"head returned {scored.shape[0]} rows for a batch of {len(rows)} texts")
        if outputs is None:
            outputs = np.zeros((len(texts),) + scored.shape[1:], dtype=scored.dtype)
        outputs[present[rows]] = scored
    return outputs, valid


def prefetch(items: Iterable[T], work: Callable[[T], R]) -> Iterator[tuple[T, R]]:
    """Yield ``(item, work(item))``, computing the next item's ``work`` in a thread meanwhile.

    Used to tokenize the next Arrow batch while the model runs on the current one:
    fast tokenizers and torch both release the GIL, so the two overlap when the
    task has more than one CPU (and always on GPU). Exceptions surface in order.
    """
    iterator = iter(items)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakescore-prefetch") as pool:
        try:
            item = next(iterator)
        except StopIteration:
            return
        pending = pool.submit(work, item)
        while True:
            try:
                following = next(iterator)
            except StopIteration:
                yield item, pending.result()
                return
            result = pending.result()
            pending = pool.submit(work, following)
            yield item, result
            item = following


def _valid_mask(texts: Sequence[Optional[str]]) -> np.ndarray:
    """True where a text can be scored: a string (null arrives as ``None`` or NaN)."""
    return np.fromiter((isinstance(t, str) for t in texts), dtype=bool, count=len(texts))


def _row_lengths(mask) -> np.ndarray:
    sums = mask.sum(1)
    return np.asarray(sums.numpy() if hasattr(sums, "numpy") else sums, dtype=np.int64)


def _as_index(rows: np.ndarray, like):
    """Row indices in the array library of ``like`` (torch tensors index best with a tensor)."""
    return torch.as_tensor(rows, dtype=torch.long) if isinstance(like, torch.Tensor) else rows
