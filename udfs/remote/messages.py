"""Anthropic's Messages API wire format (``generate.endpoint.api: messages``, ``POST <url>/messages``): the request one
prompt becomes under the generate settings (:func:`request_body`), the headers that carry the key
(:func:`auth_headers`: ``x-api-key`` and ``anthropic-version``, never ``Authorization``), what a whole answer is
(:func:`parse_message`) and one prompt's exchange through the client (:func:`complete`). The transport (retries,
limits, the breaker, the scrubber) is the client's, as for the OpenAI APIs.

Stop reasons map to the OpenAI ones the output columns hold: ``end_turn`` and ``stop_sequence`` are ``stop``,
``max_tokens`` is ``length``; any other (``refusal``, ``tool_use``, ``pause_turn``, ...) is not the model's whole text
(dead-lettered ``endpoint_unfinished``). The prompt tokens are all the prompt's: ``input_tokens`` plus those read from
or written to the prompt cache (``cache_read_input_tokens``, ``cache_creation_input_tokens``), which Anthropic counts
apart: those read from it are the answer's cached tokens, those written to it its cache-write tokens (each billed
at a price of its own)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from lakescore.schemas.traffic import Traffic
from lakescore.udfs.remote.answers import Malformed, Unfinished
from lakescore.udfs.remote.client import ESTIMATED_CHARS_PER_TOKEN, EndpointClient
from lakescore.udfs.remote.completions import Completion, completion_traffic

__all__ = [
    "ANTHROPIC_VERSION",
    "MESSAGES_PATH",
    "STOP_REASONS",
    "auth_headers",
    "request_body",
    "image_block",
    "user_content",
    "parse_message",
    "complete",
]

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` every request names: the Messages API's version, unchanged since it was published."""
MESSAGES_PATH = "/messages"
"""The route under the endpoint's ``url`` (``https://api.anthropic.com/v1``)."""
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
"""Anthropic's ``stop_reason`` of a whole answer, as the ``finish_reason`` the output holds."""


def auth_headers(key: str | None) -> dict[str, str]:
    """The headers of every request: the API's version, and the key (where one is set) as ``x-api-key``."""
    return {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}


