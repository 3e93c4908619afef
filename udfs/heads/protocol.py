"""The head contract: what every task head implements, and what only some heads do, each a protocol of its own.

A head is what a task's loader returns (:meth:`lakescore.udfs.registry.Task.load`). The scoring function
(:mod:`lakescore.udfs.scoring_udf`), the runners (:mod:`lakescore.udfs.runners`) and the model cache call it only
through these types:

* :class:`Head`: every head. ``columns`` turns a batch's outputs into the task's output columns, ``score`` scores a
  few inputs whole (the executors' preflight, the timing of a row);
* the input kind's part, which its runner calls: :class:`~lakescore.udfs.batching.TextHead` (``tokenize`` and
  ``forward`` through the batching core), :class:`PromptHead` (a generation head: it plans and scores its own prompt
  batches; :class:`ImagePromptHead` over images), :class:`MatrixHead` (feature columns), :class:`ImageInputHead`
  (encoded images), :class:`AudioInputHead` (encoded recordings);
* opt-in parts, which the core tells apart by ``isinstance`` (each is ``runtime_checkable``):
  :class:`PreparesBatches` (a text head that prepares and scores its rows itself: a document's chunks, or requests of
  many texts to a server), :class:`ChunksDocuments` (one input row many rows: the embedder its chunks go through),
  :class:`SendsRecordings` (an audio head whose recordings go out whole, one request each),
  :class:`MetersTraffic` (what a head over the wire sent, as :class:`~lakescore.schemas.traffic.Traffic`),
  :class:`ServedElsewhere` (a model answered by a server: whether it still names the same model),
  :class:`PlansOwnBudget` (its own default token budget), :class:`ChecksFidelity` (its reduced-precision figures
  against float32), :class:`HoldsResources` (threads or connections to close).

A new task's head implements :class:`Head` and its input kind's part; a new remote head subclasses
:class:`~lakescore.udfs.remote.head.RemoteHead`, which implements the remote parts. tests/unit/test_head_protocol.py
checks each head against the parts it claims.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lakescore.udfs.batching import AdaptiveBudget, Scored, TextHead

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from lakescore.schemas.traffic import Traffic

__all__ = [
    "Head",
    "TextHead",
    "PromptHead",
    "ImagePromptHead",
    "MatrixHead",
    "ImageInputHead",
    "AudioInputHead",
    "PreparesBatches",
    "SendsRecordings",
    "ChunksDocuments",
    "MetersTraffic",
    "ServedElsewhere",
    "PlansOwnBudget",
    "ChecksFidelity",
    "HoldsResources",
]

Features = Mapping[str, Any]


@runtime_checkable
class Head(Protocol):
    """What every head implements."""

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> Sequence[pa.Array]:
        """The task's output columns, in output order, for a batch's ``outputs`` (rows not ``ok`` are null)."""
        ...

    def score(self, inputs: Any) -> np.ndarray:
        """``inputs`` scored whole, one output row each (the preflight's sample: the input kind's
        :meth:`~lakescore.udfs.registry.InputKind.preflight_sample`)."""
        ...


class PromptHead(Head, Protocol):
    """A generation head (the ``PromptRunner``'s and ``ImagePromptRunner``'s): it prepares its prompts, says what
    each costs, and plans and scores its own batches."""

    def tokenize(self, prompts: list[str], keys: Sequence[str] | None = None) -> Features: ...

    def row_cost(self, features: Features) -> np.ndarray: ...

    def score_prompts(
        self,
        prompts: Sequence[str | None],
        policy: Any,
        keys: Sequence[str] | None = None,
        features: Features | None = None,
    ) -> Scored: ...


class ImagePromptHead(PromptHead, Protocol):
    """A generation head over images with prompts (the ``ImagePromptRunner``'s): each decoded image processed with its
    prompt (a remote head keeps the file's bytes, ``encoded``), then a batch's rows prepared and scored as prompts."""

    def process(self, image: Any, prompt: str, encoded: Any = None) -> Any: ...

    def prepare(self, rows: Sequence[Any], keys: Sequence[str]) -> Features: ...


class MatrixHead(Head, Protocol):
    """A head over numeric feature columns (the ``MatrixRunner``'s): one float matrix in, one output row per row."""

    def forward(self, matrix: np.ndarray) -> np.ndarray: ...


class ImageInputHead(Head, Protocol):
    """A head over encoded images (the ``ImageRunner``'s): it preprocesses decoded images, then runs a forward."""

    def preprocess(self, images: Sequence[Any]) -> Any: ...

    def forward(self, features: Any) -> np.ndarray: ...


class AudioInputHead(Head, Protocol):
    """A head over encoded recordings (the ``AudioRunner``'s): it decodes a row, cuts it in windows, and runs batches
    of windows (any recordings' windows of one :meth:`batch_key`), then assembles a recording from its windows'
    outputs. ``sampling_rate``: the rate it hears recordings at; :meth:`read_header`: a row's header alone (what
    ``lakescore plan`` measures), or the row's failure."""

    sampling_rate: int

    def read_header(self, data: Any) -> Any: ...

    def decode(self, data: Any) -> Any: ...

    def windows(self, samples: int) -> list[Any]: ...

    def window_cost(self, window: Any) -> int: ...

    def batch_key(self, window: Any) -> int: ...

    def features(self, pieces: Sequence[Any]) -> Any: ...

    def forward(self, features: Any) -> np.ndarray: ...

    def assemble(self, outputs: Sequence[Any], windows: Sequence[Any]) -> tuple[str, list | None]: ...


@runtime_checkable
class PreparesBatches(Protocol):
    """A text head that prepares and scores its rows itself, instead of the batching core's tokenize and forward: one
    that makes many rows of one text (``embed.chunk``: a document, its chunks), or whose rows are requests of many
    texts to a server (the remote embed head)."""

    def prepare(self, texts: list[str | None], refused: dict | None = None) -> Any: ...

    def score_prepared(self, prepared: Any, budget: AdaptiveBudget) -> Scored: ...


@runtime_checkable
class SendsRecordings(Protocol):
    """An audio head whose recordings go out whole, one request each (a transcription endpoint), instead of windows
    through the batching core: the audio runner reads each row's header only (:meth:`read_header`: a header, or the
    row's :class:`~lakescore.schemas.reasons.RowFailure`) and hands the head the files it can send."""

    def read_header(self, data: Any) -> Any: ...

    def send_recordings(self, values: Sequence[Any], headers: Mapping[int, Any]) -> Scored: ...


@runtime_checkable
class ChunksDocuments(Protocol):
    """A head that makes one input row many rows: ``embedder`` is the head each piece goes through (what a
    reduced-precision run is checked on: a piece is an input like any other)."""

    embedder: TextHead


@runtime_checkable
class MetersTraffic(Protocol):
    """A head over the wire: what this process's client sent so far (the scoring function reports each batch's part)."""

    def traffic(self) -> Traffic: ...


@runtime_checkable
class ServedElsewhere(Protocol):
    """A model answered over the wire: its identity in place of model files (``sha256``, ``revision``, ``files``,
    ``where`` it is served), whether the server still names the model this head was made for, and whether it named
    one at all when the head was made."""

    sha256: str
    revision: str | None
    files: dict[str, str]

    @property
    def where(self) -> str: ...

    def is_current(self) -> bool: ...

    def listed(self) -> bool: ...


@runtime_checkable
class PlansOwnBudget(Protocol):
    """A head whose token budget defaults to its own (generation's, a server's) rather than the batching core's."""

    def default_max_tokens(self, device: str) -> int: ...


@runtime_checkable
class ChecksFidelity(Protocol):
    """A head that can run on a reduced-precision path: its figures for ``outputs`` against float32's ``reference``."""

    def fidelity(self, reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]: ...


@runtime_checkable
class HoldsResources(Protocol):
    """A head that holds threads or connections: closed when the cache drops it, and at the worker's exit."""

    def close(self) -> None: ...
