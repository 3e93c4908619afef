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
unit-tested without Spark. This module never imports torch itself (a tensor or
a CUDA error means the head loaded it already), so the driver, which imports it
for the budget defaults, does not pay torch's two-second import.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from lakescore.schemas.reasons import BAD_FEATURE_VALUE, NULL_INPUT, SCORING_ERROR

__all__ = [
    "DEFAULT_MAX_BATCH_TOKENS",
    "default_max_tokens",
    "BatchPolicy",
    "AdaptiveBudget",
    "TextHead",
    "Scored",
    "plan_batches",
    "plan_grouped_batches",
    "padded_cost",
    "row_lengths",
    "take_rows",
    "tokenize_present",
    "score_texts",
    "score_matrix",
    "score_present",
    "prefetch",
    "is_out_of_memory",
]

Features = Mapping[str, Any]
T = TypeVar("T")
R = TypeVar("R")


DEFAULT_MAX_BATCH_TOKENS = {"cpu": 1024, "cuda": 65536}
"""Padded tokens per forward batch when ``scoring.max_batch_tokens`` is unset, per device.

CPU: the fastest budget ``lakescore sweep`` found for a small encoder; throughput falls as the budget
grows, since small batches of equal length keep the activations in cache. Run the sweep for other
models and hardware."""


def default_max_tokens(device: str) -> int:
    """The default token budget for a concrete or configured device (``auto`` plans as CPU)."""
    return DEFAULT_MAX_BATCH_TOKENS.get(device.split(":")[0], DEFAULT_MAX_BATCH_TOKENS["cpu"])


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


def plan_grouped_batches(
    lengths: Sequence[int] | np.ndarray, group_of: np.ndarray, policy: BatchPolicy
) -> list[np.ndarray]:
    """:func:`plan_batches` for rows in groups (``group_of[i]``: row *i*'s group, -1 for none) that run best together
    (prompts sharing a prefix): a group's rows are consecutive, longest first, groups ordered by their longest row,
    and a group that fits a batch of its own is never split across two; the rows in no group follow, longest first,
    never in a batch with grouped rows. The same budget bounds each batch (rows x its longest row, and rows).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    group_of = np.asarray(group_of, dtype=np.int64)
    runs = []
    for g in np.unique(group_of[group_of >= 0]):
        rows = np.flatnonzero(group_of == g)
        runs.append(rows[np.argsort(-lengths[rows], kind="stable")])
    runs.sort(key=lambda rows: -int(lengths[rows[0]]))
    batches: list[np.ndarray] = []
    current: list[int] = []
    longest = 0

    def fits(rows: int, width: int) -> bool:
        return rows <= policy.max_rows and rows * max(1, width) <= policy.max_tokens

    for rows in runs:
        whole = fits(len(rows), int(lengths[rows[0]]))
        if current and whole and not fits(len(current) + len(rows), max(longest, int(lengths[rows[0]]))):
            batches.append(np.asarray(current, dtype=np.int64))
            current, longest = [], 0
        for row in rows.tolist():
            if current and not fits(len(current) + 1, max(longest, int(lengths[row]))):
                batches.append(np.asarray(current, dtype=np.int64))
                current, longest = [], 0
            current.append(row)
            longest = max(longest, int(lengths[row]))
    if current:
        batches.append(np.asarray(current, dtype=np.int64))
    alone = np.flatnonzero(group_of < 0)
    return batches + [alone[rows] for rows in plan_batches(lengths[alone], policy)]


def padded_cost(lengths: Sequence[int] | np.ndarray, batches: Sequence[np.ndarray]) -> int:
    """What the forward batches of :func:`plan_batches` compute on: each batch's rows x its longest row, summed.

    >>> padded_cost([3, 1, 2], plan_batches([3, 1, 2], BatchPolicy(max_tokens=6, max_rows=8)))  # [3, 2] and [1]
    7
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    return int(sum(len(rows) * max(1, int(lengths[rows].max())) for rows in batches if len(rows)))


