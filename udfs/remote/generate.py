"""The ``generate`` head over an OpenAI-compatible server: an endpoint (``generate.endpoint``) or the engine served on
this host (``generate.server``, :mod:`lakescore.udfs.remote.engine`).

It takes the place of :class:`~lakescore.udfs.heads.generate.Generator` behind the prompt runner: no tokenizer and no
weights here, each present prompt one request (:mod:`lakescore.udfs.remote.completions`), the rows of a batch in
flight together (``concurrency`` of them). The output columns are the in-process head's
(:func:`~lakescore.udfs.heads.generate.generation_columns`);
``prompt_tokens`` and ``completion_tokens`` are what the server's ``usage`` reports. A row the server fails is
``endpoint_error``, a text that is not the ``json_schema``'s JSON ``json_incomplete`` or ``json_invalid``; the run stops
on :class:`~lakescore.udfs.remote.answers.EndpointDown`.

The executors' preflight (:meth:`EndpointGenerator.score`) sends one request with every setting of the run: a setting
the server refuses, or ignores where the answer shows it (no log-probabilities, text that is not the schema's JSON),
is refused there, in one line, before any row is sent.

:class:`GenerateLines` are the same requests as lines of a provider's Batch API (``generate.endpoint.batch``,
:class:`~lakescore.udfs.remote.batch_lines.BatchLines`), each result read as an answer is read here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lakescore.schemas.reasons import NULL_INPUT
from lakescore.udfs.batching import Scored
from lakescore.udfs.heads.generate import Generation, generation_columns, json_failure, refuse_unfinished_json
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.options.remote import MESSAGES_API
from lakescore.udfs.remote import messages
from lakescore.udfs.remote.answers import EndpointDown, EndpointError, EndpointRefused, Unhonoured, what_happened
from lakescore.udfs.remote.batch_lines import LineAnswer
from lakescore.udfs.remote.client import EndpointClient
from lakescore.udfs.remote.completions import api_of, complete
from lakescore.udfs.remote.head import RemoteHead, endpoint_identity, models_listing, open_client

if TYPE_CHECKING:
    from lakescore.udfs.remote.batch_kinds import BatchKind
    from lakescore.udfs.remote.engine import EngineServer

__all__ = [
    "EndpointGenerator",
    "load_remote_generator",
    "endpoint_identity",
    "models_listing",
    "GenerateLines",
    "generate_lines",
    "row_body",
]

PROMPTS, KEYS = "prompts", "keys"
"""Feature keys: the present prompts and their row keys (what sampled rows' seeds derive from)."""


class EndpointGenerator(RemoteHead):
    """The generate head for prompts answered by ``client`` under the generate settings ``options``: ``tokenize``
    keeps the prompts, ``score_prompts`` sends them, ``columns`` writes the task's output columns."""

    padding_side = "left"

    def __init__(
        self,
        client: EndpointClient,
        options: GenerateOptions,
        output_types: Sequence[Any],
        revision: str | None = None,
        server: EngineServer | None = None,
    ) -> None:
        self.options, self._output_types = options, output_types
        # The wire format of the client's API: Anthropic's Messages, or the OpenAI completions and chat APIs.
        self._complete = messages.complete if api_of(client.settings) == MESSAGES_API else complete
        super().__init__(client, revision, server)

    # -- the runner's interface ------------------------------------------------------------------------------------

    def tokenize(self, prompts: list[str], keys: Sequence[str] | None = None) -> dict[str, Any]:
        """The prompts as they are (the server tokenizes) and each row's key."""
        rows = np.empty(len(prompts), dtype=object)
        rows[:] = list(prompts)
        row_keys = np.empty(len(prompts), dtype=object)
        row_keys[:] = list(keys) if keys is not None else list(prompts)
        return {PROMPTS: rows, KEYS: row_keys}

    def row_cost(self, features: Mapping[str, Any]) -> np.ndarray:
        """One per row: the server plans its own batches."""
        return np.ones(len(features[PROMPTS]), dtype=np.int64)

    def score_prompts(
        self,
        prompts: Sequence[str | None],
        policy: Any,
        keys: Sequence[str] | None = None,
        features: Mapping[str, Any] | None = None,
    ) -> Scored:
        """Send every present prompt, ``concurrency`` at a time: each row's :class:`Generation`, ``null_input`` for a
        null prompt, ``endpoint_error`` with the status and message for a row the server failed.
        :class:`EndpointDown` (the run stops) when the endpoint failed too many requests in a row."""
        reasons: list[str | None] = [None if isinstance(p, str) else NULL_INPUT for p in prompts]
        present = [i for i, reason in enumerate(reasons) if reason is None]
        sent = self.send(prompts, lambda i: self._one(prompts[i], None if keys is None else keys[i]), present, reasons)
        return refuse_unfinished_json(sent, self.options.json_schema, self.client.scrub)

    def _one(self, prompt: str, key: str | None, image: Mapping[str, Any] | None = None) -> Generation:
        """One row's request (``image``: a content part sent before the prompt) and its :class:`Generation`."""
        seed = None
        if not self.options.greedy:
            from lakescore.udfs.heads.seeds import row_seed

            seed = row_seed(self.options.seed, "" if key is None else str(key))
        completion = self._complete(self.client, self.options, prompt, seed, image)
        if self.options.logprobs and completion.token_logprobs is None:
            raise Unhonoured("generate.logprobs", "the response holds no log-probabilities (the request's logprobs)")
        return Generation(
            completion.text,
            completion.finish_reason,
            completion.prompt_tokens,
            completion.completion_tokens,
            token_logprobs=completion.token_logprobs if self.options.logprobs else None,
            cached_tokens=completion.cached_tokens,
            cache_write_tokens=completion.cache_write_tokens,
        )

    def _check_json(self, row: Generation) -> None:
        """The preflight's check: a finished text under ``json_schema`` that is not the schema's JSON shows the server
        ignored ``response_format`` (:class:`Unhonoured`); a text cut at ``max_new_tokens`` shows nothing. A row's text
        is checked after its batch, :func:`~lakescore.udfs.heads.generate.refuse_unfinished_json`."""
        if self.options.json_schema is None or row.finish_reason == "length":
            return
        failure = json_failure(row, self.options.json_schema)
        if failure is not None:
            raise Unhonoured("generate.json_schema (response_format)", failure[1][:500])

    def columns(self, outputs: np.ndarray, ok: np.ndarray):
        return generation_columns(outputs, ok, self._output_types, self.options.logprobs)

    def score(self, prompts: list[str]) -> np.ndarray:
        """The executors' preflight: ``prompts`` sent with every setting of the run; :class:`EndpointRefused` in one
        line when the server refuses one, or its answer shows it ignored one."""
        outputs = np.empty(len(prompts), dtype=object)
        for i, prompt in enumerate(prompts):
            outputs[i] = self._preflight_one(prompt)
        return outputs

    def _preflight_one(self, prompt: str, image: Mapping[str, Any] | None = None) -> Generation:
        where = self.where
        try:
            row = self._one(prompt, prompt, image)
            self._check_json(row)
            return row
        except EndpointDown as exc:
            raise EndpointRefused(str(exc)) from None
        except Unhonoured as exc:
            raise EndpointRefused(f"{where} does not honour {exc.setting}: {exc.message}") from None
        except EndpointError as exc:
            raise EndpointRefused(
                self.not_served(exc) or f"{where} {what_happened(exc, self.client.settings.max_retries)}"
            ) from None

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        from lakescore.udfs.heads.generate import Generator

        return Generator.fidelity(reference, outputs)


def load_remote_generator(spec: ModelSpec, model_dir: Path | None, head: type = EndpointGenerator) -> EndpointGenerator:
    """The ``head`` (an :class:`EndpointGenerator` class) for ``spec.generate.endpoint`` (``model_dir`` ``None``: no
    files here), or for ``spec.generate.server``: this host's engine serving ``model_dir``, started when no process of
    the host has started it yet.
    :class:`EndpointRefused` for a setting no request can carry, or a key named but not set;
    :class:`~lakescore.udfs.remote.engine.EngineStartError` for an engine that does not come up."""
    from lakescore.udfs.registry import get_task

    options = spec.generate
    if options is None:
        raise ValueError(f"task {spec.task!r}: a remote generator needs the spec's generate options")
    types = get_task(spec.task).output_arrow_types_for(options)
    client, engine = open_client(options.endpoint, options.server, model_dir)
    revision = options.endpoint.revision if options.endpoint is not None else spec.revision
    return head(client, options, types, revision, server=engine)


def row_body(options: Any, model: str, api: str | BatchKind, prompt: str, key: str) -> dict[str, Any]:
    """The request the per-row path sends for a row keyed ``key`` (its seed, for sampled rows, from that key), through
    ``api`` (an OpenAI API's name) or a provider kind's wire."""
    from lakescore.udfs.remote.batch_kinds import OpenAIBatches

    seed = None
    if not options.greedy:
        from lakescore.udfs.heads.seeds import row_seed

        seed = row_seed(options.seed, key)
    kind = OpenAIBatches(api, "") if isinstance(api, str) else api
    return kind.request(options, model, prompt, seed)


@dataclass(frozen=True)
class GenerateLines:
    """``generate.endpoint.batch``'s lines: ``options`` the run's ``generate`` section, ``model`` the endpoint's,
    ``output_types`` the task's output columns' Arrow types, ``kind`` the provider's batch API, whose wire a row's
    request is written and its answer read in (OpenAI's completions or chat, Anthropic's messages)."""

    options: Any
    model: str
    api: str
    output_types: tuple[pa.DataType, ...]
    kind: BatchKind

    def body(self, text: str, key: str) -> dict[str, Any]:
        return row_body(self.options, self.model, self.kind, text, key)

    def answer(self, body: Mapping[str, Any]) -> LineAnswer:
        options = self.options
        completion = self.kind.parse(body, options)
        if options.logprobs and completion.token_logprobs is None:
            raise Unhonoured("generate.logprobs", "the response holds no log-probabilities (the request's logprobs)")
        generation = Generation(
            completion.text,
            completion.finish_reason,
            completion.prompt_tokens,
            completion.completion_tokens,
            token_logprobs=completion.token_logprobs if options.logprobs else None,
            cached_tokens=completion.cached_tokens,
            cache_write_tokens=completion.cache_write_tokens,
        )
        # cut or invalid JSON: the per-row path's dead letter, its text kept
        failure = json_failure(generation, options.json_schema) if options.json_schema else None
        return LineAnswer(
            generation,
            generation.prompt_tokens,
            generation.completion_tokens or 0,
            failure,
            generation.cached_tokens,
            generation.cache_write_tokens,
        )

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> Sequence[pa.Array]:
        return generation_columns(outputs, ok, self.output_types, self.options.logprobs)


def generate_lines(spec: ModelSpec, output_types: Sequence[pa.DataType]) -> GenerateLines:
    """The run's :class:`GenerateLines` (``spec.generate.endpoint`` set; ``output_types``: its output columns')."""
    from lakescore.udfs.remote.batch_kinds import batch_kind

    options = spec.generate
    assert options is not None and options.endpoint is not None
    endpoint = options.endpoint
    kind = batch_kind(endpoint.url, endpoint.api)
    return GenerateLines(options, endpoint.model, endpoint.api, tuple(output_types), kind)
