"""The ``generate`` task's settings and prompt templates: plain Python, so the config and the driver read them
without the model runtime (:mod:`lakescore.udfs.generate` is the head)."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from lakescore.udfs.registry import TASKS

__all__ = [
    "GenerateOptions", "CHAT_TEMPLATE_MODES", "TRUNCATE_MODES", "CHOICE_SCORES", "FINISH_REASONS", "template_parts",
    "template_columns", "model_context", "require_room", "check_context",
]

CHAT_TEMPLATE_MODES = ("auto", "never")
TRUNCATE_MODES = ("none", "left")
CHOICE_SCORES = ("sum", "mean")
"""How ``choices`` are compared: ``sum`` of a choice's token log-probabilities (its probability as a continuation), or
their ``mean`` per token (which does not favour choices of fewer tokens)."""
FINISH_REASONS = TASKS["generate"].output_value_sets["finish_reason"]
"""``stop``: EOS, a stop string or the end of the JSON schema; ``length``: ``max_new_tokens`` reached; ``choice``: scored."""


@dataclass(frozen=True)
class GenerateOptions:
    """How the ``generate`` task renders prompts and generates: frozen, hashable, picklable (part of the spec).

    Lists given for ``stop`` and ``choices`` are kept as tuples. ``ValueError`` (one line) for a bad value.
    """

    prompt_template: Optional[str] = None
    """``str.format`` placeholders naming input columns (``"Review: {text}\\nSummary:"``); ``None``: the text column.
    The job renders each row's prompt from it (:func:`template_parts`); the head reads the rendered prompt."""
    system_prompt: Optional[str] = None
    chat_template: str = "auto"
    """``auto``: through the tokenizer's chat template when it has one; ``never``: the prompt as it is."""
    max_new_tokens: int = 64
    temperature: float = 0.0
    """0: greedy; above: sampled, each row from its own generator."""
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    """The text is cut before the first of these, and generation stops there."""
    truncate: str = "none"
    """``none``: a prompt too long for the context is ``prompt_too_long``; ``left``: its first tokens are cut."""
    choices: tuple[str, ...] = ()
    """Score these as continuations of the prompt and return the best, instead of generating (two at least)."""
    choice_score: str = "sum"
    """What ``choices`` are compared by (:data:`CHOICE_SCORES`), and what ``choice_logprobs`` holds."""
    json_schema: Optional[str] = None
    """JSON text of a JSON Schema: generation is constrained so each text is JSON that validates against it."""

    def __post_init__(self) -> None:
        for name in ("stop", "choices"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"generate.{name} must be a list of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise ValueError(f"generate.chat_template must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {self.chat_template!r}")
        if self.truncate not in TRUNCATE_MODES:
            raise ValueError(f"generate.truncate must be one of {', '.join(TRUNCATE_MODES)}, got {self.truncate!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"generate.max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"generate.temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"generate.top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"generate.seed must be an integer, got {self.seed!r}")
        if any(s == "" for s in self.stop):
            raise ValueError("generate.stop holds an empty string; every stop string needs at least one character")
        if any(c == "" for c in self.choices) or len(set(self.choices)) != len(self.choices):
            raise ValueError(f"generate.choices must be distinct non-empty strings, got {list(self.choices)!r}")
        if len(self.choices) == 1:  # one choice would label every row with it, whatever the model says
            raise ValueError(f"generate.choices needs two choices at least, got {list(self.choices)!r}")
        if self.choice_score not in CHOICE_SCORES:
            raise ValueError(f"generate.choice_score must be one of {', '.join(CHOICE_SCORES)}, got {self.choice_score!r}")
        if self.choices and self.json_schema is not None:
            raise ValueError("generate.choices and generate.json_schema exclude each other: choices are scored, not generated")
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except (TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"generate.json_schema is not JSON text: {exc}") from None
            if not isinstance(schema, dict):
                raise ValueError(f"generate.json_schema must be a JSON object (a JSON Schema), got {self.json_schema[:80]!r}")
            _check_json_schema(schema)
        if self.prompt_template is not None:
            template_columns(self.prompt_template)  # refuses a malformed template now, not on the executors

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def deterministic(self) -> bool:
        """True when a row's output depends only on its prompt (greedy, or ``choices``): what dedup may rely on."""
        return self.greedy or bool(self.choices)

    def identity(self) -> dict[str, Any]:
        """Every setting, by name: what a spec digest covers."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_json_schema(schema: dict) -> None:
    """``ValueError`` naming where and why ``schema`` breaks the JSON Schema meta-schema of its ``$schema`` draft (the
    latest draft when it names none): the grammar engine would otherwise fail on every executor."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise ValueError(f"generate.json_schema is not a valid JSON Schema: at {where}: {exc.message}") from None


def model_context(positions: Optional[int], max_seq_length: Optional[int], tokenizer_limit: Optional[int]) -> Optional[int]:
    """The tokens a prompt plus its new tokens may hold: the smallest of the model's positions,
    ``model.max_seq_length`` and the tokenizer's ``model_max_length`` (one at or over
    :data:`~lakescore.udfs.model_fit.NO_TOKENIZER_LIMIT` records none), each where set; ``None`` when none is."""
    from lakescore.udfs.model_fit import NO_TOKENIZER_LIMIT

    if tokenizer_limit is not None and tokenizer_limit >= NO_TOKENIZER_LIMIT:
        tokenizer_limit = None
    limits = [v for v in (positions, max_seq_length, tokenizer_limit) if v]
    return min(limits) if limits else None


def require_room(spec: Any, model_dir: Path, context: Optional[int]) -> None:
    """:class:`~lakescore.udfs.model_source.UnfitModelError` when ``spec.generate.max_new_tokens`` leaves no token of
    ``context`` for a prompt: the rule the driver checks first (:func:`check_context`) and the executors on load."""
    from lakescore.udfs.model_source import UnfitModelError

    most = (spec.generate or GenerateOptions()).max_new_tokens
    if context is not None and most >= context:
        raise UnfitModelError(
            f"task {spec.task}: generate.max_new_tokens {most} leaves no room for a prompt in the context of {context} "
            f"tokens of {model_dir}; set it below {context}"
        )


def check_context(spec: Any, model_dir: Path, config: dict) -> None:
    """The driver's :func:`require_room`, on the context ``config`` (the model's ``config.json``) and its
    ``tokenizer_config.json`` give (:func:`model_context`)."""
    from lakescore.udfs.model_fit import read_json

    limit = (read_json(model_dir / "tokenizer_config.json") or {}).get("model_max_length")
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    ints = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in (positions, limit)]
    require_room(spec, model_dir, model_context(ints[0], spec.max_seq_length, ints[1]))


