"""The chunker that turns one document into many rows: token windows of a long text, as character spans.

A document is split by the embedding model's own (fast) tokenizer into windows of at most ``max_tokens`` tokens,
counted as the model reads a chunk: its special tokens and the model's prompt included, so no chunk is truncated
when it is embedded. Consecutive windows share ``overlap_tokens`` tokens; a text that fits is one chunk. Each chunk
is a character span ``(start, end)`` of the text, so ``text[start:end]`` is the chunk and its vector is what
sentence-transformers' ``encode`` gives that substring. Windows begin and end at word boundaries (the tokenizer's
pre-tokenized words) unless a word is longer than a window, so a chunk reads as the same tokens it has in the whole
text, and consecutive chunks share ``overlap_tokens`` tokens or the rest of the word they cut. The spans cover every
character: the characters between two tokens (spaces, characters the tokenizer drops) belong to the chunk before
them, the text's leading characters to the first chunk, its trailing ones to the last.

Pure Python over the ``tokenizers`` backend: unit-tested without Spark, run per document in a worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from lakescore.schemas.reasons import CHUNK_TOO_SMALL, NULL_INPUT, PREPARE_ERROR, TOO_MANY_CHUNKS, RowFailure
from lakescore.udfs.arrow_columns import list_column
from lakescore.udfs.batching import AdaptiveBudget, Scored, TextHead

if TYPE_CHECKING:
    pass

__all__ = [
    "ChunkError",
    "TooManyChunks",
    "Chunker",
    "Span",
    "DocumentChunks",
    "PreparedDocuments",
    "ChunkedEmbedder",
    "chunked_embedder",
    "prepare_documents",
    "embed_documents",
]

Span = tuple[int, int]


@runtime_checkable
class ChunkableEmbedder(TextHead, Protocol):
    """What chunking reads of an embedder besides the text head: the tokenizer the windows are cut with, the tokens
    the model reads (``max_seq_length``) and the prompt prepended to every text (a
    :class:`~lakescore.udfs.heads.embed.SentenceEmbedder`)."""

    tokenizer: Any
    max_seq_length: int
    prompt: str


"""A chunk as ``(start, end)`` character offsets into its text."""


class ChunkError(ValueError):
    """A document no window of ``max_tokens`` fits (its special tokens and prompt leave no room for the text's next
    token): dead-lettered ``chunk_too_small``; the reason code of its dead letter is :attr:`reason`."""

    reason = CHUNK_TOO_SMALL


class TooManyChunks(ChunkError):
    """A document that would make more chunks than ``max_chunks``: dead-lettered, never truncated."""

    reason = TOO_MANY_CHUNKS


@dataclass(frozen=True)
class Chunker:
    """Split texts into token windows of the tokenizer ``tokenizer`` (a transformers fast tokenizer).

    ``max_tokens``: the most tokens one chunk is read as (special tokens and ``prompt`` included);
    ``overlap_tokens``: tokens two consecutive chunks share (below the tokens a window holds of the text);
    ``max_chunks``: the most chunks one document may make (:class:`TooManyChunks` beyond, found before any window
    is built, so a huge text costs one tokenization).
    """

    tokenizer: Any
    max_tokens: int
    overlap_tokens: int = 0
    max_chunks: int = 1000
    prompt: str = ""

    def __post_init__(self) -> None:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                "embed.chunk needs the model's fast (tokenizers) tokenizer, for the character offsets of its tokens"
            )
        from tokenizers import Tokenizer

        # a copy that neither truncates nor pads (a tokenizer.json may carry either): every token of the text counts
        copy = Tokenizer.from_str(backend.to_str())
        copy.no_truncation()
        copy.no_padding()
        object.__setattr__(self, "_backend", copy)
        if self.window < 1:
            raise ValueError(
                f"embed.chunk.max_tokens {self.max_tokens} leaves no token of text once the model's "
                f"{self.fixed_tokens} special and prompt tokens are counted; raise it"
            )
        if not 0 <= self.overlap_tokens < self.window:
            raise ValueError(
                f"embed.chunk.overlap_tokens must be below the {self.window} text tokens a chunk holds (max_tokens "
                f"{self.max_tokens} less {self.fixed_tokens} special and prompt tokens), got {self.overlap_tokens}"
            )

    @property
    def fixed_tokens(self) -> int:
        """Tokens every chunk is read with besides its text: the special tokens and the prompt's own."""
        specials = self.tokenizer.num_special_tokens_to_add(pair=False)
        prompt = len(self._backend.encode(self.prompt, add_special_tokens=False).ids) if self.prompt else 0
        return specials + prompt

    @property
    def window(self) -> int:
        """Tokens of text a chunk holds at most."""
        return self.max_tokens - self.fixed_tokens

    def count(self, tokens: int) -> int:
        """Chunks a text of ``tokens`` tokens makes (before any window is shortened at a character boundary)."""
        if tokens <= self.window:
            return 1
        return 1 + math.ceil((tokens - self.window) / (self.window - self.overlap_tokens))

    def spans(self, text: str) -> list[Span]:
        """The chunks of ``text`` as character spans, in order: each read as at most ``max_tokens`` tokens, together
        covering every character (an empty text is one empty chunk). Raises :class:`TooManyChunks` past
        ``max_chunks``, :class:`ChunkError` for a text no window of which fits."""
        encoding = self._backend.encode(text, add_special_tokens=False)
        offsets, words = encoding.offsets, encoding.word_ids
        n = len(offsets)
        if self.count(n) > self.max_chunks:
            raise TooManyChunks(
                f"{n} tokens make {self.count(n)} chunks of {self.max_tokens} tokens, over embed.chunk.max_chunks "
                f"{self.max_chunks}"
            )
        if n <= self.window and self._fits(text):  # the common case: one chunk, the whole text
            return [(0, len(text))]
        spans: list[Span] = []
        first = 0

        def word_start(k: int) -> int:
            """The first token of token ``k``'s word (a word split into pieces is split between windows only when it
            is longer than a window)."""
            while k > 0 and words[k] is not None and words[k - 1] == words[k]:
                k -= 1
            return k

        while True:
            last = min(first + self.window, n)  # tokens [first, last)
            if last < n and word_start(last) > first:
                last = word_start(last)
            start = 0 if first == 0 else offsets[first][0]
            while True:
                end = len(text) if last == n else offsets[last][0]  # up to the next token: the gap is covered
                if self._fits(text[start:end]):
                    break
                # the substring reads as more tokens than its window (a word split across the boundary, a space that
                # becomes a token): one token less
                last -= 1
                if last <= first:
                    raise ChunkError(
                        f"no window from character {start} fits in embed.chunk.max_tokens {self.max_tokens} "
                        "(special tokens and prompt included): raise it"
                    )
            spans.append((start, end))
            if len(spans) > self.max_chunks:
                raise TooManyChunks(f"more than embed.chunk.max_chunks {self.max_chunks} chunks")
            if last == n:
                return spans
            following = max(last - self.overlap_tokens, first + 1)  # always forward, even past a shortened window
            first = word_start(following) if word_start(following) > first else following

    def _fits(self, chunk: str) -> bool:
        """Whether ``chunk`` reads as ``max_tokens`` tokens at most, as the model reads it (prompt and specials)."""
        return len(self._backend.encode(self.prompt + chunk, add_special_tokens=True).ids) <= self.max_tokens


