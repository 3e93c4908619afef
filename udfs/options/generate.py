"""The ``generate`` task's settings (the config schema's ``generate`` section) and prompt templates: the config and
the driver read them without the model runtime (:mod:`lakescore.udfs.heads.generate` is the head).

A new generate setting is one field of :class:`GenerateOptions` (its type, bounds, default, docstring and flag), plus
what the head does with it."""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from lakescore.udfs.models.json_files import NO_TOKENIZER_LIMIT, read_json
from lakescore.udfs.options.base import ConfigError, Number, Section, Strings, Text, checked, cli
from lakescore.udfs.options.remote import EndpointOptions, ServerOptions, unsupported_settings

__all__ = [
    "GenerateOptions",
    "CHAT_TEMPLATE_MODES",
    "TRUNCATE_MODES",
    "CHOICE_SCORES",
    "FINISH_REASONS",
    "template_parts",
    "template_columns",
    "prefix_end",
    "model_context",
    "require_room",
    "check_context",
]

CHAT_TEMPLATE_MODES = ("auto", "never")
TRUNCATE_MODES = ("none", "left")
CHOICE_SCORES = ("sum", "mean")
"""How ``choices`` are compared: ``sum`` of a choice's token log-probabilities (its probability as a continuation), or
their ``mean`` per token (which does not favour choices of fewer tokens)."""
FINISH_REASONS = ("stop", "length", "choice")
"""``stop``: EOS, a stop string or the end of the JSON schema; ``length``: ``max_new_tokens`` reached; ``choice``:
scored."""


def _json_text(value: Any) -> Any:
    """A JSON Schema given as a YAML mapping, as the JSON text the decoder reads."""
    return json.dumps(value) if isinstance(value, Mapping) else value


def _template_problem(template: str) -> str | None:
    try:
        template_parts(template)
    except ValueError as exc:
        return str(exc).removeprefix("generate.prompt_template ")
    return None


