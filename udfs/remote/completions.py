"""The completions and chat APIs' wire format (``/v1/completions``, ``/v1/chat/completions``): the request one
prompt becomes under the generate settings (:func:`request_body`), what a whole answer is (:func:`parse_completion`),
and one prompt's exchange through the client (:func:`complete`). What an answer means beyond its shape (retried, the
content's fault) is :mod:`~lakescore.udfs.remote.answers`'; the transport (retries, limits, the breaker) is the
client's (:mod:`~lakescore.udfs.remote.client`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lakescore.schemas.traffic import Traffic
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.options.remote import EndpointOptions, ServerOptions
from lakescore.udfs.remote.answers import Malformed, Unfinished
from lakescore.udfs.remote.client import ESTIMATED_CHARS_PER_TOKEN, EndpointClient

__all__ = [
    "Completion",
    "FINISHED",
    "request_body",
    "prompt_cache_key",
    "parse_completion",
    "cached_prompt_tokens",
    "token_logprobs",
    "api_of",
    "completions_path",
    "complete",
    "completion_traffic",
]

FINISHED = ("stop", "length")
"""The ``finish_reason`` of a whole answer: the model stopped, or reached ``max_tokens``. Any other (``content_filter``,
``abort``, ``tool_calls``) is an answer that is not the model's whole text: dead-lettered ``endpoint_unfinished``."""


@dataclass(frozen=True)
class Completion:
    """One row's answer: the text (cut before the first stop string), ``stop`` or ``length``, the tokens ``usage``
    reports (``None`` for both when the answer has no ``usage``: unknown, not 0), where the response holds them each
    generated token's log-probability, the prompt tokens the server read from its prompt cache and those it wrote to
    it (both among ``prompt_tokens``; 0 where it reports none: only Anthropic reports writes)."""

    text: str
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    token_logprobs: tuple[float, ...] | None = None
    cached_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def tokens(self) -> int | None:
        """Prompt and completion tokens together, as ``usage`` said; ``None`` when it said nothing."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


def request_body(
    options: GenerateOptions,
    endpoint_model: str,
    api: str,
    prompt: str,
    seed: int | None = None,
    image: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The request for one prompt under the generate settings ``options``: every setting mapped to its request
    field, none dropped (a server that cannot honour one refuses it, and the preflight says so). ``image``: a content
    part (``{"type": "image_url", ...}``) the user message holds before the prompt's text part (chat only)."""
    body: dict[str, Any] = {
        "model": endpoint_model,
        "max_tokens": options.max_new_tokens,
        "temperature": options.temperature,
    }
    system = options.system_prompt
    if image is not None and api != "chat":
        raise ValueError("an image is sent through the chat API only")
    if api == "chat":
        user = prompt if image is None else [dict(image), {"type": "text", "text": prompt}]
        body["messages"] = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": user}
        ]
    else:
        body["prompt"] = prompt if system is None else f"{system}\n\n{prompt}"
    if options.top_p < 1:
        body["top_p"] = options.top_p
    if seed is not None and not options.greedy:
        body["seed"] = seed
    if options.stop:
        body["stop"] = list(options.stop)
    if options.logprobs:  # the chosen tokens' log-probabilities: a flag in chat, a count in completions
        body["logprobs"] = True if api == "chat" else 1
    key = prompt_cache_key(options, prompt) if image is None else None
    if key is not None:
        body["prompt_cache_key"] = key
    if options.json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "row", "schema": json.loads(options.json_schema), "strict": True},
        }
    # vLLM's and SGLang's names for the sampling settings the OpenAI API lacks
    for value, name, neutral in (
        (options.top_k, "top_k", 0),
        (options.repetition_penalty, "repetition_penalty", 1.0),
        (options.min_new_tokens, "min_tokens", 0),
        (options.stop_token_ids, "stop_token_ids", ()),
    ):
        if value is not None and value != neutral:
            body[name] = list(value) if isinstance(value, tuple) else value
    return body


def prompt_cache_key(options: GenerateOptions, prompt: str) -> str | None:
    """OpenAI's ``prompt_cache_key`` for ``prompt`` where the endpoint sends one
    (:attr:`~lakescore.udfs.options.remote.EndpointOptions.sends_prompt_cache_key`): the first 32 hex digits of the
    SHA-256 of its shared part, ``prefix_template``'s text where found
    (:meth:`~lakescore.udfs.options.generate.GenerateOptions.shared_prefix`), else its first
    ``prompt_cache_key_chars`` characters. The same for every row of a prefix, in every run: a batch line's
    ``custom_id``, which digests its body, stays the same."""
    endpoint = options.endpoint
    if endpoint is None or not endpoint.sends_prompt_cache_key:
        return None
    shared = options.shared_prefix(prompt)
    if shared is None:
        shared = prompt[: endpoint.prompt_cache_key_chars]
    return hashlib.sha256(shared.encode("utf-8")).hexdigest()[:32]