@dataclass
class DocumentChunks:
    """One document's chunks: their spans and vectors (``(chunks, dimension)`` float32, row *k* for chunk *k*), and
    with ``embed.chunk.document_vector: mean`` the normalised mean of those vectors."""

    spans: list[Span]
    vectors: np.ndarray
    document_vector: np.ndarray | None = None


@dataclass
class PreparedDocuments:
    """A batch of documents ready to score: each document's chunks as texts, flattened in document order (``owner``:
    the document of each chunk), the chunks' tokenization, and the documents refused before scoring."""

    texts: list[str | None]
    spans: list[list[Span] | None]
    chunk_texts: list[str]
    owner: np.ndarray
    features: Any
    refused: dict[int, Any] = field(default_factory=dict)
    shown: None = None
    """What the errors table shows of a row, where it is not the text itself (pairs): a document is shown as it is."""


class ChunkedEmbedder:
    """The embed head over documents: each text chunked (:class:`Chunker`), every chunk embedded by ``embedder``
    (:class:`~lakescore.udfs.heads.embed.SentenceEmbedder`, through the batching core, so chunks of all the batch's
    documents share forward batches), the vectors gathered back per document. Built by :func:`chunked_embedder`."""

    def __init__(self, embedder: ChunkableEmbedder, chunker: Chunker, document_vector: bool = False) -> None:
        self.embedder, self.chunker, self.document_vector = embedder, chunker, document_vector
        self.padding_side = embedder.padding_side

    def prepare(self, texts: list[str | None], refused: dict | None = None) -> PreparedDocuments:
        """:func:`prepare_documents` (the text runner's preparation of a batch, run ahead in a thread)."""
        return prepare_documents(texts, self, refused)

    def score_prepared(self, prepared: PreparedDocuments, budget: AdaptiveBudget) -> Scored:
        """:func:`embed_documents` of prepared documents."""
        return embed_documents(prepared.texts, self, budget, prepared)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The staged ``chunks`` column: per document the list of its chunks (``chunk_index``, ``chunk_start``,
        ``chunk_end``, ``embedding``; with a document vector first its row, ``chunk_index`` -1), null where not
        ``ok``."""
        documents = [outputs[i] for i in np.flatnonzero(ok)]
        index, start, end, vectors, counts = [], [], [], [], []
        for _i, document in zip(np.flatnonzero(ok), documents):
            rows = list(enumerate(document.spans))
            if document.document_vector is not None:
                index.append(-1), start.append(0), end.append(document.spans[-1][1])
                vectors.append(document.document_vector[None])
            index.extend(k for k, _ in rows)
            start.extend(span[0] for _, span in rows)
            end.extend(span[1] for _, span in rows)
            vectors.append(document.vectors)
            counts.append(len(rows) + (document.document_vector is not None))
        matrix = np.concatenate(vectors).astype(np.float32, copy=False) if vectors else np.zeros((0, 0), np.float32)
        embedding = list_column(matrix, np.ones(len(matrix), dtype=bool), pa.float32())
        chunk = pa.StructArray.from_arrays(
            [pa.array(index, pa.int32()), pa.array(start, pa.int32()), pa.array(end, pa.int32()), embedding],
            fields=[
                pa.field("chunk_index", pa.int32(), nullable=False),
                pa.field("chunk_start", pa.int32()),
                pa.field("chunk_end", pa.int32()),
                pa.field("embedding", embedding.type),
            ],
        )
        sizes = np.zeros(len(ok), dtype=np.int32)
        sizes[np.asarray(ok, dtype=bool)] = counts
        offsets = np.zeros(len(ok) + 1, dtype=np.int32)
        offsets[1:] = np.cumsum(sizes)
        return (pa.ListArray.from_arrays(pa.array(offsets), chunk, mask=pa.array(~np.asarray(ok, dtype=bool))),)

    def fidelity(self, reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        return self.embedder.fidelity(reference, outputs)

    def score(self, texts: list[str]) -> np.ndarray:
        """Each text's :class:`DocumentChunks` (``None`` where it was not scored), for small lists such as the
        executors' preflight: one row per text."""
        from lakescore.udfs.batching import BatchPolicy

        scored = embed_documents(texts, self, BatchPolicy(1 << 30, 1 << 30))
        return scored.outputs