class GenerateOptions(Section):
    """The ``generate`` task: how each row's prompt is rendered and how the model continues it. Greedy by default, so
    a rerun writes the same text; see ``docs/generation.md``."""

    prompt_template: Annotated[Text | None, checked(_template_problem)] = Field(
        None, json_schema_extra=cli("--prompt-template", "TEMPLATE")
    )
    """Each row's prompt: ``str.format`` placeholders naming input columns, e.g. ``"Review: {body}\\nSummary:"``; a
    value is inserted as Spark casts it to a string, and a row with a null in a named column is ``null_input``.
    Default: the ``text_col`` as it is."""
    prefix_template: Annotated[Text | None, checked(_template_problem)] = Field(
        None, json_schema_extra=cli("--prefix-template", "TEMPLATE")
    )
    """The part of each row's prompt that rows share (a document, a few-shot block), as ``prompt_template``'s
    placeholders: rendered before ``prompt_template``, the two one prompt as if written as one template. Over an
    endpoint it is sent as the provider's cache hint: Anthropic's ``cache_control`` block, OpenAI's
    ``prompt_cache_key``; see ``docs/generation.md`` "Cache hints"."""
    system_prompt: Text | None = Field(None, json_schema_extra=cli("--system-prompt", "TEXT"))
    """A system message before every prompt (in the chat template, else above the prompt, a blank line between)."""
    chat_template: Literal[CHAT_TEMPLATE_MODES] = Field("auto", json_schema_extra=cli("--chat-template"))
    """``auto``: wrap the prompt in the tokenizer's chat template when it has one (``apply_chat_template(...,
    add_generation_prompt=True)``); ``never``: the prompt as it is."""
    max_new_tokens: int = Field(64, ge=1, json_schema_extra=cli("--max-new-tokens", "N"))
    """Tokens generated per row at most; a row that reaches it has ``finish_reason`` ``length``."""
    temperature: Number = Field(0.0, ge=0, allow_inf_nan=False, json_schema_extra=cli("--temperature"))
    """0: greedy (the most likely token, deterministic); above 0: sampled, each row from its own generator seeded
    from ``seed`` and the row's id, so its text does not depend on batching, partitioning, retries or resume."""
    top_p: Number = Field(1.0, gt=0, le=1, json_schema_extra=cli("--top-p"))
    """Sampling: draw from the smallest set of tokens whose probabilities add up to this (nucleus sampling)."""
    seed: int = Field(0, json_schema_extra=cli("--seed"))
    """Sampling: the run's seed, combined with each row's id."""
    stop: Strings = Field((), json_schema_extra=cli("--stop", "TEXT", repeat=True))
    """Strings that end generation: the text is cut before the first one found (a flag takes one string, and is
    repeated for more)."""
    truncate: Literal[TRUNCATE_MODES] = Field("none", json_schema_extra=cli("--truncate"))
    """A prompt whose tokens plus ``max_new_tokens`` exceed the model's context: ``none`` dead-letters it
    (``prompt_too_long``), ``left`` cuts its first tokens."""
    choices: Strings = ()
    """Instead of generating, score each of these strings (two at least) as a continuation of the prompt and return the
    most likely (``finish_reason`` ``choice``, the log-probabilities in ``choice_logprobs``): zero-shot labels."""
    choice_score: Literal[CHOICE_SCORES] = "sum"
    """What ``choices`` are compared by, and what ``choice_logprobs`` holds: ``sum`` of each choice's token
    log-probabilities (its probability as a continuation, which favours choices of fewer tokens), or their ``mean``
    per token."""
    json_schema: Annotated[Text | None, BeforeValidator(_json_text)] = None
    """A JSON Schema (a YAML mapping or JSON text): decoding is constrained so that every text is JSON that validates
    against it (llguidance; over an endpoint, the API's JSON-schema response format)."""
    top_k: int | None = Field(None, ge=1, json_schema_extra=cli("--top-k", "K"))
    """Sampling: draw from the ``top_k`` likeliest tokens only (with ``top_p``, from the smaller set); default: all."""
    repetition_penalty: Number = Field(1.0, gt=0, allow_inf_nan=False, json_schema_extra=cli("--repetition-penalty"))
    """Above 1: a token already in the prompt or the text is made less likely (transformers' rule: its logit divided
    by this, multiplied when negative); 1: off."""
    min_new_tokens: int = Field(0, ge=0, json_schema_extra=cli("--min-new-tokens", "N"))
    """Tokens generated before the end-of-sequence token (or one of ``stop_token_ids``) may end a row."""
    stop_token_ids: Annotated[tuple[int, ...], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)] = ()
    """Token ids that end a row as the end-of-sequence token does (``finish_reason`` ``stop``; their text is left
    out)."""
    logprobs: bool = Field(False, json_schema_extra=cli("--logprobs"))
    """Add a ``token_logprobs`` column: for each generated token (an end-of-sequence or stop token included: as many
    as ``completion_tokens``), its log-probability under the model's own distribution at that step, before the
    repetition penalty, ``min_new_tokens``, a JSON schema's mask, temperature and ``top_k`` / ``top_p`` reshape it. So
    the value says how likely the model finds the text, whichever rule picked each token, and a token has the same
    value in a greedy and a sampled run. Over an endpoint it is the API's ``logprobs``: a server that returns none is
    refused in the preflight."""
    share_prefix_tokens: int = Field(32, ge=0, json_schema_extra=cli("--share-prefix-tokens", "N"))
    """In-process greedy generation: rows whose prompts begin with the same tokens, at least this many, are batched
    together and those tokens' keys and values computed once per batch, each row computing only its own tokens (the
    report's ``tokens_in_cached`` counts the tokens skipped); the texts are the unshared path's. 0: off. Sampled rows,
    ``choices``, images and encoder-decoder models compute every prompt whole."""
    endpoint: EndpointOptions | None = None
    """Generate through an OpenAI-compatible endpoint instead of a model loaded here (``--model`` is not needed); see
    ``docs/generation.md``."""
    server: ServerOptions | None = None
    """Serve the model (``--model``) with an engine lakescore starts once per executor host (vLLM, SGLang or
    ``transformers serve``) and send each host's rows to it; see ``docs/generation.md``."""

    @model_validator(mode="after")
    def _combinations(self) -> GenerateOptions:
        if any(s == "" for s in self.stop):
            raise ConfigError("generate.stop holds an empty string; every stop string needs at least one character")
        if any(c == "" for c in self.choices) or len(set(self.choices)) != len(self.choices):
            raise ConfigError(f"generate.choices must be distinct non-empty strings, got {list(self.choices)!r}")
        if len(self.choices) == 1:  # one choice would label every row with it, whatever the model says
            raise ConfigError(f"generate.choices needs two choices at least, got {list(self.choices)!r}")
        if self.choices and self.logprobs:
            raise ConfigError(
                "generate.logprobs is for generated text; with generate.choices each choice's log-probability "
                "is in choice_logprobs already"
            )
        if self.choices and self.json_schema is not None:
            raise ConfigError(
                "generate.choices and generate.json_schema exclude each other: choices are scored, not generated"
            )
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"generate.json_schema is not JSON text: {exc}") from None
            if not isinstance(schema, dict):
                raise ConfigError(
                    f"generate.json_schema must be a JSON object (a JSON Schema), got {self.json_schema[:80]!r}"
                )
            _check_json_schema(schema)
        if self.min_new_tokens > self.max_new_tokens:
            raise ConfigError(
                f"generate.min_new_tokens {self.min_new_tokens} exceeds generate.max_new_tokens {self.max_new_tokens}"
            )
        if self.endpoint is not None and self.server is not None:
            raise ConfigError(
                "generate.endpoint and generate.server exclude each other: a model is called, or served here"
            )
        if self.prefix_template is not None:
            _check_prefix_template(self.prefix_template, self.prompt_template)
        remote = self.endpoint or self.server
        if remote is not None:
            refused = unsupported_settings(self, remote.api)
            if refused:
                raise ConfigError(refused[0])
        return self

    @property
    def template(self) -> str | None:
        """The template each row's prompt is rendered from: ``prefix_template`` then ``prompt_template``."""
        if self.prompt_template is None:
            return None
        return (self.prefix_template or "") + self.prompt_template

    def shared_prefix(self, prompt: str) -> str | None:
        """The part of ``prompt`` (rendered from :attr:`template`) that ``prefix_template`` rendered, by
        :func:`prefix_end`; ``None`` without a ``prefix_template``, when that part or the row's own is empty, or
        when ``prompt`` is no text the templates render (the preflight's)."""
        if self.prefix_template is None or self.prompt_template is None:
            return None
        end = prefix_end(prompt, self.prefix_template, self.prompt_template)
        return prompt[:end] if end is not None and 0 < end < len(prompt) else None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def deterministic(self) -> bool:
        """True when a row's output depends only on its prompt (greedy, or ``choices``): what dedup may rely on."""
        return self.greedy or bool(self.choices)

    @property
    def shares_prefixes(self) -> bool:
        """Whether a model loaded here computes a prefix that rows share once (``share_prefix_tokens``; greedy text,
        not ``choices``)."""
        return not self.remote and self.greedy and not self.choices and self.share_prefix_tokens > 0

    @property
    def remote(self) -> bool:
        """Whether an endpoint or a served engine generates, rather than a model loaded in the worker."""
        return self.endpoint is not None or self.server is not None

    def identity(self) -> dict[str, Any]:
        """Every setting, by name: what a spec digest covers. An endpoint or server counts by what names the model
        that answers (not where it is, how it is called, or its price); a setting added since digests were first
        recorded counts only when set, so the digests of runs that do not set it stay as they were."""
        facts = {name: getattr(self, name) for name in type(self).model_fields}
        del facts["share_prefix_tokens"]  # how much is computed once, never what is written
        for name, default in _ADDED_SETTINGS.items():
            if facts[name] == default:
                del facts[name]
        for name in ("endpoint", "server"):
            if name in facts:
                facts[name] = facts[name].identity()
        if "prefix_template" in facts:  # the prompts are what counts: one template split in two renders the same
            facts["prompt_template"] = self.template
            del facts["prefix_template"]
        return facts