def image_block(part: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages API's image block for an OpenAI chat ``image_url`` content part holding a ``data:`` URI."""
    url = part["image_url"]["url"]
    head, _, data = url.partition(",")
    if not head.startswith("data:") or not head.endswith(";base64"):
        raise ValueError("an image goes to the Messages API as base64 data")
    return {"type": "image", "source": {"type": "base64", "media_type": head[5:-7], "data": data}}


def user_content(options: Any, prompt: str) -> str | list[dict[str, Any]]:
    """The user message's content for ``prompt``: the text as it is, or where ``generate.prefix_template`` rendered a
    shared part of it (:meth:`~lakescore.udfs.options.generate.GenerateOptions.shared_prefix`) that part as a text
    block marked ``cache_control`` (Anthropic caches the request up to it, and bills a later read at a tenth) and the
    rest as a second: the same text in two blocks."""
    shared = options.shared_prefix(prompt)
    if shared is None:
        return prompt
    return [
        {"type": "text", "text": shared, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": prompt[len(shared) :]},
    ]


def request_body(
    options: Any, endpoint_model: str, prompt: str, image: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The Messages request for one prompt under the generate settings ``options``: the prompt as the user message
    (``image``, an ``image_url`` content part, as an image block before it), the system prompt as ``system``, the
    stop strings as ``stop_sequences``, ``json_schema`` as structured output (``output_config.format``). The settings
    this API has no field for are refused before any compute
    (:func:`~lakescore.udfs.options.remote.unsupported_settings`); a row's seed has none either. A prompt whose
    shared part ``prefix_template`` rendered is sent as two text blocks, that part first and marked
    ``cache_control: {type: ephemeral}`` (:func:`user_content`)."""
    user: Any = (
        user_content(options, prompt) if image is None else [image_block(image), {"type": "text", "text": prompt}]
    )
    body: dict[str, Any] = {
        "model": endpoint_model,
        "max_tokens": options.max_new_tokens,
        "messages": [{"role": "user", "content": user}],
        "temperature": options.temperature,
    }
    if options.system_prompt is not None:
        body["system"] = options.system_prompt
    if options.top_p < 1:
        body["top_p"] = options.top_p
    if options.top_k is not None:
        body["top_k"] = options.top_k
    if options.stop:
        body["stop_sequences"] = list(options.stop)
    if options.json_schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": json.loads(options.json_schema)}}
    return body


def parse_message(body: Mapping[str, Any], stop: Sequence[str] = (), max_tokens: int | None = None) -> Completion:
    """One Message's :class:`~lakescore.udfs.remote.completions.Completion`, only when it is a whole, well-formed
    answer: :class:`~lakescore.udfs.remote.answers.Malformed` naming what it lacks (no content, no ``stop_reason``,
    ``usage`` that is not whole numbers of at least 0, more output tokens than ``max_tokens``),
    :class:`~lakescore.udfs.remote.answers.Unfinished` for a stop reason outside :data:`STOP_REASONS`. The text is its
    text blocks' together, cut before the first ``stop`` string left in it."""
    content = body.get("content") if isinstance(body, Mapping) else None
    if not isinstance(content, list):
        raise Malformed(f"the response holds no content: {json.dumps(body)[:300]}")
    blocks = [block.get("text") for block in content if isinstance(block, Mapping) and block.get("type") == "text"]
    texts = [text for text in blocks if isinstance(text, str)]
    if len(texts) != len(blocks):
        raise Malformed(f"the response's text is not a string: {json.dumps(content)[:100]}")
    reason = body.get("stop_reason")
    if not isinstance(reason, str) or not reason:
        raise Malformed(f"the response has no stop_reason: {json.dumps(body)[:300]}")
    if reason not in STOP_REASONS:
        raise Unfinished(reason)
    text = "".join(texts)
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    prompt_tokens, output_tokens, cached, written = _usage(body.get("usage"), max_tokens)
    return Completion(
        text, STOP_REASONS[reason], prompt_tokens, output_tokens, cached_tokens=cached, cache_write_tokens=written
    )


def _usage(usage: Any, max_tokens: int | None) -> tuple[int | None, int | None, int, int]:
    """All the prompt's tokens (input, cache read, cache written), the output tokens, the tokens read from the cache
    and those written to it; ``(None, None, 0, 0)`` without ``usage``; :class:`Malformed` when they cannot be true.

    >>> _usage({"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 40,
    ...         "cache_creation_input_tokens": 7}, None)
    (50, 2, 40, 7)
    >>> _usage({"input_tokens": 3, "output_tokens": 2}, None), _usage(None, None)
    ((3, 2, 0, 0), (None, None, 0, 0))
    """
    if usage is None:
        return None, None, 0, 0
    counts = {}
    for name in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = usage.get(name) if isinstance(usage, Mapping) else None
        if value is None and name.startswith("cache_"):
            value = 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Malformed(
                f"the response's usage is impossible ({name} {json.dumps(value)}): {json.dumps(usage)[:200]}"
            )
        counts[name] = value
    if max_tokens is not None and counts["output_tokens"] > max_tokens:
        raise Malformed(
            f"the response's usage is impossible ({counts['output_tokens']} output tokens, {max_tokens} allowed)"
        )
    prompt = counts["input_tokens"] + counts["cache_read_input_tokens"] + counts["cache_creation_input_tokens"]
    return prompt, counts["output_tokens"], counts["cache_read_input_tokens"], counts["cache_creation_input_tokens"]


def complete(
    client: EndpointClient, options: Any, prompt: str, seed: int | None = None, image: Mapping[str, Any] | None = None
) -> Completion:
    """One prompt's :class:`~lakescore.udfs.remote.completions.Completion` through ``client`` (errors as its ``post``);
    ``seed`` has no place in the Messages API and is not sent. ``usage`` settles the tokens-per-minute guess and
    counts the tokens."""
    body = request_body(options, client.model, prompt, image)
    estimate = len(prompt) // ESTIMATED_CHARS_PER_TOKEN + 1 + options.max_new_tokens
    completion = client.post(
        body, estimate, lambda answer: parse_message(answer, options.stop, options.max_new_tokens), MESSAGES_PATH
    )
    if completion.prompt_tokens is None or completion.completion_tokens is None:
        client.stats.add(Traffic(unmetered=1))
    else:
        client.stats.add(completion_traffic(completion))
    return completion
