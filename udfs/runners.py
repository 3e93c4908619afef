"""Runners: how one Arrow batch of a task's input columns becomes model input, scores and raw inputs.

A runner sits between an Arrow batch and the batching core (:mod:`lakescore.udfs.batching`):
``prepare`` turns the batch into what the head takes (decoded and tokenized text, or a float
matrix) and may run ahead in a thread; ``score`` runs the core with the task's token budget;
``raw_inputs`` gives the input of every row that could not be scored, as text for the errors
table; a runner whose head reads and writes tokens (generation) also counts them (:class:`CountsTokens`).
One runner per input kind (:mod:`lakescore.udfs.registry`), never per task.

Preparation fails per row, never per batch: a text that is not valid UTF-8 (Parquet and Spark
accept such bytes) is ``invalid_text``, a text the tokenizer rejects is ``prepare_error``, an image
that is null, undecodable or too large is ``null_input`` / ``invalid_image`` / ``image_too_large``
(:mod:`lakescore.udfs.images`), an image file that is not there ``missing_file``; the other rows of the batch are
scored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakescore.schemas.reasons import INVALID_TEXT, MISSING_FILE, NULL_INPUT, PREPARE_ERROR, RowFailure
from lakescore.schemas.traffic import Traffic
from lakescore.udfs.batching import (
    AdaptiveBudget,
    BatchPolicy,
    Scored,
    row_lengths,
    score_matrix,
    score_present,
    score_texts,
    tokenize_present,
)
from lakescore.udfs.heads.protocol import (
    ImageInputHead,
    ImagePromptHead,
    MatrixHead,
    PreparesBatches,
    PromptHead,
    TextHead,
)
from lakescore.udfs.images import (
    DEFAULT_MAX_BATCH_IMAGES,
    DEFAULT_MAX_BATCH_PIXELS,
    Preprocessed,
    describe_image,
    image_tokens,
    pixel_limit,
    preprocess_chunks,
    row_index,
)

__all__ = [
    "RowFailure",
    "PreparedTexts",
    "PreparedPrompts",
    "PreparedImages",
    "TextRunner",
    "PromptRunner",
    "MatrixRunner",
    "ImageRunner",
    "ImagePromptRunner",
    "decode_texts",
    "CountsTokens",
]


@runtime_checkable
class CountsTokens(Protocol):
    """A runner whose rows each are one generation or request: it counts a batch's prompt tokens read (and among them
    those read from a server's prompt cache) and tokens generated from its scored rows (the others' tokens, where
    any, are what the server's ``usage`` reported)."""

    def token_traffic(self, scored: Scored) -> Traffic: ...


@dataclass
class PreparedTexts:
    """A text batch ready to score: the texts (``None`` where null or refused; a ``(text, text_pair)`` tuple per row
    for pairs), their tokenization, refused rows, and for pairs each row's raw input (both sides, as JSON)."""

    texts: list[Any]
    features: Any
    refused: dict[int, RowFailure] = field(default_factory=dict)
    shown: list[str] | None = None


def _present(texts: Sequence[str | None], rows: Sequence[int]) -> list[str]:
    """The texts at ``rows``, rows the caller chose for holding a string (a null among them is left out)."""
    return [text for text in (texts[i] for i in rows) if text is not None]


def decode_texts(column: pa.Array) -> tuple[list[str | None], dict[int, RowFailure]]:
    """The strings of ``column``, decoded per row: invalid UTF-8 becomes ``None`` plus an ``invalid_text`` failure.

    The failure's raw input shows the bytes with Python's ``backslashreplace`` escapes (``\\xff``).
    Valid columns take Arrow's own conversion (one call, no per-row Python decode).
    """
    try:
        return column.to_pylist(), {}
    except UnicodeDecodeError:
        pass
    binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
    texts: list[str | None] = []
    refused: dict[int, RowFailure] = {}
    for i, value in enumerate(column.view(binary).to_pylist()):
        try:
            texts.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError as exc:
            texts.append(None)
            refused[i] = RowFailure(INVALID_TEXT, f"not valid UTF-8: {exc}", value.decode("utf-8", "backslashreplace"))
    return texts, refused