_ADDED_SETTINGS = {
    "top_k": None,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "stop_token_ids": (),
    "logprobs": False,
    "endpoint": None,
    "server": None,
    "prefix_template": None,
}
"""The generate settings added since issue 48, at their defaults: left out of :meth:`GenerateOptions.identity`
there."""


def _check_prefix_template(prefix: str, template: str | None) -> None:
    """:class:`ConfigError` for a ``prefix_template`` without a ``prompt_template`` to follow it, or one whose end
    :func:`prefix_end` could not find: a placeholder where the one template ends and the other begins."""
    if template is None:
        raise ConfigError(
            "generate.prefix_template needs generate.prompt_template: the row's own part, rendered after it"
        )
    prefix_parts, row_parts = template_parts(prefix), template_parts(template)
    ends_in_text = not prefix_parts or prefix_parts[-1][1] is None
    begins_with_text = not row_parts or bool(row_parts[0][0])
    if not (ends_in_text or begins_with_text or _literal(prefix_parts)):
        raise ConfigError(
            "generate.prefix_template ends with a placeholder and generate.prompt_template begins with one, so where "
            "the shared part ends cannot be found in a prompt; put text between them (a blank line, a label)"
        )


def _literal(parts: list[tuple[str, str | None]]) -> bool:
    return all(name is None for _, name in parts)


