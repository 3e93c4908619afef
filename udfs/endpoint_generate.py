"""The ``generate`` head over an OpenAI-compatible server: an endpoint (``generate.endpoint``) or the engine served on
this host (``generate.server``, :mod:`lakescore.udfs.engine_server`).

It takes the place of :class:`~lakescore.udfs.heads.generate.Generator` behind the prompt runner: no tokenizer and no
weights here, each present prompt one request (:mod:`lakescore.udfs.endpoint`), the rows of a batch in flight together
(``concurrency`` of them). The output columns are the in-process head's (:func:`~lakescore.udfs.heads.generate.generation_columns`);
``prompt_tokens`` and ``completion_tokens`` are what the server's ``usage`` reports. A row the server fails is
``endpoint_error``; the run stops on :class:`~lakescore.udfs.endpoint.EndpointDown`.

The executors' preflight (:meth:`EndpointGenerator.score`) sends one request with every setting of the run: a setting
the server refuses, or ignores where the answer shows it (no log-probabilities, text that is not the schema's JSON),
is refused there, in one line, before any row is sent.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from lakescore.udfs.batching import Scored
from lakescore.udfs.endpoint import (
    Completion, EndpointClient, EndpointDown, EndpointError, EndpointRefused, Reply, Unhonoured,
)
from lakescore.udfs.endpoint_options import MODELS_LISTING
from lakescore.udfs.heads.generate import Generation, generation_columns

__all__ = [
    "EndpointGenerator", "endpoint_identity", "load_remote_generator", "models_listing", "canonical_entry", "canonical_json",
]

PROMPTS, KEYS = "prompts", "keys"
"""Feature keys: the present prompts and their row keys (what sampled rows' seeds derive from)."""


PER_ANSWER_S = 60.0
"""A ``created`` this close to the ``/v1/models`` answer's own time is the answer's time, not the model's (vLLM's and
LMDeploy's servers, for two, stamp every answer with the time it was made): it is left out of the identity."""


def canonical_json(value: Any) -> str:
    """``value`` as one stable JSON text: keys sorted, no blanks, characters as they are. Equal values give equal texts
    whatever order or layout the server wrote them in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_entry(entry: Mapping[str, Any], answered_at: float) -> dict[str, Any]:
    """A ``/v1/models`` entry as the model's identity takes it: every field the server gives (``id``, ``created``,
    ``owned_by``, ``root``, ``max_model_len``, ...) but those made afresh for each answer, which would make every run
    look like a new model: ``created`` when it is within :data:`PER_ANSWER_S` of ``answered_at`` (the answer's
    ``Date``), and the ``id`` and ``created`` of each ``permission`` entry (vLLM draws them per answer)."""
    kept = json.loads(json.dumps(dict(entry)))  # plain JSON values: what the report and the commit metadata hold
    created = kept.get("created")
    if isinstance(created, (int, float)) and not isinstance(created, bool) and abs(created - answered_at) <= PER_ANSWER_S:
        del kept["created"]
    if isinstance(kept.get("permission"), list):
        kept["permission"] = [{k: v for k, v in p.items() if k not in ("id", "created")} if isinstance(p, dict) else p
                              for p in kept["permission"]]
    return kept


def models_listing(reply: Optional[Reply], model: str) -> str:
    """What ``/v1/models`` says of ``model``, as canonical JSON (:func:`canonical_json`): ``{"answered": false}`` when
    the server did not answer it (404, an error, not JSON), ``{"answered": true, "entry": null}`` when its answer does
    not list the model (``transformers serve`` lists its hub cache, not what it serves), else ``{"answered": true,
    "entry": {...}}`` with the model's entry (:func:`canonical_entry`)."""
    if reply is None:
        return canonical_json({"answered": False})
    answered_at = time.time()
    date = reply.headers.get("date")
    if date:
        try:
            answered_at = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            pass
    models = reply.body.get("data") if isinstance(reply.body, Mapping) else None
    entry = next((m for m in (models if isinstance(models, list) else ())
                  if isinstance(m, Mapping) and m.get("id") == model), None)
    return canonical_json({"answered": True, "entry": None if entry is None else canonical_entry(entry, answered_at)})


def endpoint_identity(model: str, listing: str, revision: Optional[str]) -> str:
    """The digest recorded as ``model_sha256`` for a model served elsewhere: its name, what ``/v1/models`` says of it
    (``listing``, :func:`models_listing`) and the user's ``revision``. A name alone cannot prove the weights behind
    it did not change; this is what the server lets a client see."""
    facts = {"model": model, "listing": json.loads(listing), "revision": revision}
    return hashlib.sha256(canonical_json(facts).encode()).hexdigest()