def refuse_untokenizable(
    texts: list[Any],
    refused: dict[int, RowFailure],
    tokenize_one: Callable[[int], Any],
    shown: Sequence[str] | None = None,
) -> None:
    """Try ``tokenize_one(i)`` on each present text alone; one that raises becomes ``None`` in ``texts`` and a
    ``prepare_error`` in ``refused`` (its raw input ``shown[i]``, else the text), so the batch can be tokenized again
    without it."""
    for i, text in enumerate(texts):
        if text is None:
            continue
        try:
            tokenize_one(i)
        except Exception as exc:
            texts[i] = None
            refused[i] = RowFailure.of(PREPARE_ERROR, exc, text if shown is None else shown[i])


def _refuse(scored: Scored, refused: Mapping[int, Any]) -> Scored:
    """``scored`` with each refused row's own reason and error (they were scored as null inputs)."""
    for i, failure in refused.items():
        scored.reasons[i], scored.errors[i] = failure.reason, failure.error
    return scored


def pair_texts(
    first: pa.Array, second: pa.Array, names: Sequence[str]
) -> tuple[list[Any], dict[int, RowFailure], list[str]]:
    """Each row's ``(text, text_pair)`` from two string columns, ``None`` where either side is null, empty or refused
    (``null_input``, or ``invalid_text`` for bytes that are not UTF-8), and each row's raw input: both sides as a JSON
    object keyed by ``names`` (a null side left out, as Spark's ``to_json`` writes it)."""
    (left, left_refused), (right, right_refused) = decode_texts(first), decode_texts(second)
    shown = [_json_object(names, sides) for sides in zip(left, right)]
    refused: dict[int, RowFailure] = {}
    for i in sorted({*left_refused, *right_refused}):
        failure = left_refused.get(i) or right_refused[i]
        sides = (
            left_refused[i].raw if i in left_refused else left[i],
            right_refused[i].raw if i in right_refused else right[i],
        )
        refused[i] = dataclasses.replace(failure, raw=_json_object(names, sides))
    texts = [(a, b) if a and b and i not in refused else None for i, (a, b) in enumerate(zip(left, right))]
    return texts, refused, shown


class TextRunner:
    """Text heads: one string column, or two read as pairs (``text_pair_col``), decoded and tokenized once per Arrow
    batch. A pair goes to the tokenizer as ``(text, text_pair)``, as the text-classification pipeline passes
    ``{"text": ..., "text_pair": ...}``: one sequence with the model's separator, its tokens counted whole by the
    token budget and truncated longest side first."""

    def __init__(self, head: TextHead | PreparesBatches, input_cols: Sequence[str]) -> None:
        self.text_col, *pair = input_cols
        self.pair_col = pair[0] if pair else None
        self.head = head
        # a head that prepares and scores its rows itself: one that makes many rows of one text (embed.chunk: a
        # document, its chunks, which go through the same batching core, lakescore.udfs.chunking), or one whose rows
        # are requests of many texts to a server (lakescore.udfs.remote.embed)
        self.preparing_head: PreparesBatches | None = head if isinstance(head, PreparesBatches) else None

    def prepare(self, batch: pa.RecordBatch) -> PreparedTexts:
        shown = None
        if self.pair_col is None:
            texts, refused = decode_texts(batch.column(self.text_col))
        else:
            texts, refused, shown = pair_texts(
                batch.column(self.text_col), batch.column(self.pair_col), (self.text_col, self.pair_col)
            )
        if self.preparing_head is not None:
            return self.preparing_head.prepare(texts, refused)
        try:
            features = tokenize_present(texts, self.head)
        except Exception:  # one text the tokenizer rejects: find it, keep its neighbours
            refuse_untokenizable(texts, refused, lambda i: tokenize_present([texts[i]], self.head), shown)
            features = tokenize_present(texts, self.head)
        return PreparedTexts(texts, features, refused, shown)

    def score(self, prepared: PreparedTexts, budget: AdaptiveBudget) -> Scored:
        if self.preparing_head is not None:
            return _refuse(self.preparing_head.score_prepared(prepared, budget), prepared.refused)
        return _refuse(score_texts(prepared.texts, self.head, budget, prepared.features), prepared.refused)

    def row_costs(self, prepared: PreparedTexts) -> np.ndarray:
        """Tokens of each row to score, as the batching core plans them (``lakescore plan`` counts with this; a
        chunked run's rows are its chunks)."""
        return _no_rows() if prepared.features is None else row_lengths(prepared.features["attention_mask"])

    def raw_inputs(self, prepared: PreparedTexts, scored: Scored) -> list[str | None]:
        shown = prepared.shown if prepared.shown is not None else prepared.texts
        raw = [None if reason is None else shown[i] for i, reason in enumerate(scored.reasons)]
        for i, failure in prepared.refused.items():
            raw[i] = failure.raw
        return raw


