"""The ``embed`` head over an OpenAI-compatible ``/v1/embeddings``: an endpoint (``embed.endpoint``) or the engine
served on this host (``embed.server``: vLLM's pooling runner, :mod:`lakescore.udfs.remote.engine`).

It takes the place of :class:`~lakescore.udfs.heads.embed.SentenceEmbedder` behind the text runner: no weights here,
the present texts of an Arrow batch cut into requests of many inputs (:func:`cut_requests`), ``concurrency`` requests
in flight. Each request asks the server to truncate every input at the model's limit (``truncate_prompt_tokens``, an
extension of vLLM's and SGLang's), so a text past it is embedded truncated, as in-process, rather than refused; the
preflight (:meth:`EndpointEmbedder.score`) sends one such request, and a server that refuses it is refused there in
one line. The output is the in-process head's ``embedding`` column, L2-normalised here as in-process normalises it.

A request that fails for good is settled by what failed: a status the server gives the request's content (a 4xx
other than 408, 409 and 429: :func:`~lakescore.udfs.remote.answers.content_refused`) is split in halves and each
sent again, down to the one text it refuses (dead-lettered ``endpoint_error`` alone); anything else (408, 409, 429,
5xx, timeouts, lost connections, after their retries, or a malformed answer) dead-letters every row of the request, as
the server, not a text, failed. ``usage.prompt_tokens`` is the run's tokens (and its cost with ``price.input``);
:class:`~lakescore.udfs.remote.answers.EndpointDown` stops the run.

:class:`EmbedLines` are the same requests, one text each, as lines of a provider's Batch API (``embed.endpoint.batch``,
:class:`~lakescore.udfs.remote.batch_lines.BatchLines`), each result's vector normalised as here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lakescore.schemas.reasons import NULL_INPUT
from lakescore.udfs.batching import AdaptiveBudget, Scored
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.remote.answers import EndpointDown, EndpointError, EndpointRefused, content_refused, what_happened
from lakescore.udfs.remote.batch_lines import LineAnswer
from lakescore.udfs.remote.client import EndpointClient
from lakescore.udfs.remote.embeddings import SERVER_LIMIT, embeddings_body, parse_embeddings, post_embeddings
from lakescore.udfs.remote.head import RemoteHead, open_client

if TYPE_CHECKING:
    import pyarrow as pa

    from lakescore.udfs.remote.engine import EngineServer

__all__ = [
    "EndpointEmbedder",
    "load_remote_embedder",
    "cut_requests",
    "embedding_column",
    "EmbedLines",
    "embed_lines",
    "REQUEST_CHARS",
    "served_args",
]

REQUEST_CHARS = 1 << 20
"""Characters one request carries at most (a text longer than this goes alone). Requests are cut by inputs
(``scoring.max_batch_rows``) and characters, not tokens: an endpoint lends no tokenizer, and a guess of tokens from
characters is wrong by a factor for other scripts than English. The server truncates each input at the model's limit,
so its work per input is bounded whatever a text's length; this bound keeps a request's body of a size every server
takes."""


def cut_requests(lengths: Sequence[int], max_inputs: int, max_chars: int = REQUEST_CHARS) -> list[list[int]]:
    """The positions ``0..len(lengths)-1`` in requests of at most ``max_inputs`` inputs and ``max_chars`` characters
    (``lengths``: each text's characters), in order; a text longer than ``max_chars`` is a request alone."""
    requests: list[list[int]] = []
    current: list[int] = []
    chars = 0
    for i, length in enumerate(lengths):
        if current and (len(current) >= max_inputs or chars + length > max_chars):
            requests.append(current)
            current, chars = [], 0
        current.append(i)
        chars += length
    if current:
        requests.append(current)
    return requests


@dataclass
class PreparedRequests:
    """A text batch ready to send: the texts (``None`` where null or refused) and the rows refused before sending."""

    texts: list[str | None]
    refused: dict[int, Any]
    features: None = None
    shown: None = None


class EndpointEmbedder(RemoteHead):
    """The embed head for texts answered by ``client``'s ``/v1/embeddings``: each text prefixed with ``prompt`` (the
    model's sentence-transformers prompt, as in-process), truncated by the server at ``truncate_to`` tokens, the vectors
    L2-normalised when ``normalize``."""

    padding_side = "right"

    def __init__(
        self,
        client: EndpointClient,
        truncate_to: int,
        normalize: bool = True,
        prompt: str = "",
        revision: str | None = None,
        server: EngineServer | None = None,
    ) -> None:
        self.truncate_to, self.normalize, self.prompt = truncate_to, normalize, prompt
        super().__init__(client, revision, server)

    # -- the text runner's interface: a head that prepares and scores its rows itself ------------------------------

    def prepare(self, texts: list[str | None], refused: dict | None = None) -> PreparedRequests:
        """The texts as they are (the server tokenizes)."""
        return PreparedRequests(list(texts), dict(refused or {}))

    def score_prepared(self, prepared: PreparedRequests, budget: AdaptiveBudget) -> Scored:
        """Send every present text, in requests of at most ``budget``'s rows (:func:`cut_requests`): each row's vector,
        ``null_input`` for a null text, ``endpoint_error`` as the module says for a row the server failed."""
        texts = prepared.texts
        strings = {i: t for i, t in enumerate(texts) if isinstance(t, str) and i not in prepared.refused}
        reasons: list[str | None] = [None if i in strings else NULL_INPUT for i in range(len(texts))]
        present = list(strings)
        requests = [
            [present[k] for k in rows]
            for rows in cut_requests([len(strings[i]) for i in present], budget.policy.max_rows)
        ]
        sent = self.send(
            requests,
            lambda k: self._embed([strings[i] for i in requests[k]]),
            range(len(requests)),
            [None] * len(requests),
        )
        outputs = np.empty(len(texts), dtype=object)
        errors: list[str | None] = [None] * len(texts)
        for k, rows in enumerate(requests):
            if sent.reasons[k] is not None:  # not an EndpointError (those are per row): every row of the request
                for i in rows:
                    reasons[i], errors[i] = sent.reasons[k], sent.errors[k]
                continue
            for i, result in zip(rows, sent.outputs[k]):
                if isinstance(result, EndpointError):
                    reasons[i], errors[i] = result.reason, self.client.scrub(str(result))[:2000]
                else:
                    outputs[i] = result
        return Scored(outputs, reasons, errors)

    def _embed(self, texts: list[str]) -> list[Any]:
        """Each text's vector, or the :class:`EndpointError` that failed it: a request the server refused for its
        content is split in halves, down to the text it refuses; any other failure is every text's."""
        try:
            return list(self._post(texts))
        except EndpointError as exc:
            if len(texts) == 1 or not content_refused(exc):
                return [exc] * len(texts)
        half = len(texts) // 2
        return self._embed(texts[:half]) + self._embed(texts[half:])

    def _post(self, texts: list[str]) -> np.ndarray:
        """One request of ``texts``: their vectors, normalised as the head says (errors as the client's ``post``)."""
        inputs = [self.prompt + text for text in texts] if self.prompt else texts
        answer = post_embeddings(self.client, inputs, self.truncate_to)
        if not self.normalize:
            return answer.vectors
        from lakescore.udfs.heads.embed import l2_normalize

        return l2_normalize(answer.vectors).astype(np.float32, copy=False)

    def columns(self, outputs: np.ndarray, ok: np.ndarray):
        """The ``embedding`` column, as the in-process head writes it (rows not ``ok`` are null)."""
        return (embedding_column(outputs, ok),)

    def score(self, texts: list[str]) -> np.ndarray:
        """The executors' preflight: ``texts`` in one request with every setting of the run (``truncate_prompt_tokens``
        included); :class:`EndpointRefused` in one line when the server refuses it or answers it malformed."""
        where = self.where
        try:
            return self._post(list(texts))
        except EndpointDown as exc:
            raise EndpointRefused(str(exc)) from None
        except EndpointError as exc:
            not_served = self.not_served(exc)
            if not_served:  # a wrong model is no matter of truncate_prompt_tokens
                raise EndpointRefused(not_served) from None
            if content_refused(exc):
                raise EndpointRefused(
                    f"{where} refused the preflight's embeddings request: {exc}; lakescore's requests carry "
                    f"truncate_prompt_tokens {self.truncate_to} (vLLM's and SGLang's extension), so that texts past "
                    "the model's limit are truncated as in-process rather than refused: use a server that takes it"
                ) from None
            raise EndpointRefused(f"{where} {what_happened(exc, self.client.settings.max_retries)}") from None

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        from lakescore.udfs.heads.embed import SentenceEmbedder

        return SentenceEmbedder.fidelity(reference, outputs)


def embedding_column(outputs: np.ndarray, ok: np.ndarray) -> Any:
    """The ``embedding`` column of the vectors ``outputs``, as the in-process head writes it (rows not ``ok`` null)."""
    import pyarrow as pa

    from lakescore.udfs.arrow_columns import list_column

    rows = np.flatnonzero(ok)
    matrix = np.zeros((len(outputs), len(outputs[rows[0]]) if len(rows) else 0), dtype=np.float32)
    for i in rows:
        matrix[i] = outputs[i]
    return list_column(matrix, ok, pa.float32())


def served_args(engine: str, args: Sequence[str]) -> tuple[str, ...]:
    """An embedding engine's flags: ``args``, after the flag that makes the engine embed unless ``args`` give it (vLLM
    ``--runner pooling``: its default runner generates for a decoder model; SGLang ``--is-embedding``)."""
    args = tuple(args)
    if engine == "vllm" and not any(a == "--runner" or a.startswith("--runner=") for a in args):
        return ("--runner", "pooling", *args)
    if engine == "sglang" and "--is-embedding" not in args:
        return ("--is-embedding", *args)
    return args


def load_remote_embedder(spec: ModelSpec, model_dir: Path | None) -> EndpointEmbedder:
    """The head for ``spec.embed.endpoint`` (``model_dir`` ``None``: no files here), or for ``spec.embed.server``: this
    host's engine serving ``model_dir``, started when no process of the host has started it yet. ``ValueError`` for
    model settings a server cannot honour; :class:`EndpointRefused` for a key named but not set;
    :class:`~lakescore.udfs.remote.engine.EngineStartError` for an engine that does not come up."""
    options = spec.embed
    if options is None:
        raise ValueError(f"task {spec.task!r}: a remote embedder needs the spec's embed options")
    if spec.pooling is not None:
        raise ValueError(f"model.pooling {spec.pooling!r}: a served model pools as its own configuration says; drop it")
    if spec.reduced_precision:
        raise ValueError(
            f"{spec.reduced_precision} (model.dtype / model.quantize) is how a model runs here; a served "
            "model runs at the server's precision (its own flags, e.g. vLLM's --dtype): drop it"
        )
    if spec.normalize is False:
        raise ValueError(
            "model.normalize false: a served embedding comes normalised from the server's pooler; embed "
            "in-process for unnormalised vectors"
        )
    if options.endpoint is not None:
        if spec.prompt_name is not None:
            raise ValueError(
                "model.prompt_name needs the model's files (config_sentence_transformers.json), which an "
                "endpoint does not lend; prefix the texts upstream, or use embed.server"
            )
        limit, prompt, revision = spec.max_seq_length or SERVER_LIMIT, "", options.endpoint.revision
        client, engine = open_client(options.endpoint, None, None)
    else:
        from lakescore.udfs.heads.embed import served_embedding

        if options.server is None or model_dir is None:
            raise ValueError("embed needs embed.endpoint, or embed.server and the model's files to serve")
        limit, normalize, prompt = served_embedding(spec, model_dir)
        if not normalize:
            raise ValueError(
                f"{model_dir} embeds without normalising (no Normalize module), which a served engine's "
                "pooler does; embed it in-process"
            )
        server = options.server.model_copy(update={"args": served_args(options.server.engine, options.server.args)})
        client, engine = open_client(None, server, model_dir)
        revision = spec.revision
    try:
        return EndpointEmbedder(client, limit, True, prompt, revision, server=engine)
    except BaseException:
        client.close()
        raise


@dataclass(frozen=True)
class EmbedLines:
    """``embed.endpoint.batch``'s lines: ``model`` the endpoint's, each text truncated by the server at
    ``truncate_to`` tokens, as the per-row path asks (:class:`~lakescore.udfs.remote.embed.EndpointEmbedder`)."""

    model: str
    truncate_to: int
    api: str = "embeddings"

    def body(self, text: str, key: str) -> dict[str, Any]:
        return embeddings_body(self.model, [text], self.truncate_to)

    def answer(self, body: Mapping[str, Any]) -> LineAnswer:
        from lakescore.udfs.heads.embed import l2_normalize

        answer = parse_embeddings(body, 1)
        return LineAnswer(l2_normalize(answer.vectors).astype(np.float32, copy=False)[0], answer.prompt_tokens)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> Sequence[pa.Array]:
        return (embedding_column(outputs, ok),)


def embed_lines(spec: ModelSpec, output_types: Sequence[pa.DataType]) -> EmbedLines:
    """The run's :class:`EmbedLines` (``spec.embed.endpoint`` set): truncated at ``model.max_seq_length``, else the
    server's own limit, as the per-row path (:func:`~lakescore.udfs.remote.embed.load_remote_embedder`)."""
    options = spec.embed
    assert options is not None and options.endpoint is not None
    return EmbedLines(options.endpoint.model, spec.max_seq_length or SERVER_LIMIT)