def prefix_end(prompt: str, prefix_template: str, prompt_template: str) -> int | None:
    r"""Where, in ``prompt`` rendered from ``prefix_template`` then ``prompt_template``, the row's own part begins;
    ``None`` when ``prompt`` is not such a text. A prefix of text alone is exact. Otherwise ``prompt_template`` is
    matched from the prompt's end: each of its texts found where it last occurs before what was matched after it (a
    row's own values, a question, are the short part, so they are the ones assumed not to hold that text); a
    ``prompt_template`` that begins with a placeholder begins after ``prefix_template``'s last text, found the same way.

    >>> prefix_end("Document: a b\n\nQuestion: why?\nAnswer:", "Document: {doc}\n\n", "Question: {q}\nAnswer:")
    15
    >>> prefix_end("Examples: 1, 2\nhi", "Examples: 1, 2\n", "{q}"), prefix_end("other", "Doc: {d}\n", "{q}")
    (15, None)
    """
    prefix_parts = template_parts(prefix_template)
    if _literal(prefix_parts):
        return len(prefix_template) if prompt.startswith(prefix_template) else None
    end, open_value = len(prompt), False
    for literal, name in reversed(template_parts(prompt_template)):
        if name is not None:
            open_value = True  # a value runs from the text before it to ``end``
        if not literal:
            continue
        if open_value:
            end = prompt.rfind(literal, 0, end)
            if end < 0:
                return None
        elif prompt.endswith(literal, 0, end):
            end -= len(literal)
        else:
            return None
        open_value = False
    if open_value:  # the row's part begins with a placeholder: after the prefix's last text
        last = prefix_parts[-1][0] if prefix_parts[-1][1] is None else ""
        found = prompt.rfind(last, 0, end) if last else -1
        if found < 0:
            return None
        end = found + len(last)
    first = prefix_parts[0][0]
    return end if prompt.startswith(first) and end >= len(first) else None