class MatrixRunner:
    """Tabular heads: numeric feature columns as one float64 matrix (nulls become NaN)."""

    def __init__(self, head: MatrixHead, input_cols: Sequence[str]) -> None:
        self.head, self.feature_cols = head, tuple(input_cols)

    def prepare(self, batch: pa.RecordBatch) -> np.ndarray:
        columns = [
            pc.cast(batch.column(name), pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)
            for name in self.feature_cols
        ]
        return np.column_stack(columns) if columns else np.zeros((batch.num_rows, 0))

    def score(self, matrix: np.ndarray, budget: AdaptiveBudget) -> Scored:
        return score_matrix(matrix, self.head, budget)

    def row_costs(self, matrix: np.ndarray) -> np.ndarray:
        """One per row to score (batches are cut by rows)."""
        return np.ones(int(np.isfinite(matrix).all(axis=1).sum()) if matrix.ndim == 2 else 0, dtype=np.int64)

    def raw_inputs(self, matrix: np.ndarray, scored: Scored) -> list[str | None]:
        return [
            None if reason is None else json.dumps(dict(zip(self.feature_cols, (_json_number(v) for v in matrix[i]))))
            for i, reason in enumerate(scored.reasons)
        ]


@dataclass
class PreparedPrompts:
    """A prompt batch ready to generate from: the prompts (``None`` where null or refused), each row's key, their
    tokenization, refused rows."""

    prompts: list[str | None]
    keys: list[str]
    features: Any
    refused: dict[int, RowFailure] = field(default_factory=dict)


class PromptRunner:
    """Generation heads (:mod:`lakescore.udfs.heads.generate`): one string column of rendered prompts, and the row's id
    (``key_col``) as the key its sampling generator is seeded from, so a row draws the same text in any batch."""

    def __init__(self, head: PromptHead, input_cols: Sequence[str], *, key_col: str | None = None) -> None:
        (self.prompt_col,) = input_cols
        self.head, self.key_col = head, key_col

    def prepare(self, batch: pa.RecordBatch) -> PreparedPrompts:
        prompts, refused = decode_texts(batch.column(self.prompt_col))
        # Without a key column a row's prompt is its key; a null prompt's key is never read (the row is not generated).
        keys = (
            ["" if k is None else str(k) for k in batch.column(self.key_col).to_pylist()]
            if self.key_col
            else ["" if p is None else p for p in prompts]
        )
        present = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        try:
            features = self.head.tokenize(_present(prompts, present), [keys[i] for i in present]) if present else None
        except Exception:  # one prompt the tokenizer (or chat template) rejects: find it, keep its neighbours
            refuse_untokenizable(prompts, refused, lambda i: self.head.tokenize(_present(prompts, [i]), [keys[i]]))
            present = [i for i in present if prompts[i] is not None]
            features = self.head.tokenize(_present(prompts, present), [keys[i] for i in present]) if present else None
        return PreparedPrompts(prompts, keys, features, refused)

    def score(self, prepared: PreparedPrompts, budget: AdaptiveBudget) -> Scored:
        # the head's own scoring: in-process generation, or requests to an endpoint or served engine
        return _refuse(
            self.head.score_prompts(prepared.prompts, budget, prepared.keys, prepared.features), prepared.refused
        )

    def row_costs(self, prepared: PreparedPrompts) -> np.ndarray:
        """Each prompt's tokens plus the tokens it may generate, as the generation batches are planned."""
        return (
            _no_rows()
            if prepared.features is None
            else np.asarray(self.head.row_cost(prepared.features), dtype=np.int64)
        )

    def raw_inputs(self, prepared: PreparedPrompts, scored: Scored) -> list[str | None]:
        raw = [None if reason is None else prepared.prompts[i] for i, reason in enumerate(scored.reasons)]
        for i, failure in prepared.refused.items():
            raw[i] = failure.raw
        return raw

    def token_traffic(self, scored: Scored) -> Traffic:
        """Prompt tokens read, those read from a prompt cache, and tokens generated over the batch's scored rows."""
        from lakescore.udfs.heads.generate import token_traffic

        return token_traffic(scored.outputs, scored.ok)


@dataclass
class PreparedImages:
    """An image batch ready to score: the encoded values (``None`` where null) and their preprocessing, and the path
    each was read from (``None``: a binary column)."""

    values: list[memoryview | None]
    images: Preprocessed
    paths: list[str | None] | None = None


