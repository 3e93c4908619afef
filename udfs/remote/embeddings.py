"""The embeddings API's wire format (``/v1/embeddings``): the request a list of texts becomes, with the server asked to
truncate each at a token limit (``truncate_prompt_tokens``, an extension of vLLM's and SGLang's), what a whole answer
is (:func:`parse_embeddings`), and one request's exchange through the client (:func:`post_embeddings`). What an
answer means beyond its shape is :mod:`~lakescore.udfs.remote.answers`'.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lakescore.schemas.traffic import Traffic
from lakescore.udfs.remote.answers import Malformed
from lakescore.udfs.remote.client import ESTIMATED_CHARS_PER_TOKEN, EndpointClient

__all__ = ["EMBEDDINGS", "SERVER_LIMIT", "Embeddings", "embeddings_body", "parse_embeddings", "post_embeddings"]

EMBEDDINGS = "/embeddings"
"""The route under the server's ``/v1``."""

SERVER_LIMIT = -1
"""``truncate_prompt_tokens`` when no limit is known here (an endpoint without ``model.max_seq_length``): vLLM's
"the model's own limit" (its ``max_model_len``)."""


@dataclass(frozen=True)
class Embeddings:
    """One request's answer: a vector per input, in input order, and the prompt tokens ``usage`` reports (``None``
    when the answer has no ``usage``)."""

    vectors: np.ndarray
    prompt_tokens: int | None

    @property
    def tokens(self) -> int | None:
        """What the host's tokens-per-minute limit settles with."""
        return self.prompt_tokens


def parse_embeddings(body: Mapping[str, Any], inputs: int) -> Embeddings:
    """A ``/v1/embeddings`` answer's vectors, only when it is a whole answer to a request of ``inputs`` texts: one
    vector per ``index`` ``0..inputs-1``, all of one length, finite numbers; :class:`Malformed` naming what it lacks
    otherwise (or ``usage`` whose ``prompt_tokens`` is not a whole number of at least 0)."""
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list) or len(data) != inputs:
        found = len(data) if isinstance(data, list) else "no"
        raise Malformed(f"the response holds {found} embeddings for {inputs} inputs: {json.dumps(body)[:300]}")
    by_index: dict[int, Any] = {}
    for row in data:
        index = row.get("index") if isinstance(row, Mapping) else None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < inputs or index in by_index:
            raise Malformed(f"the response's embeddings are not indexed 0..{inputs - 1}: {json.dumps(row)[:200]}")
        by_index[index] = row.get("embedding")
    try:
        vectors = np.array([by_index[i] for i in range(inputs)], dtype=np.float64)
    except (TypeError, ValueError):
        raise Malformed("the response's embeddings are not lists of numbers of one length") from None
    if vectors.ndim != 2 or vectors.shape[1] == 0 or not np.isfinite(vectors).all():
        raise Malformed(f"the response's embeddings are not finite vectors of one length (shape {vectors.shape})")
    usage = body.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
    if usage is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise Malformed(
            f"the response's usage is impossible (prompt_tokens {json.dumps(tokens)}): {json.dumps(usage)[:200]}"
        )
    return Embeddings(vectors.astype(np.float32), tokens)


def embeddings_body(model: str, inputs: Sequence[str], truncate_to: int) -> dict[str, Any]:
    """The request of ``inputs`` to ``model``, each truncated by the server at ``truncate_to`` tokens
    (:data:`SERVER_LIMIT`: the model's own limit): what a per-row request and a provider batch's line send."""
    return {"model": model, "input": list(inputs), "truncate_prompt_tokens": truncate_to, "encoding_format": "float"}


def post_embeddings(client: EndpointClient, inputs: Sequence[str], truncate_to: int) -> Embeddings:
    """One request of ``inputs``, each truncated by the server at ``truncate_to`` tokens (:data:`SERVER_LIMIT`: the
    model's own limit): their :class:`Embeddings` as the server sent them (errors as the client's ``post``)."""
    body = embeddings_body(client.model, inputs, truncate_to)
    estimate = sum(len(text) // ESTIMATED_CHARS_PER_TOKEN + 1 for text in inputs)
    if truncate_to > 0:
        estimate = min(estimate, truncate_to * len(inputs))
    answer = client.post(body, estimate, lambda reply: parse_embeddings(reply, len(inputs)), path=EMBEDDINGS)
    if answer.prompt_tokens is None:
        client.stats.add(Traffic(unmetered=1))
    else:
        client.stats.add(Traffic(tokens_in=answer.prompt_tokens))
    return answer