def take_rows(features: Features, rows: np.ndarray, width: int, padding_side: str = "right") -> dict[str, Any]:
    """The ``rows`` of padded ``features``, padding trimmed to ``width`` tokens.

    Tensors shaped (n, L, ...) are cut to (len(rows), width, ...) on the side the
    padding is on; tensors shaped (n, ...) are cut to their rows; anything else
    (scalars, per-call settings) passes through unchanged. Values may mix array
    libraries (torch tensors for the model, numpy arrays for what a head keeps
    per row, e.g. an object array of the texts); each is indexed in its own, so
    a one-row batch keeps its row axis in both.
    """
    mask = features["attention_mask"]
    n, padded = int(mask.shape[0]), int(mask.shape[1])
    out: dict[str, Any] = {}
    for key, value in features.items():
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) == 0 or int(shape[0]) != n:
            out[key] = value
            continue
        value = value[_as_index(rows, value)]
        if len(shape) >= 2 and int(shape[1]) == padded:
            value = value[:, :width] if padding_side == "right" else value[:, padded - width :]
        out[key] = value
    return out


def tokenize_present(texts: Sequence[str | None], head: TextHead) -> Features | None:
    """The head's tokenization of the non-null ``texts``, in order; ``None`` when all are null.

    What :func:`score_texts` accepts as ``features``, so tokenization can run ahead.
    """
    present = [texts[i] for i in np.flatnonzero(_valid_mask(texts))]
    return head.tokenize(present) if present else None


@dataclass
class Scored:
    """The outcome of scoring ``n`` rows; row *i* of every field belongs to input row *i*.

    ``outputs`` holds zeros where a row was not scored; ``reasons`` holds the
    reason code of every unscored row (``None`` where scored) and ``errors`` the
    error text where one exists.
    """

    outputs: np.ndarray
    reasons: list[str | None]
    errors: list[str | None]

    @property
    def ok(self) -> np.ndarray:
        return np.fromiter((r is None for r in self.reasons), dtype=bool, count=len(self.reasons))


