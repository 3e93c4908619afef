"""The ``generate`` task: a language model over every row, reproducible, constrained, failing per row.

Each row's prompt is rendered by the job from its input columns (:func:`template_parts`), wrapped in the
tokenizer's chat template when it has one, tokenized as the tokenizer gives it, and then either

* generated from: greedy (``temperature`` 0, equal to ``model.generate(do_sample=False)`` on the row
  alone up to near-ties), or sampled from its own generator seeded from (``seed``, the row's key), so
  a row's text does not depend on its batch; cut before the first ``stop`` string; with ``json_schema``,
  constrained so the text is JSON that validates (:mod:`lakescore.udfs.heads.decoding`); or
* with ``choices``, scored: each choice's log-probability as a continuation of the prompt (summed over its tokens,
  or their mean per token with ``choice_score: mean``), the best one returned.

Decoder-only (``AutoModelForCausalLM``) and encoder-decoder (``AutoModelForSeq2SeqLM``) models, picked
by the model's ``config.is_encoder_decoder``. Rows are batched by the core of
:mod:`lakescore.udfs.batching` (length-sorted, left-padded, the token budget counting prompt plus
``max_new_tokens``, out-of-memory back-off) through :func:`score_prompts`, which adds the two per-row
failures of generation: ``prompt_too_long`` and ``generation_error``, and with ``json_schema`` a text that is not
the schema's JSON (``json_incomplete``: cut at ``max_new_tokens``; ``json_invalid``), never published. Greedy rows
whose prompts share ``share_prefix_tokens`` leading tokens or more are batched together and the shared tokens
computed once per batch (:mod:`lakescore.udfs.heads.prefixes` finds the groups).

This module imports no model library at import time: :class:`GenerateOptions` hangs off the
:class:`~lakescore.udfs.models.model_source.ModelSpec` the driver builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from lakescore.schemas.reasons import (
    EMPTY_PROMPT,
    GENERATION_ERROR,
    JSON_INCOMPLETE,
    JSON_INVALID,
    NULL_INPUT,
    PROMPT_TOO_LONG,
)
from lakescore.schemas.traffic import Traffic
from lakescore.udfs.arrow_columns import python_column, scalar_column, string_column
from lakescore.udfs.batching import (
    AdaptiveBudget,
    BatchPolicy,
    Scored,
    plan_batches,
    plan_grouped_batches,
    score_present,
    take_rows,
)
from lakescore.udfs.heads.prefixes import PrefixGroup, group_of_rows, prefix_groups
from lakescore.udfs.heads.seeds import row_seed  # re-exported: callers took it from the head
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.options.generate import (  # re-exported: the head's settings, importable without numpy
    CHAT_TEMPLATE_MODES,
    FINISH_REASONS,
    TRUNCATE_MODES,
    GenerateOptions,
    template_columns,
    template_parts,
)

__all__ = [
    "GenerateOptions",
    "Generation",
    "Generator",
    "CHAT_TEMPLATE_MODES",
    "TRUNCATE_MODES",
    "FINISH_REASONS",
    "template_parts",
    "template_columns",
    "score_prompts",
    "token_counts",
    "token_traffic",
    "load_generator",
    "generation_columns",
    "row_seed",
    "json_failure",
    "refuse_unfinished_json",
]


class Generation(NamedTuple):
    """One row's outcome: the task's own output columns, in schema order, then the new token ids themselves
    (EOS included; with ``choices``, the chosen choice's), which no column holds, with ``logprobs`` each new
    token's log-probability (the ``token_logprobs`` column), the prompt tokens a server read from its prompt cache
    (no column: the run's ``tokens_in_cached``; in-process, the prompt tokens a shared prefix spared it) and those it
    wrote to it (the run's ``tokens_in_cache_write``; 0 but from Anthropic). The token counts are ``None`` where a
    server's answer reported no ``usage``."""

    text: str
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    choice_logprobs: tuple[float, ...] | None = None
    token_ids: tuple[int, ...] = ()
    token_logprobs: tuple[float, ...] | None = None
    cached_tokens: int = 0
    cache_write_tokens: int = 0


PROMPT_TOKENS = "prompt_tokens"
"""Feature key: the row's prompt length in tokens (after any left truncation), shaped (n,)."""
OVERFLOW = "overflow_tokens"
"""Feature key: a too-long prompt's full length in tokens (0 for a prompt that fits), shaped (n,)."""
ROW_KEY = "row_key"
"""Feature key: the row's key (numpy object array): what its sampling generator is seeded from."""


class Generator:
    """The generate head (:class:`~lakescore.udfs.batching.TextHead`): prompts -> one :class:`Generation` per row.

    ``tokenize`` renders the chat template and pads on the left; ``forward`` generates (or scores ``choices``) for
    one batch; ``columns`` gives ``generated_text``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``,
    ``choice_logprobs`` and, with ``logprobs``, ``token_logprobs``. Run it through :func:`score_prompts`, whose budget
    counts the new tokens too.
    """

    padding_side = "left"
    MAX_TOKENS_CPU = 8192
    """The CPU token budget when ``scoring.max_batch_tokens`` is unset. A row costs its prompt plus its new tokens,
    and decode steps over a few rows leave a CPU's matrix units idle, so generation wants batches an encoder's budget
    would cut small (bench W4 in BENCHMARKS.md)."""

    def default_max_tokens(self, device: str) -> int:
        """This head's token budget on ``device`` when none is configured."""
        from lakescore.udfs.batching import default_max_tokens

        return self.MAX_TOKENS_CPU if device.split(":")[0] == "cpu" else default_max_tokens(device)

    def __init__(self, model, tokenizer, options: GenerateOptions, context: int | None, output_types) -> None:
        from lakescore.udfs.heads.decoding import Decoding

        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.encoder_decoder = bool(model.config.is_encoder_decoder)
        self.use_chat_template = options.chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))
        self.context = context
        # the most tokens a prompt may have: a decoder's context holds the new tokens too, an encoder's the prompt only
        self.prompt_limit = (
            None if context is None else (context if self.encoder_decoder else context - options.max_new_tokens)
        )
        self.pad_token_id = _first(tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        self.decoding = Decoding(model, tokenizer, options)
        self.choice_ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in options.choices]
        self._output_types = output_types

    # -- prompts and tokens ------------------------------------------------------------------------------------

    def prompt_text(self, prompt: str) -> str:
        """The text the model reads for ``prompt``: through the chat template (with the system prompt) when used,
        else the system prompt and the prompt separated by a blank line."""
        system = self.options.system_prompt
        if self.use_chat_template:
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [
                {"role": "user", "content": prompt}
            ]
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return prompt if system is None else f"{system}\n\n{prompt}"

    def prompt_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        """Each prompt's token ids as the tokenizer gives them: a chat template carries its own special tokens
        (``apply_chat_template(tokenize=True)`` adds none), a plain prompt gets the tokenizer's."""
        texts = [self.prompt_text(p) for p in prompts]
        return list(self.tokenizer(texts, add_special_tokens=not self.use_chat_template)["input_ids"])

    def tokenize(self, prompts: list[str], keys: Sequence[str] | None = None) -> dict[str, Any]:
        """Left-padded ``input_ids`` / ``attention_mask`` (int64 numpy) plus, per row, :data:`PROMPT_TOKENS`,
        :data:`OVERFLOW` (a prompt longer than :attr:`prompt_limit`, kept or left-truncated per ``truncate``) and
        :data:`ROW_KEY` (``keys``, else the prompt itself: identical prompts then sample identically)."""
        ids = self.prompt_ids(prompts)
        overflow = np.zeros(len(ids), dtype=np.int64)
        limit = self.prompt_limit
        if limit is not None:
            for i, row in enumerate(ids):
                if len(row) > limit:
                    overflow[i] = len(row)
                    ids[i] = _cut_left(row, limit, self.tokenizer.bos_token_id)
            if self.options.truncate == "left":
                overflow[:] = 0
        return self.padded(ids, overflow, list(keys) if keys is not None else list(prompts))

    def padded(self, ids: Sequence[Sequence[int]], overflow: np.ndarray, keys: Sequence[str]) -> dict[str, Any]:
        """Prompts' token ``ids`` left-padded into ``input_ids`` / ``attention_mask`` (int64 numpy), with per row
        :data:`PROMPT_TOKENS`, ``overflow`` as :data:`OVERFLOW` and ``keys`` as :data:`ROW_KEY`."""
        lengths = np.fromiter((len(r) for r in ids), dtype=np.int64, count=len(ids))
        width = max(1, int(lengths.max())) if len(ids) else 1
        input_ids = np.full((len(ids), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for i, row in enumerate(ids):
            if len(row):
                input_ids[i, width - len(row) :] = row
                mask[i, width - len(row) :] = 1
        row_keys = np.empty(len(ids), dtype=object)
        row_keys[:] = list(keys)
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            PROMPT_TOKENS: lengths,
            OVERFLOW: overflow,
            ROW_KEY: row_keys,
        }

    def row_cost(self, features: Mapping[str, Any]) -> np.ndarray:
        """Tokens a row holds in memory while it runs, what the token budget counts: prompt plus new tokens (the KV
        cache), or with ``choices`` each choice's full sequence."""
        prompt = np.asarray(features[PROMPT_TOKENS], dtype=np.int64)
        if self.choice_ids:
            return len(self.choice_ids) * (prompt + max(len(c) for c in self.choice_ids))
        return prompt + self.options.max_new_tokens

    # -- the forward -------------------------------------------------------------------------------------------

    def prefill(self, features: Mapping[str, Any]) -> dict[str, Any] | None:
        """More inputs the model reads with a batch's prompts only (a vision-language model's image tensors); ``None``
        for text."""
        return None

    def forward(self, features: Mapping[str, Any]) -> np.ndarray:
        """One :class:`Generation` per row of a batch, as a 1-D object array."""
        from lakescore.udfs.heads.decoding import choice_logprobs, generate

        prompt_tokens = np.asarray(features[PROMPT_TOKENS])
        prefill = self.prefill(features)
        rows = np.empty(len(prompt_tokens), dtype=object)
        if self.choice_ids:
            logprobs = choice_logprobs(
                self.model,
                features["input_ids"],
                features["attention_mask"],
                self.choice_ids,
                self.pad_token_id,
                prefill,
            )
            if (
                self.options.choice_score == "mean"
            ):  # per token: a choice of more tokens is not marked down for its length
                logprobs = logprobs / np.array([len(c) for c in self.choice_ids], dtype=np.float64)
            for i, row in enumerate(logprobs):
                best = int(np.argmax(row))
                rows[i] = Generation(
                    self.options.choices[best],
                    "choice",
                    int(prompt_tokens[i]),
                    len(self.choice_ids[best]),
                    tuple(float(v) for v in row),
                    tuple(self.choice_ids[best]),
                )
            return rows
        shared = self.shared_prefixes(features) if prefill is None else []
        decoded = generate(
            self.model,
            features["input_ids"],
            features["attention_mask"],
            list(features[ROW_KEY]),
            self.decoding,
            prefill,
            shared,
        )
        skipped = np.zeros(len(prompt_tokens), dtype=np.int64)
        for group in shared:  # the first row computes the prefix, the others read it
            skipped[list(group.rows[1:])] = group.length
        for i, row in enumerate(decoded):
            rows[i] = Generation(
                row.text,
                row.finish_reason,
                int(prompt_tokens[i]),
                len(row.ids),
                None,
                tuple(row.ids),
                None if row.logprobs is None else tuple(row.logprobs),
                int(skipped[i]),
            )
        return rows

    @property
    def share_prefix_tokens(self) -> int:
        """The fewest leading tokens rows must share to have them computed once (``generate.share_prefix_tokens``);
        0 where sharing is off: sampled rows (a draw near a boundary could tell rounding apart), ``choices`` and
        encoder-decoder models compute every prompt whole."""
        options = self.options
        if not options.greedy or self.choice_ids or self.encoder_decoder:
            return 0
        return options.share_prefix_tokens

    def shared_prefixes(self, features: Mapping[str, Any]) -> list[PrefixGroup]:
        """The groups of a batch's rows (``features``) whose prompts share :attr:`share_prefix_tokens` leading tokens
        at least (none when sharing is off)."""
        least = self.share_prefix_tokens
        if not least:
            return []
        ids, mask = np.asarray(features["input_ids"]), np.asarray(features["attention_mask"]).astype(bool)
        return prefix_groups([row[keep].tolist() for row, keep in zip(ids, mask)], least)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs`` (:func:`generation_columns`)."""
        return generation_columns(outputs, ok, self._output_types, self.options.logprobs)

    def score_prompts(
        self,
        prompts: Sequence[str | None],
        policy: BatchPolicy | AdaptiveBudget,
        keys: Sequence[str] | None = None,
        features: Mapping[str, Any] | None = None,
    ) -> Scored:
        """:func:`score_prompts` through this head: what the prompt runner calls, whichever engine the head is."""
        return score_prompts(prompts, self, policy, keys, features)

    def score(self, prompts: list[str]) -> np.ndarray:
        """Convenience for small lists: one padded batch (the job uses :func:`score_prompts`)."""
        return self.forward(self.tokenize(prompts))

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """How close ``outputs`` are to ``reference`` (same rows): the fraction of rows with the same text (rows either
        could not score are left out)."""
        same = [
            a.text == b.text
            for a, b in zip(reference, outputs)
            if isinstance(a, Generation) and isinstance(b, Generation)
        ]
        return {"agreement": float(np.mean(same)) if same else 1.0}


def generation_columns(
    outputs: np.ndarray, ok: np.ndarray, types: Sequence[pa.DataType], logprobs: bool = False
) -> tuple[pa.Array, ...]:
    """The generate task's output columns for :class:`Generation` ``outputs``, in output-schema order, of every engine
    (rows not ``ok`` are null; ``choice_logprobs`` is null on every row without ``choices``); with ``logprobs`` (the
    run asked for ``token_logprobs``: ``types`` has its type last) that column too."""
    ok = np.asarray(ok, dtype=bool)
    rows = [o if good else Generation("", "", 0, 0) for o, good in zip(outputs, ok)]
    metered = np.array([r.prompt_tokens is not None for r in rows], dtype=bool)
    columns = (
        string_column([r.text for r in rows], ok),
        string_column([r.finish_reason for r in rows], ok),
        # a remote answer without usage: its token counts are unknown (null), not 0
        scalar_column(np.array([r.prompt_tokens or 0 for r in rows], dtype=np.int64), ok & metered, types[2]),
        scalar_column(np.array([r.completion_tokens or 0 for r in rows], dtype=np.int64), ok & metered, types[3]),
        python_column([None if r.choice_logprobs is None else list(r.choice_logprobs) for r in rows], ok, types[4]),
    )
    if not logprobs:
        return columns
    return (*columns, python_column([list(r.token_logprobs or ()) for r in rows], ok, types[5]))


def _first(*values):
    return next(v for v in values if v is not None)


def _cut_left(ids: list[int], limit: int, bos: int | None) -> list[int]:
    """The last ``limit`` tokens of ``ids``, keeping a leading BOS as the tokenizer's own left truncation does."""
    if bos is not None and ids and ids[0] == bos and limit > 1:
        return [bos] + ids[len(ids) - limit + 1 :]
    return ids[len(ids) - limit :]


def score_prompts(
    prompts: Sequence[str | None],
    head: Generator,
    policy: BatchPolicy | AdaptiveBudget,
    keys: Sequence[str] | None = None,
    features: Mapping[str, Any] | None = None,
) -> Scored:
    """Generate for ``prompts`` through ``head`` in token-budget batches: :func:`~lakescore.udfs.batching.score_texts`
    for generation.

    ``keys[i]`` seeds row *i*'s sampling (the runner passes the row id as text). Null prompts are ``null_input``;
    a prompt whose tokens plus ``max_new_tokens`` exceed the model's context is ``prompt_too_long`` (unless
    ``truncate: left``), one with no token at all ``empty_prompt``; a batch that raises is retried row by row and a row
    that raises alone is ``generation_error``, its neighbours unaffected. ``features`` may hold ``head.tokenize`` of the
    non-null prompts (and their keys), done ahead.
    """
    n = len(prompts)
    valid = np.fromiter((isinstance(p, str) for p in prompts), dtype=bool, count=n)
    present = np.flatnonzero(valid)
    if features is None:
        texts = [prompts[i] for i in present]
        features = head.tokenize(texts, None if keys is None else [keys[i] for i in present]) if texts else None
    if features is None:
        return Scored(np.zeros((n, 0), dtype=np.float32), [NULL_INPUT] * n, [None] * n)
    refused = _refused_prompts(features, head)
    fits = np.ones(len(present), dtype=bool)
    fits[list(refused)] = False
    runs = valid.copy()
    runs[present[~fits]] = False
    width = int(np.asarray(features["attention_mask"]).shape[1])
    fitting = take_rows(features, np.flatnonzero(fits), width, head.padding_side)

    def take(rows: np.ndarray, _cost: int) -> dict[str, Any]:  # the core's width is the cost; trim to the prompts
        return take_rows(fitting, rows, max(1, int(fitting[PROMPT_TOKENS][rows].max())), head.padding_side)

    groups = head.shared_prefixes(fitting) if len(fitting[PROMPT_TOKENS]) > 1 else []
    group_of = group_of_rows(len(fitting[PROMPT_TOKENS]), groups)

    def plan(lengths: np.ndarray, budget: BatchPolicy) -> list[np.ndarray]:  # rows sharing a prefix batched together
        return plan_grouped_batches(lengths, group_of, budget)

    scored = score_present(
        runs,
        head.row_cost(fitting),
        take,
        head.forward,
        policy,
        invalid_reason=NULL_INPUT,
        error_reason=GENERATION_ERROR,
        plan=plan if groups else plan_batches,
    )
    for j, (reason, error) in refused.items():
        scored.reasons[present[j]], scored.errors[present[j]] = reason, error
    return refuse_unfinished_json(scored, head.options.json_schema)


def json_failure(row: Generation, json_schema: str) -> tuple[str, str] | None:
    """Why a ``json_schema`` run's ``row`` is not its answer, as ``(reason, error)``, or ``None`` when its text is JSON
    that validates: ``json_incomplete`` for a text cut at ``max_new_tokens`` (``finish_reason`` ``length``),
    ``json_invalid`` for a finished text that is not the schema's JSON (a ``stop`` string cut it, or a server ignored
    the schema). The error ends with the text itself, whole, so the errors table keeps what the model wrote."""
    import json

    from jsonschema import ValidationError, validate

    if row.finish_reason == "length":
        return JSON_INCOMPLETE, (
            f"the text reached max_new_tokens ({row.completion_tokens} tokens) before its JSON was "
            f"complete; the cut text: {row.text}"
        )
    try:
        validate(json.loads(row.text), json.loads(json_schema))
    except (ValueError, ValidationError) as exc:
        message = exc.message if isinstance(exc, ValidationError) else str(exc)
        return (
            JSON_INVALID,
            f"the text is not JSON valid against generate.json_schema: {message[:300]}; the text: {row.text}",
        )
    return None


def refuse_unfinished_json(scored: Scored, json_schema: str | None, scrub=None) -> Scored:
    """``scored`` with every generated row that :func:`json_failure` finds not the ``json_schema``'s answer turned into
    that row's dead letter (``scrub``: what an error passes through before the errors table, for a server's text); as
    it is without a schema. In-process and over a server alike: a JSON run never publishes a text that is not its
    JSON."""
    if json_schema is None:
        return scored
    for i, row in enumerate(scored.outputs):
        if scored.reasons[i] is None and isinstance(row, Generation):
            failure = json_failure(row, json_schema)
            if failure is not None:
                scored.reasons[i], scored.errors[i] = failure[0], failure[1] if scrub is None else scrub(failure[1])
    return scored


def _refused_prompts(features: Mapping[str, Any], head: Generator) -> dict[int, tuple[str, str]]:
    """Rows of ``features`` that cannot run, with reason and error: ``prompt_too_long`` (over the context with
    ``truncate: none``) and ``empty_prompt`` (no token at all: a tokenizer that adds no special tokens, on "")."""
    refused: dict[int, tuple[str, str]] = {}
    for j in np.flatnonzero(np.asarray(features[OVERFLOW]) > 0):
        refused[int(j)] = (
            PROMPT_TOO_LONG,
            (
                f"the prompt has {int(features[OVERFLOW][j])} tokens; with max_new_tokens "
                f"{head.options.max_new_tokens} it "
                f"exceeds the model's context of {head.context} tokens (generate.truncate: left cuts it instead)"
            ),
        )
    for j in np.flatnonzero(np.asarray(features[PROMPT_TOKENS]) == 0):
        refused[int(j)] = (EMPTY_PROMPT, "the prompt has no tokens; a language model needs at least one to continue")
    return refused


def token_counts(outputs: np.ndarray, ok: np.ndarray) -> tuple[int, int]:
    """Prompt tokens in and completion tokens out over the scored rows of one batch: the run's token figures."""
    counted = token_traffic(outputs, ok)
    return counted.tokens_in, counted.tokens_out


def token_traffic(outputs: np.ndarray, ok: np.ndarray) -> Traffic:
    """The tokens of the scored rows of one batch (prompt tokens in, those read from a server's prompt cache and those
    written to it, tokens out): the run's token figures."""
    rows = [o for o, good in zip(outputs, np.asarray(ok, dtype=bool)) if good]
    return Traffic(
        tokens_in=sum(r.prompt_tokens or 0 for r in rows),
        tokens_in_cached=sum(r.cached_tokens for r in rows),
        tokens_in_cache_write=sum(r.cache_write_tokens for r in rows),
        tokens_out=sum(r.completion_tokens or 0 for r in rows),
    )


def load_generator(spec: ModelSpec, model_dir: Path) -> Generator:
    """Load the language model in ``model_dir`` as ``spec`` configures it, with ``spec.generate``'s options.

    ``AutoModelForSeq2SeqLM`` when the config says ``is_encoder_decoder``, else ``AutoModelForCausalLM``; the
    directory's own tokenizer; safetensors only unless ``spec.allow_pickle``, remote code only with
    ``spec.trust_remote_code``, files from ``model_dir`` only. The context is the smallest of ``spec.max_seq_length``,
    the model's positions and the tokenizer's ``model_max_length``, where set. Raises
    :class:`~lakescore.udfs.models.model_source.ModelSourceError` for refused weights, its
    :class:`~lakescore.udfs.models.model_source.UnfitModelError` for a model that is no language model (weights of its
    head missing), a ``max_new_tokens`` that leaves no room for a prompt or a tokenizer the grammar library cannot use,
    and ``ValueError`` for a ``json_schema`` the grammar library refuses.
    """
    from transformers import AutoConfig

    from lakescore.udfs.heads.hf_models import load_tokenizer
    from lakescore.udfs.models.backends import ModelKind, load_torch_model
    from lakescore.udfs.models.model_source import refuse_pickle_weights, require_directory
    from lakescore.udfs.options.generate import model_context, require_room
    from lakescore.udfs.registry import get_task

    options = spec.generate or GenerateOptions()
    if spec.backend != "torch":
        raise ValueError(f"the generate task runs on the torch backend, not {spec.backend!r}")
    require_directory(model_dir, spec.task)
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=spec.trust_remote_code)
    auto_class = "AutoModelForSeq2SeqLM" if getattr(config, "is_encoder_decoder", False) else "AutoModelForCausalLM"
    tokenizer = load_tokenizer(spec, model_dir)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    context = model_context(positions, spec.max_seq_length, tokenizer.model_max_length)
    require_room(spec, model_dir, context)
    model = load_torch_model(spec, model_dir, ModelKind(auto_class, "logits"))
    return Generator(model, tokenizer, options, context, get_task(spec.task).output_arrow_types_for(options))