def image_bytes(column: pa.Array, name: str) -> list[memoryview | None]:
    """The encoded images of a binary column, one read-only view of the column's own buffer (or ``None``) per row;
    ``TypeError`` for other types. Views, not copies: a batch of big images is held once, by the Arrow batch."""
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise TypeError(f"image column {name!r} is {column.type}; image tasks read encoded image bytes (binary)")
    data = column.buffers()[2]
    buffer = memoryview(data if data is not None else b"")
    width = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    # positions in the data buffer, of this (maybe sliced) array's rows only
    offsets = np.frombuffer(column.buffers()[1], dtype=width)[column.offset : column.offset + len(column) + 1]
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [buffer[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(column))]


class ImageRunner:
    """Image heads: one binary column of encoded images, decoded and preprocessed per Arrow batch in chunks bounded
    by decoded pixels and rows (:func:`~lakescore.udfs.images.preprocess_chunks`), then scored in batches cut by the
    token budget, each image counting its patches (:func:`~lakescore.udfs.images.image_tokens`).
    A second input column, when given, holds the path each image was read from
    (``lakescore.jobs.steps.read.read_image_files``):
    a null image with a path is ``missing_file``, and the errors table shows the path.

    ``max_image_pixels``: the pixels one image may have (default Pillow's limit); ``max_batch_pixels`` and
    ``max_batch_images``: what one preprocessing chunk holds at most.
    """

    def __init__(
        self,
        head: ImageInputHead,
        input_cols: Sequence[str],
        *,
        max_image_pixels: int | None = None,
        max_batch_pixels: int = DEFAULT_MAX_BATCH_PIXELS,
        max_batch_images: int = DEFAULT_MAX_BATCH_IMAGES,
    ) -> None:
        self.image_col, *path_col = input_cols
        self.path_col = path_col[0] if path_col else None
        self.head = head
        self.limit = pixel_limit(max_image_pixels)
        self.chunk_policy = BatchPolicy(max_batch_pixels, max_batch_images)

    def prepare(self, batch: pa.RecordBatch) -> PreparedImages:
        values = image_bytes(batch.column(self.image_col), self.image_col)
        images = preprocess_chunks(values, self.head.preprocess, self.limit, self.chunk_policy)
        if self.path_col is None:
            return PreparedImages(values, images)
        paths = batch.column(self.path_col).to_pylist()
        for i, (value, path) in enumerate(zip(values, paths)):
            if value is None and path is not None:
                images.failures[i] = RowFailure(MISSING_FILE, f"no file at {path}")
        return PreparedImages(values, images, paths)

    def score(self, prepared: PreparedImages, budget: AdaptiveBudget) -> Scored:
        # The processor gives every image one shape, so every row costs the same tokens (:func:`image_tokens`), and the
        # budget cuts batches of equal rows (as it halves after an out-of-memory error too).
        images = prepared.images
        present = np.flatnonzero(images.ok)

        def take(rows: np.ndarray, width: int):
            return {"pixel_values": images.pixel_values[row_index(present[rows], images.pixel_values)]}

        scored = score_present(
            images.ok, self._costs(images, len(present)), take, self.head.forward, budget, invalid_reason=NULL_INPUT
        )
        return _refuse(scored, images.failures)

    def row_costs(self, prepared: PreparedImages) -> np.ndarray:
        """Each image to score's tokens (:func:`~lakescore.udfs.images.image_tokens`; every image has one shape)."""
        return self._costs(prepared.images, int(np.count_nonzero(prepared.images.ok)))

    @staticmethod
    def _costs(images: Preprocessed, rows: int) -> np.ndarray:
        return np.full(rows, image_tokens(images.pixel_values), dtype=np.int64)

    def raw_inputs(self, prepared: PreparedImages, scored: Scored) -> list[str | None]:
        if prepared.paths is not None:
            return [None if reason is None else prepared.paths[i] for i, reason in enumerate(scored.reasons)]
        headers = prepared.images.headers
        return [
            None if reason is None else describe_image(prepared.values[i], headers.get(i))
            for i, reason in enumerate(scored.reasons)
        ]


@dataclass
class PreparedImagePrompts:
    """An (image, prompt) batch ready to generate from: each row's prompt (``None`` where it or its image failed), key
    and raw input as the errors table shows it, the head's features of the rows that run, and the refused rows."""

    prompts: list[str | None]
    keys: list[str]
    raw: list[str | None]
    features: Any
    refused: dict[int, RowFailure] = field(default_factory=dict)