def _check_json_schema(schema: dict) -> None:
    """``ValueError`` naming where and why ``schema`` breaks the JSON Schema meta-schema of its ``$schema`` draft (the
    latest draft when it names none): the grammar engine would otherwise fail on every executor."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise ConfigError(f"generate.json_schema is not a valid JSON Schema: at {where}: {exc.message}") from None


def model_context(positions: int | None, max_seq_length: int | None, tokenizer_limit: int | None) -> int | None:
    """The tokens a prompt plus its new tokens may hold: the smallest of the model's positions,
    ``model.max_seq_length`` and the tokenizer's ``model_max_length`` (one at or over
    :data:`~lakescore.udfs.models.json_files.NO_TOKENIZER_LIMIT` records none), each where set; ``None`` when none
    is."""
    if tokenizer_limit is not None and tokenizer_limit >= NO_TOKENIZER_LIMIT:
        tokenizer_limit = None
    limits = [v for v in (positions, max_seq_length, tokenizer_limit) if v]
    return min(limits) if limits else None


def require_room(spec: Any, model_dir: Path, context: int | None) -> None:
    """:class:`~lakescore.udfs.models.model_source.UnfitModelError` when ``spec.generate.max_new_tokens`` leaves no
    token of ``context`` for a prompt: the rule the driver checks first (:func:`check_context`) and the executors on
    load."""
    from lakescore.udfs.models.errors import UnfitModelError

    most = (spec.generate or GenerateOptions()).max_new_tokens
    if context is not None and most >= context:
        raise UnfitModelError(
            f"task {spec.task}: generate.max_new_tokens {most} leaves no room for a prompt in the context of {context} "
            f"tokens of {model_dir}; set it below {context}"
        )


def check_context(spec: Any, model_dir: Path, config: dict) -> None:
    """The driver's :func:`require_room`, on the context ``config`` (the model's ``config.json``) and its
    ``tokenizer_config.json`` give (:func:`model_context`)."""
    if spec.input_kind == "image" and "vision_config" not in config:
        # every vision-language model transformers loads (LLaVA, Idefics3, Qwen2-VL, Gemma 3, ...) has a vision tower
        from lakescore.udfs.models.errors import UnfitModelError

        raise UnfitModelError(
            f"task {spec.task} with image_col: {model_dir} is a {config.get('model_type') or 'model'} "
            f"({', '.join(config.get('architectures') or ()) or 'no architectures'}) with no vision tower "
            "(no vision_config in config.json), not a vision-language model"
        )
    config = config.get("text_config") or config if spec.input_kind == "image" else config
    limit = (read_json(model_dir / "tokenizer_config.json") or {}).get("model_max_length")
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    ints = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in (positions, limit)]
    require_room(spec, model_dir, model_context(ints[0], spec.max_seq_length, ints[1]))


def template_parts(template: str) -> list[tuple[str, str | None]]:
    """``template`` as ``(literal text, column name or None)`` pairs in order, what the job concatenates into each row's
    prompt; ``ValueError`` for a malformed template or a placeholder that is not a plain column name (positional
    ``{}``, ``{0}``, attribute or index access, a format spec or conversion: values are inserted as Spark casts them
    to a string, so ``{stars:.1f}`` would have no meaning; format such a column upstream)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"generate.prompt_template {template!r} is not a str.format template: {exc}") from None
    parts: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (name == "" or name.isdigit() or any(c in name for c in ".[]")):
            raise ValueError(
                f"generate.prompt_template placeholder {{{name}}} must name an input column (e.g. {{text}}); "
                "positional, attribute and index placeholders are not supported"
            )
        if name is not None and (spec or conversion):
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ValueError(
                f"generate.prompt_template placeholder {{{shown}}} has a format spec or conversion; values are "
                f"inserted as Spark casts them to a string, so write {{{name}}} and format the column upstream"
            )
        parts.append((literal, name))
    return parts


def template_columns(template: str) -> tuple[str, ...]:
    """The input columns ``template`` names, in first-use order (``ValueError`` as :func:`template_parts`)."""
    return tuple(dict.fromkeys(name for _, name in template_parts(template) if name is not None))