def chunked_embedder(
    embedder: TextHead, max_tokens: int, overlap_tokens: int = 0, max_chunks: int = 1000, document_vector: bool = False
) -> ChunkedEmbedder:
    """``embedder`` (a loaded :class:`~lakescore.udfs.heads.embed.SentenceEmbedder`) over chunks of at most
    ``max_tokens`` tokens. Raises ``ValueError`` for ``max_tokens`` above the tokens the model reads
    (``max_seq_length``: its chunks would be truncated) or settings that leave no text in a window."""
    if not isinstance(embedder, ChunkableEmbedder) or embedder.tokenizer is None:
        raise ValueError("embed.chunk splits with the model's own tokenizer, which this model's loader does not expose")
    if max_tokens > embedder.max_seq_length:  # the driver refuses it first where the model's files say the limit
        from lakescore.udfs.options.embed import chunk_limit_error

        raise ValueError(chunk_limit_error(max_tokens, embedder.max_seq_length))
    return ChunkedEmbedder(
        embedder, Chunker(embedder.tokenizer, max_tokens, overlap_tokens, max_chunks, embedder.prompt), document_vector
    )


def prepare_documents(texts: list[str | None], head: ChunkedEmbedder, refused: dict | None = None) -> PreparedDocuments:
    """Chunk every present text of ``texts`` and tokenize the chunks; a text the chunker refuses (too many chunks,
    no window that fits) is refused whole, with its reason."""
    refused = dict(refused or {})
    spans: list[list[Span] | None] = [None] * len(texts)
    chunk_texts: list[str] = []
    owner: list[int] = []
    for i, text in enumerate(texts):
        if text is None or i in refused:
            continue
        try:
            doc_spans = head.chunker.spans(text)
        except ChunkError as exc:
            refused[i] = RowFailure(exc.reason, str(exc), text)
            continue
        except Exception as exc:  # the tokenizer's own failure: this document only
            refused[i] = RowFailure.of(PREPARE_ERROR, exc, text)
            continue
        spans[i] = doc_spans
        chunk_texts.extend(text[start:end] for start, end in doc_spans)
        owner.extend([i] * len(doc_spans))
    features = head.embedder.tokenize(chunk_texts) if chunk_texts else None
    return PreparedDocuments(texts, spans, chunk_texts, np.asarray(owner, dtype=np.int64), features, refused)