class EndpointGenerator:
    """The generate head for prompts answered by ``client`` under the generate settings ``options``: ``tokenize``
    keeps the prompts, ``score_prompts`` sends them, ``columns`` writes the task's output columns."""

    padding_side = "left"

    def __init__(self, client: EndpointClient, options: Any, output_types: Sequence[Any], revision: Optional[str] = None,
                 server: Any = None) -> None:
        self.client, self.options, self._output_types = client, options, output_types
        self.revision = revision
        self.server = server
        """The engine served on this host (:class:`~lakescore.udfs.engine_server.EngineServer`), or ``None``."""
        self.pool = ThreadPoolExecutor(max_workers=client.settings.concurrency, thread_name_prefix="lakescore-endpoint")
        self.listing = self._listing()
        """What ``/v1/models`` said of the model when this head was made (:func:`models_listing`)."""
        self.sha256 = endpoint_identity(client.model, self.listing, revision)
        self.files = {MODELS_LISTING: self.listing}
        """The identity's stand-in for the model's files (a model served elsewhere has none here): part of the scoring
        spec that incremental runs compare and commit, and of the run report."""

    def _listing(self) -> str:
        """One ``GET /v1/models`` (the preflight's first request; the request that follows proves the model answers)."""
        return models_listing(self.client.get("/models"), self.client.model)

    @property
    def where(self) -> str:
        return f"endpoint {self.client.url} (model {self.client.model})"

    def is_current(self) -> bool:
        """Whether ``/v1/models`` still says what it said when this head was made: the model cache asks before it
        hands the head to a task, so a run never scores under another run's identity of the model. Only an answer
        that differs counts: one that fails now (a passing error, a server that never answers it) is no news."""
        if self.server is not None or not json.loads(self.listing)["answered"]:
            return True
        reply = self.client.get("/models")
        return reply is None or models_listing(reply, self.client.model) == self.listing

    # -- the runner's interface ------------------------------------------------------------------------------------

    def default_max_tokens(self, device: str) -> int:
        return 1 << 30  # batches are cut by the Arrow batch; the server batches the requests itself

    def tokenize(self, prompts: list[str], keys: Optional[Sequence[str]] = None) -> dict[str, Any]:
        """The prompts as they are (the server tokenizes) and each row's key."""
        rows = np.empty(len(prompts), dtype=object)
        rows[:] = list(prompts)
        row_keys = np.empty(len(prompts), dtype=object)
        row_keys[:] = list(keys) if keys is not None else list(prompts)
        return {PROMPTS: rows, KEYS: row_keys}

    def row_cost(self, features: Mapping[str, Any]) -> np.ndarray:
        """One per row: the server plans its own batches."""
        return np.ones(len(features[PROMPTS]), dtype=np.int64)

    def score_prompts(self, prompts: Sequence[Optional[str]], policy: Any, keys: Optional[Sequence[str]] = None,
                      features: Optional[Mapping[str, Any]] = None) -> Scored:
        """Send every present prompt, ``concurrency`` at a time: each row's :class:`Generation`, ``null_input`` for a
        null prompt, ``endpoint_error`` with the status and message for a row the server failed.
        :class:`EndpointDown` (the run stops) when the endpoint failed too many requests in a row."""
        n = len(prompts)
        reasons: list[Optional[str]] = [None if isinstance(p, str) else "null_input" for p in prompts]
        errors: list[Optional[str]] = [None] * n
        outputs = np.empty(n, dtype=object)
        present = [i for i in range(n) if reasons[i] is None]
        futures: dict[Future, int] = {
            self.pool.submit(self._one, prompts[i], None if keys is None else keys[i]): i for i in present
        }
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        down = next((f.exception() for f in done if isinstance(f.exception(), EndpointDown)), None)
        if down is not None:
            for future in pending:
                future.cancel()
            raise down
        for future, i in futures.items():
            error = future.exception()
            if error is None:
                outputs[i] = future.result()
            elif isinstance(error, EndpointError):
                reasons[i], errors[i] = "endpoint_error", str(error)[:2000]
            elif isinstance(error, EndpointDown):
                raise error
            else:
                reasons[i], errors[i] = "endpoint_error", f"{type(error).__name__}: {error}"[:2000]
        return Scored(outputs, reasons, errors)

    def _one(self, prompt: str, key: Optional[str]) -> Generation:
        seed = None
        if not self.options.greedy:
            from lakescore.udfs.heads.seeds import row_seed

            seed = row_seed(self.options.seed, "" if key is None else str(key))
        completion = self.client.complete(self.options, prompt, seed)
        self._check_json(completion)
        if self.options.logprobs and completion.token_logprobs is None:
            raise Unhonoured("generate.logprobs", "the response holds no log-probabilities (the request's logprobs)")
        return Generation(completion.text, completion.finish_reason, completion.prompt_tokens, completion.completion_tokens,
                          token_logprobs=completion.token_logprobs if self.options.logprobs else None)

    def _check_json(self, completion: Completion) -> None:
        """A finished text under ``json_schema`` must be JSON that validates: the row's :class:`EndpointError`
        otherwise (a text cut at ``max_new_tokens`` is kept, ``length``, as in-process)."""
        if self.options.json_schema is None or completion.finish_reason == "length":
            return
        from jsonschema import ValidationError, validate

        try:
            validate(json.loads(completion.text), json.loads(self.options.json_schema))
        except (ValueError, ValidationError) as exc:
            message = exc.message if isinstance(exc, ValidationError) else str(exc)
            raise Unhonoured("generate.json_schema (response_format)",
                             f"the text is not JSON valid against generate.json_schema: {message}"[:500]) from None

    def columns(self, outputs: np.ndarray, ok: np.ndarray):
        return generation_columns(outputs, ok, self._output_types, self.options.logprobs)

    def score(self, prompts: list[str]) -> np.ndarray:
        """The executors' preflight: ``prompts`` sent with every setting of the run; :class:`EndpointRefused` in one
        line when the server refuses one, or its answer shows it ignored one."""
        outputs = np.empty(len(prompts), dtype=object)
        for i, prompt in enumerate(prompts):
            outputs[i] = self._preflight_one(prompt)
        return outputs

    def _preflight_one(self, prompt: str) -> Generation:
        where = self.where
        try:
            return self._one(prompt, prompt)
        except EndpointDown as exc:
            raise EndpointRefused(str(exc)) from None
        except Unhonoured as exc:
            raise EndpointRefused(f"{where} does not honour {exc.setting}: {exc.message}") from None
        except EndpointError as exc:
            raise EndpointRefused(f"{where} refused the run's settings: {exc}") from None

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        from lakescore.udfs.heads.generate import Generator

        return Generator.fidelity(reference, outputs)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def load_remote_generator(spec: Any, model_dir: Optional[Path]) -> EndpointGenerator:
    """The head for ``spec.generate.endpoint`` (``model_dir`` ``None``: no files here), or for ``spec.generate.server``:
    this host's engine serving ``model_dir``, started when no process of the host has started it yet.
    :class:`EndpointRefused` for a setting no request can carry, or a key named but not set;
    :class:`~lakescore.udfs.engine_server.EngineStartError` for an engine that does not come up."""
    from lakescore.udfs.engine_server import HOST, EngineServer
    from lakescore.udfs.registry import get_task

    options = spec.generate
    endpoint, server = options.endpoint, options.server
    types = get_task(spec.task).output_arrow_types_for(options)
    if endpoint is not None:
        client = EndpointClient(endpoint, endpoint.url, endpoint.model, api_key=EndpointClient.key_from_env(endpoint))
        return EndpointGenerator(client, options, types, endpoint.revision)
    engine = EngineServer(server.engine, str(model_dir), server.args, server.startup_timeout_s, env=_engine_env())
    url = engine.url()

    def recover() -> bool:  # the engine crashed: start it again (once per process), on whatever port it then has
        if not engine.recover():
            return False
        client.url = f"http://{HOST}:{engine.port}/v1"
        return True

    client = EndpointClient(server, url, engine.name, recover=recover)
    return EndpointGenerator(client, options, types, spec.revision, server=engine)


def _engine_env() -> Optional[dict[str, str]]:
    """The engine's environment: this worker's, with ``CUDA_VISIBLE_DEVICES`` the GPU Spark gave the task (the scoring
    stage's resource profile), so the engine takes that GPU as in-process scoring does; ``None`` (inherit) without one."""
    import os

    from lakescore.udfs.models.devices import task_gpu_address

    address = task_gpu_address()
    return None if address is None else {**os.environ, "CUDA_VISIBLE_DEVICES": address}