class AdaptiveBudget:
    """A task's token budget, halved (and kept lower) after a CUDA out-of-memory error.

    One instance lives for a task: a batch that runs out of GPU memory is split in
    two and retried, and every later batch of the task is planned with the lower
    budget, so the task does not OOM over and over.
    """

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.halvings = 0

    def halve(self, failed_tokens: int) -> None:
        """Lower the budget to at most half the padded tokens of the batch that ran out of memory.

        A batch planned before an earlier out-of-memory error may be larger than the budget
        already is; its failure says nothing new, so the budget does not compound below half
        of the smallest batch that failed. ``halvings`` counts the times the budget went down.
        """
        lowered = min(self.policy.max_tokens, max(1, failed_tokens // 2))
        if lowered < self.policy.max_tokens:
            self.policy = BatchPolicy(lowered, self.policy.max_rows)
            self.halvings += 1


def score_texts(
    texts: Sequence[str | None],
    head: TextHead,
    policy: BatchPolicy | AdaptiveBudget,
    features: Features | None = None,
) -> Scored:
    """Score ``texts`` through ``head`` in token-budget batches.

    Null texts (``None`` or NaN) are never tokenized; their reason is ``null_input``.
    ``features`` may hold the head's tokenization of the non-null texts, done
    ahead of time (see :func:`prefetch`). Rows whose forward pass fails even
    alone get ``scoring_error`` (see :func:`score_present`).
    """
    valid = _valid_mask(texts)
    if not valid.any():
        return _unscored(len(texts), valid, NULL_INPUT)
    present = tokenize_present(texts, head) if features is None else features
    assert present is not None  # some text is present (checked above), so there is a tokenization
    lengths = row_lengths(present["attention_mask"])

    def take(rows: np.ndarray, width: int):
        return take_rows(present, rows, width, head.padding_side)

    return score_present(valid, lengths, take, head.forward, policy, invalid_reason=NULL_INPUT)


def score_matrix(matrix: np.ndarray, head, policy: BatchPolicy | AdaptiveBudget) -> Scored:
    """Score the rows of a numeric ``matrix`` (rows x features) through ``head.forward``.

    Rows holding a NaN or infinite value are not scored (``bad_feature_value``).
    Batches are cut by ``max_rows`` (every row is one "token" wide).
    """
    matrix = np.asarray(matrix)
    valid = np.isfinite(matrix).all(axis=1) if matrix.ndim == 2 else np.zeros(len(matrix), dtype=bool)
    present = matrix[valid]
    return score_present(
        valid,
        np.ones(len(present), dtype=np.int64),
        lambda rows, width: present[rows],
        head.forward,
        policy,
        invalid_reason=BAD_FEATURE_VALUE,
    )


def score_present(
    valid: np.ndarray,
    lengths: np.ndarray,
    take: Callable[[np.ndarray, int], Any],
    forward: Callable[[Any], np.ndarray],
    policy: BatchPolicy | AdaptiveBudget,
    *,
    invalid_reason: str,
    error_reason: str = SCORING_ERROR,
    plan: Callable[[np.ndarray, BatchPolicy], list[np.ndarray]] = plan_batches,
) -> Scored:
    """The core every head scores through: plan, run, retry, scatter back.

    ``valid[i]`` says whether input row *i* can be scored; ``lengths`` holds the
    token length of each valid row in order and ``take(rows, width)`` builds the
    batch of those valid rows trimmed to ``width`` tokens. A batch whose forward
    pass runs out of CUDA memory is split in two and the budget halved for the
    rest of the task; a batch that raises anything else is retried row by row,
    so one poisoned row cannot take its neighbours with it (its reason is
    ``error_reason``, with the exception text). ``plan(lengths, policy)`` cuts the batches (default
    :func:`plan_batches`).
    """
    budget = policy if isinstance(policy, AdaptiveBudget) else AdaptiveBudget(policy)
    n = len(valid)
    present = np.flatnonzero(valid)
    reasons: list[str | None] = [None if ok else invalid_reason for ok in valid]
    errors: list[str | None] = [None] * n
    outputs: np.ndarray | None = None

    def run(rows: np.ndarray) -> None:
        nonlocal outputs
        width = max(1, int(lengths[rows].max()))
        error: str | None
        try:
            scored = np.asarray(forward(take(rows, width)))
        except Exception as exc:
            out_of_memory, error = is_out_of_memory(exc), f"{type(exc).__name__}: {exc}"[:2000]
        else:
            out_of_memory, error = False, None
        # Retries run after the except block has ended: until then the exception's traceback holds the failed
        # forward's frames, and with them its activations on the GPU, so every retry would run out of memory too.
        if error is not None:
            if out_of_memory and len(rows) > 1:
                _release_cuda_cache()
                budget.halve(len(rows) * width)
                half = len(rows) // 2
                run(rows[:half])
                run(rows[half:])
            elif len(rows) > 1:
                for row in rows:
                    run(rows[rows == row])
            else:
                reasons[present[rows[0]]] = error_reason
                errors[present[rows[0]]] = error
            return
        if scored.shape[0] != len(rows):
            raise ValueError(f"head returned {scored.shape[0]} rows for a batch of {len(rows)}")
        if outputs is None:
            outputs = np.zeros((n,) + scored.shape[1:], dtype=scored.dtype)
        outputs[present[rows]] = scored

    for rows in plan(lengths, budget.policy):
        run(rows)
    if outputs is None:
        outputs = np.zeros((n, 0), dtype=np.float32)
    return Scored(outputs, reasons, errors)


def _unscored(n: int, valid: np.ndarray, reason: str) -> Scored:
    return Scored(np.zeros((n, 0), dtype=np.float32), [None if ok else reason for ok in valid], [None] * n)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an out-of-memory error: torch's CUDA one, Python's ``MemoryError``, or an allocator's message."""
    torch = sys.modules.get("torch")
    oom = getattr(torch.cuda, "OutOfMemoryError", None) if torch is not None else None
    return (
        (oom is not None and isinstance(exc, oom))
        or isinstance(exc, MemoryError)
        or "out of memory" in str(exc).lower()
    )


def _release_cuda_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


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


def _valid_mask(texts: Sequence[Any]) -> np.ndarray:
    """True where a text can be scored: a string, or a ``(text, text_pair)`` tuple (null arrives as ``None`` or NaN)."""
    return np.fromiter((isinstance(t, (str, tuple)) for t in texts), dtype=bool, count=len(texts))


def row_lengths(mask) -> np.ndarray:
    """Tokens per row of an ``attention_mask`` (numpy or torch), as int64."""
    sums = mask.sum(1)
    return np.asarray(sums.numpy() if hasattr(sums, "numpy") else sums, dtype=np.int64)


def _as_index(rows: np.ndarray, like):
    """Row indices in the array library of ``like``: a tensor for a torch tensor (which indexes best with one),
    the numpy array otherwise (numpy reads a one-element tensor as a scalar index and would drop the row axis)."""
    torch = sys.modules.get("torch")  # a tensor implies torch is imported already
    return torch.as_tensor(rows, dtype=torch.long) if torch is not None and isinstance(like, torch.Tensor) else rows