def embed_documents(
    texts: list[str | None], head: ChunkedEmbedder, budget: Any, prepared: PreparedDocuments | None = None
) -> Scored:
    """Score documents: ``outputs[i]`` is document *i*'s :class:`DocumentChunks`, or ``None`` with its reason where
    it was not scored (null, refused by the chunker, or any of its chunks failed: a document is scored whole or not
    at all)."""
    from lakescore.udfs.batching import Scored, score_texts

    prepared = prepared or prepare_documents(texts, head)
    n = len(texts)
    outputs = np.empty(n, dtype=object)
    reasons: list[str | None] = [NULL_INPUT if text is None else None for text in texts]
    errors: list[str | None] = [None] * n
    for i, failure in prepared.refused.items():
        reasons[i], errors[i] = failure.reason, failure.error
    if not prepared.chunk_texts:
        return Scored(outputs, reasons, errors)
    scored = score_texts(prepared.chunk_texts, head.embedder, budget, prepared.features)
    vectors = (
        np.stack([np.asarray(v, dtype=np.float32) for v in scored.outputs])
        if scored.outputs.dtype == object
        else np.asarray(scored.outputs, dtype=np.float32)
    )
    bounds = np.flatnonzero(np.diff(prepared.owner)) + 1
    for rows in np.split(np.arange(len(prepared.owner)), bounds):
        i = int(prepared.owner[rows[0]])
        failed = [k for k, row in enumerate(rows) if scored.reasons[row] is not None]
        if failed:  # one chunk failed: the whole document is dead-lettered
            k = failed[0]
            doc_spans = prepared.spans[i]
            assert doc_spans is not None  # a document owns chunk rows only once it has spans
            reasons[i] = scored.reasons[rows[k]]
            errors[i] = f"chunk {k} of {len(rows)} ({doc_spans[k][0]}-{doc_spans[k][1]}): {scored.errors[rows[k]]}"
            continue
        mean = _normalised_mean(vectors[rows]) if head.document_vector else None
        outputs[i] = DocumentChunks(prepared.spans[i], vectors[rows], mean)
    return Scored(outputs, reasons, errors)


def _normalised_mean(vectors: np.ndarray) -> np.ndarray:
    mean = vectors.astype(np.float64).mean(axis=0)
    return (mean / max(np.linalg.norm(mean), 1e-12)).astype(np.float32)