def parse_completion(
    body: Mapping[str, Any], api: str, stop: Sequence[str] = (), max_tokens: int | None = None
) -> Completion:
    """One response's :class:`Completion`, only when it is a whole, well-formed answer to the request:
    :class:`Malformed` naming what it lacks (no text, no ``finish_reason``, ``usage`` that is not two whole numbers of
    at least 0, or more completion tokens than the request's ``max_tokens``), :class:`Unfinished` for a
    ``finish_reason`` other than :data:`FINISHED`. The text is cut before the first ``stop`` string the server left in
    it (some servers keep it). An answer without ``usage`` has unknown (``None``) tokens."""
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
    except (KeyError, IndexError, TypeError):
        raise Malformed(
            f"the response holds no {'message' if api == 'chat' else 'text'}: {json.dumps(body)[:300]}"
        ) from None
    if text is not None and not isinstance(text, str):
        raise Malformed(f"the response's text is not a string: {json.dumps(text)[:100]}")
    finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
    if not isinstance(finish, str) or not finish:
        raise Malformed(f"the response has no finish_reason: {json.dumps(body)[:300]}")
    if finish not in FINISHED:
        raise Unfinished(finish)
    text = text or ""  # a model that stops at once: an empty text, finished, as in-process
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    prompt_tokens, completion_tokens = _usage(body.get("usage"), max_tokens)
    cached = cached_prompt_tokens(body.get("usage"))
    return Completion(text, finish, prompt_tokens, completion_tokens, token_logprobs(choice, api), cached)


def cached_prompt_tokens(usage: Any) -> int:
    """The prompt tokens ``usage`` says the server read from its prompt cache (``prompt_tokens_details.cached_tokens``:
    OpenAI, vLLM with ``--enable-prompt-tokens-details``); 0 where it says nothing; :class:`Malformed` when the count
    cannot be true (not a whole number, below 0, more than the prompt's tokens).

    >>> cached_prompt_tokens({"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}})
    4
    >>> cached_prompt_tokens({"prompt_tokens": 9, "prompt_tokens_details": None}), cached_prompt_tokens(None)
    (0, 0)
    """
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if value is None:
        return 0
    prompt = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 0
        or (isinstance(prompt, int) and value > prompt)
    ):
        raise Malformed(
            f"the response's usage is impossible (cached_tokens {json.dumps(value)}): {json.dumps(usage)[:200]}"
        )
    return value


def _usage(usage: Any, max_tokens: int | None) -> tuple[int | None, int | None]:
    """``usage``'s prompt and completion tokens; ``(None, None)`` when the answer has none; :class:`Malformed` when
    they cannot be true (not whole numbers, below 0, more completion tokens than were allowed)."""
    if usage is None:
        return None, None
    counts = []
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name) if isinstance(usage, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Malformed(
                f"the response's usage is impossible ({name} {json.dumps(value)}): {json.dumps(usage)[:200]}"
            )
        counts.append(value)
    if max_tokens is not None and counts[1] > max_tokens:
        raise Malformed(f"the response's usage is impossible ({counts[1]} completion tokens, {max_tokens} allowed)")
    return counts[0], counts[1]


def token_logprobs(choice: Mapping[str, Any], api: str) -> tuple[float, ...] | None:
    """The generated tokens' log-probabilities in a response's ``choice``: the chat API's
    ``logprobs.content[].logprob``, the completions API's ``logprobs.token_logprobs``; ``None`` when it holds none (a
    server that ignored the request's ``logprobs``)."""
    found = choice.get("logprobs")
    if not isinstance(found, Mapping):
        return None
    try:
        if api == "chat":
            content = found.get("content")
            return None if content is None else tuple(float(token["logprob"]) for token in content)
        values = found.get("token_logprobs")
        return None if values is None else tuple(float(v) for v in values)
    except (KeyError, TypeError, ValueError):
        return None


def api_of(settings: Any) -> str:
    """Which route a client's prompts go to: generate's ``api`` (``completions`` or ``chat``) of its endpoint or
    served engine; ``completions`` for any other settings."""
    return settings.api if isinstance(settings, (EndpointOptions, ServerOptions)) else "completions"


def completions_path(api: str) -> str:
    """The route of ``api`` under the server's ``/v1``."""
    return "/chat/completions" if api == "chat" else "/completions"


def complete(
    client: EndpointClient,
    options: GenerateOptions,
    prompt: str,
    seed: int | None = None,
    image: Mapping[str, Any] | None = None,
) -> Completion:
    """One prompt's :class:`Completion` under the generate settings ``options``, with ``image`` (a content part)
    before it where given (errors as the client's ``post``). The tokens-per-minute guess counts the prompt's text only
    (an image's tokens are the server's to count); ``usage`` settles it."""
    api = api_of(client.settings)
    body = request_body(options, client.model, api, prompt, seed, image)
    estimate = len(prompt) // ESTIMATED_CHARS_PER_TOKEN + 1 + options.max_new_tokens
    completion = client.post(
        body,
        estimate,
        lambda answer: parse_completion(answer, api, options.stop, options.max_new_tokens),
        completions_path(api),
    )
    if completion.prompt_tokens is None or completion.completion_tokens is None:
        client.stats.add(Traffic(unmetered=1))
    else:
        client.stats.add(completion_traffic(completion))
    return completion


def completion_traffic(completion: Completion) -> Traffic:
    """The tokens a metered answer's ``usage`` reported, as the client counts them."""
    return Traffic(
        tokens_in=completion.prompt_tokens or 0,
        tokens_in_cached=completion.cached_tokens,
        tokens_in_cache_write=completion.cache_write_tokens,
        tokens_out=completion.completion_tokens or 0,
    )