def template_parts(template: str) -> list[tuple[str, Optional[str]]]:
    """``template`` as ``(literal text, column name or None)`` pairs in order, what the job concatenates into each row's
    prompt; ``ValueError`` for a malformed template or a placeholder that is not a plain column name (positional
    ``{}``, ``{0}``, attribute or index access, a format spec or conversion: values are inserted as Spark casts them
    to a string, so ``{stars:.1f}`` would have no meaning; format such a column upstream)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"generate.prompt_template {template!r} is not a str.format template: {exc}") from None
    parts: list[tuple[str, Optional[str]]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (name == "" or name.isdigit() or any(c in name for c in ".[]")):
            raise ValueError(
                f"generate.prompt_template placeholder {{{name}}} must name an input column (e.g. {{text}}); "
                "positional, attribute and index placeholders are not supported"
            )
        if name is not None and (spec or conversion):
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ValueError(
                f"generate.prompt_template placeholder {{{shown}}} has a format spec or conversion; values are inserted "
                f"as Spark casts them to a string, so write {{{name}}} and format the column upstream"
            )
        parts.append((literal, name))
    return parts


def template_columns(template: str) -> tuple[str, ...]:
    """The input columns ``template`` names, in first-use order (``ValueError`` as :func:`template_parts`)."""
    return tuple(dict.fromkeys(name for _, name in template_parts(template) if name is not None))