class ImagePromptRunner:
    """Generation over images (:mod:`lakescore.udfs.heads.image_prompts`): a binary column of encoded images, then
    (optionally) the path each was read from, then the rendered prompt; the row's id (``key_col``) seeds its sampling.

    Each row's image is checked (header), decoded and processed with its prompt by the model's processor alone, then
    dropped, so one batch holds one decoded image at a time; an image that fails is that row's dead letter, with the
    image tasks' reasons (:mod:`lakescore.udfs.images`: ``null_input``, ``invalid_image``, ``image_too_large``,
    ``missing_file``, and ``prepare_error`` for one the processor rejects). ``max_image_pixels``: as the image tasks'.
    A remote head (:mod:`lakescore.udfs.remote.image_prompts`) takes the file's bytes with the decoded image, and sends
    them rather than processing them.
    """

    def __init__(
        self,
        head: ImagePromptHead,
        input_cols: Sequence[str],
        *,
        key_col: str | None = None,
        max_image_pixels: int | None = None,
    ) -> None:
        self.image_col, *middle, self.prompt_col = input_cols
        self.path_col = middle[0] if middle else None
        self.head, self.key_col = head, key_col
        self.limit = pixel_limit(max_image_pixels)

    def prepare(self, batch: pa.RecordBatch) -> PreparedImagePrompts:
        from lakescore.udfs.images import decode_image, read_header

        values = image_bytes(batch.column(self.image_col), self.image_col)
        prompts, refused = decode_texts(batch.column(self.prompt_col))
        paths = batch.column(self.path_col).to_pylist() if self.path_col else [None] * len(values)
        keys = (
            ["" if k is None else str(k) for k in batch.column(self.key_col).to_pylist()]
            if self.key_col
            else ["" if p is None else p for p in prompts]
        )
        raw: list[str | None] = []
        rows, present = [], []
        for i, (value, prompt, path) in enumerate(zip(values, prompts, paths)):
            header, failure = read_header(value, self.limit)
            raw.append(path if path is not None else describe_image(value, header))
            if value is None and path is not None:
                failure = RowFailure(MISSING_FILE, f"no file at {path}")
            if i in refused or prompt is None:
                continue
            image = decode_image(value) if failure is None else failure
            if isinstance(image, RowFailure):
                refused[i] = dataclasses.replace(image, raw=raw[i])
                continue
            try:
                rows.append(self.head.process(image, prompt, value))  # a remote head sends the bytes as read
            except Exception as exc:  # the processor (or chat template) rejects this row: its neighbours run
                refused[i] = RowFailure.of(PREPARE_ERROR, exc, raw[i])
                continue
            finally:
                del image
            present.append(i)
        running = set(present)
        runs = [prompts[i] if i in running else None for i in range(len(values))]
        features = self.head.prepare(rows, [keys[i] for i in present]) if present else None
        return PreparedImagePrompts(runs, keys, raw, features, refused)

    def score(self, prepared: PreparedImagePrompts, budget: AdaptiveBudget) -> Scored:
        return _refuse(
            self.head.score_prompts(prepared.prompts, budget, prepared.keys, prepared.features), prepared.refused
        )

    def row_costs(self, prepared: PreparedImagePrompts) -> np.ndarray:
        """Each row's tokens (its image's tokens as the processor expands them, and its prompt's) plus the tokens it
        may generate, as the generation batches are planned."""
        return (
            _no_rows()
            if prepared.features is None
            else np.asarray(self.head.row_cost(prepared.features), dtype=np.int64)
        )

    def raw_inputs(self, prepared: PreparedImagePrompts, scored: Scored) -> list[str | None]:
        return [None if reason is None else prepared.raw[i] for i, reason in enumerate(scored.reasons)]

    def token_traffic(self, scored: Scored) -> Traffic:
        """Prompt tokens read (image tokens included), those read from a prompt cache, and tokens generated over
        the batch's scored rows."""
        from lakescore.udfs.heads.generate import token_traffic

        return token_traffic(scored.outputs, scored.ok)


def _json_object(names: Sequence[str], values: Sequence[str | None]) -> str:
    """``values`` as one JSON object keyed by ``names``, nulls left out, written as Spark's ``to_json`` writes it."""
    return json.dumps({n: v for n, v in zip(names, values) if v is not None}, ensure_ascii=False, separators=(",", ":"))


def _no_rows() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _json_number(value: float) -> Any:
    return value if np.isfinite(value) else str(value)  # JSON has no NaN / Infinity
