"""Decoding for the ``generate`` head: one batch of left-padded prompts -> each row's new tokens, text and finish.

The loop is transformers' own greedy / sampling step, written out so that batching does not change a
row's result:

* greedy rows take the arg-max, as ``model.generate(do_sample=False)`` does (prompts are left-padded with
  position ids counted from each row's first real token, as ``generate`` counts them, so a row's logits are
  its unpadded logits up to float rounding);
* sampled rows draw from their own ``torch.Generator``, seeded from (``seed``, row key), one draw per step,
  so a row's text does not depend on which rows share its batch;
* with a JSON schema, each row's grammar matcher (llguidance) masks the tokens that cannot continue valid
  JSON before the pick, and ends the row when the JSON is complete;
* a row ends at an EOS token, at a stop string (its text cut before the first), or at ``max_new_tokens``;
* with ``logprobs``, each picked token's log-probability is read from the step's logits as the model gave them
  (``log_softmax``), before the penalty, masks and sampling rules reshape a copy to pick from.

Rows that end leave the batch at once (their KV cache rows are dropped), so they stop costing compute. A
decoder's keys and values are written in place into buffers sized for the prompts plus the new tokens
(:func:`_preallocated_cache`), where transformers' ``DynamicCache`` copies the whole cache into a new tensor at every
step.
Refilling the freed slots with waiting prompts (continuous batching) is not faster on CPU, since a decode
step's cost there already scales with the rows left in it, and merging a new prompt's cache into the running
one adds copies and left padding; so batches are planned by the core (length-sorted, prompt plus new tokens
within the budget) and only shrink.

Rows of a batch that share a prefix (:class:`~lakescore.udfs.heads.prefixes.PrefixGroup`) have it computed once: one
forward over the prefixes, their keys and values copied to each row of the group, one forward over the rows' own
tokens (:func:`_shared_prefill`); the steps after are the same.

Choices are scored in one forward over every (row, choice) sequence: the sum of the choice tokens'
log-probabilities given the prompt and the choice tokens before them.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lakescore.udfs.heads.prefixes import PrefixGroup
from lakescore.udfs.heads.seeds import row_seed  # re-exported: the seed rule is every engine's
from lakescore.udfs.models.devices import to_device

__all__ = ["Decoding", "RowState", "GrammarError", "generate", "choice_logprobs", "row_seed"]


JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How constrained JSON is laid out, where the schema does not say (llguidance's ``x-guidance`` options)."""


GRAMMAR_TOKEN_BYTES = 1024
"""The longest token llguidance's token trie holds, in bytes: it panics (a Rust assertion) on a longer one."""


class GrammarError(RuntimeError):
    """A row's grammar matcher refused a token or failed: the row is retried alone, then ``generation_error``."""


@dataclass
class RowState:
    """One row's decoding so far: its new token ids, sampling generator, grammar matcher and, once it ended, why."""

    generator: torch.Generator | None = None
    matcher: Any = None
    ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text: str | None = None
    seen: set[int] | None = None
    """The prompt's and the new tokens' ids, with ``repetition_penalty``."""
    logprobs: list[float] | None = None
    """With ``logprobs``: each new token's log-probability under the model's unprocessed distribution."""


class Decoding:
    """The per-step rules every row of the head follows: how a token is picked, when a row ends, its text."""

    def __init__(self, model, tokenizer, options) -> None:
        # its own copy: the head's tokenizer encodes the next batch in the prefetch thread while this one decodes
        self.tokenizer, self.options = copy.deepcopy(tokenizer), options
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = frozenset([] if eos is None else eos if isinstance(eos, (list, tuple)) else [eos])
        self.stop_ids = frozenset(options.stop_token_ids)
        """``stop_token_ids``: tokens that end a row as EOS does; their text is not part of the row's."""
        self.top_k = options.top_k or 0
        self.penalty = float(options.repetition_penalty)
        self.min_new_tokens = options.min_new_tokens
        self._new_matcher = self._grammar_matchers(options.json_schema) if options.json_schema is not None else None

    def _grammar_matchers(self, schema: str) -> Callable[[], Any]:
        """A factory of fresh llguidance matchers for ``schema`` over this tokenizer; ``ValueError`` naming what
        llguidance refuses in the schema."""
        import llguidance

        tokenizer = grammar_tokenizer(self.tokenizer, self.vocab_size, sorted(self.eos_ids) or None)
        # compact JSON (json.dumps's separators, no free whitespace) unless the schema's own "x-guidance" says
        # otherwise: free whitespace lets a weak model spend its tokens on blanks instead of closing the object
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if error:
            raise ValueError(f"generate.json_schema cannot be compiled to a grammar: {'; '.join(messages)}")
        return lambda: llguidance.LLMatcher(tokenizer, grammar, log_level=0)

    def start(self, keys: Sequence[str], prompts: Sequence[Sequence[int]] | None = None) -> list[RowState]:
        """A fresh state per row: its generator seeded from (seed, key) when sampling, its matcher with a schema, the
        ids of its prompt (``prompts``, unpadded) with a repetition penalty."""
        states = []
        for i, key in enumerate(keys):
            state = RowState()
            if self.penalty != 1.0:
                state.seen = set(prompts[i]) if prompts is not None else set()
            if not self.options.greedy:
                state.generator = torch.Generator().manual_seed(row_seed(self.options.seed, str(key)))
            if self._new_matcher is not None:
                state.matcher = self._new_matcher()
            if self.options.logprobs:
                state.logprobs = []
            states.append(state)
        return states

    def pick(self, logits: torch.Tensor, states: Sequence[RowState]) -> list[int]:
        """The next token of each row, from its float32 ``logits`` (rows, vocab): arg-max, or one draw per row."""
        logits = self._processed(logits, states)
        if self._new_matcher is not None:
            logits = logits.masked_fill(self._disallowed(states).to(logits.device), float("-inf"))
        if self.options.greedy:
            picked = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.double().cpu() / self.options.temperature, dim=-1)
            if self.top_k:
                probs = _top_k(probs, self.top_k)
            if self.options.top_p < 1:
                probs = _top_p(probs, self.options.top_p)
            cdf = probs.cumsum(-1)
            draws = torch.stack([torch.rand((), generator=s.generator, dtype=torch.float64) for s in states])
            # a draw scaled to the row's total never lands past its last token with probability above zero
            picked = (
                torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True)
                .squeeze(1)
                .clamp(max=cdf.shape[1] - 1)
            )
        return picked.tolist()

    def _processed(self, logits: torch.Tensor, states: Sequence[RowState]) -> torch.Tensor:
        """``logits`` with the repetition penalty (transformers' rule: a seen token's logit divided by the penalty, or
        multiplied when negative) and, before ``min_new_tokens``, the tokens that would end the row masked."""
        if self.penalty != 1.0:
            logits = logits.clone()
            for i, state in enumerate(states):
                if state.seen:
                    seen = torch.tensor(sorted(state.seen), dtype=torch.long, device=logits.device)
                    values = logits[i, seen]
                    logits[i, seen] = torch.where(values < 0, values * self.penalty, values / self.penalty)
        if self.min_new_tokens:
            young = [i for i, state in enumerate(states) if len(state.ids) < self.min_new_tokens]
            ending = sorted(t for t in self.eos_ids | self.stop_ids if t < logits.shape[-1])
            if young and ending:
                logits = logits.clone()
                rows = torch.tensor(young, dtype=torch.long, device=logits.device)[:, None]
                logits[rows, torch.tensor(ending, dtype=torch.long, device=logits.device)[None, :]] = float("-inf")
        return logits

    def _disallowed(self, states: Sequence[RowState]) -> torch.Tensor:
        """(rows, vocab) True where a row's grammar forbids the token."""
        words = (self.vocab_size + 31) // 32
        masks = np.empty((len(states), words), dtype=np.uint32)
        for i, state in enumerate(states):
            masks[i] = np.frombuffer(_matcher_call(state.matcher.compute_bitmask), dtype=np.uint32)[:words]
            if state.matcher.is_error():
                raise GrammarError(state.matcher.get_error())
        allowed = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")[:, : self.vocab_size]
        return torch.from_numpy(allowed == 0)

    def advance(self, state: RowState, token: int, last: bool) -> bool:
        """Append ``token`` to the row; True when the row has ended (EOS, stop string, grammar done, or ``last``)."""
        state.ids.append(token)
        if state.seen is not None:
            state.seen.add(token)
        if state.matcher is not None:
            if not _matcher_call(state.matcher.consume_token, token):
                raise GrammarError(state.matcher.get_error() or f"the grammar refused token {token}")
            if state.matcher.is_stopped():
                state.finish_reason = "stop"
        if token in self.eos_ids or token in self.stop_ids:
            state.finish_reason = "stop"
        elif self.options.stop:
            text = self.text_of(state)
            cut = min((i for i in (text.find(s) for s in self.options.stop) if i >= 0), default=-1)
            if cut >= 0:
                state.text, state.finish_reason = text[:cut], "stop"
        if state.finish_reason is None and last:
            state.finish_reason = "length"
        return state.finish_reason is not None

    def text_of(self, state: RowState) -> str:
        """The row's text: its new tokens decoded without special tokens, cut before a stop string when one came."""
        if state.text is None:
            ids = state.ids[:-1] if state.ids and state.ids[-1] in self.stop_ids else state.ids
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        return state.text


def _matcher_call(method, *args):
    """``method(*args)`` of a grammar matcher, its panic (pyo3's ``PanicException``, a ``BaseException`` that the
    batching core's row retry would not catch) raised as the row's :class:`GrammarError`."""
    try:
        return method(*args)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, Exception)):
            raise
        raise GrammarError(f"the grammar engine failed: {exc}") from None


def grammar_tokenizer(tokenizer, n_vocab: int, eos: list[int] | None):
    """llguidance's tokenizer for the Hugging Face ``tokenizer``. A vocabulary llguidance cannot hold (tokens over
    :data:`GRAMMAR_TOKEN_BYTES`) is retried without those tokens, which constrained decoding then never picks.
    :class:`~lakescore.udfs.models.model_source.UnfitModelError` naming the tokenizer and llguidance's message
    otherwise."""
    import llguidance
    import llguidance.hf

    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos)
    except BaseException as exc:  # noqa: BLE001 (pyo3's PanicException is a BaseException; it is all llguidance says)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        failure = exc
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend = copy.copy(backend)
        backend.no_padding()
        backend.no_truncation()
        serialized, dropped = _without_long_tokens(backend.to_str(), GRAMMAR_TOKEN_BYTES)
        if dropped:
            try:
                return llguidance.LLTokenizer(serialized, n_vocab=n_vocab, eos_token=eos)
            except BaseException as exc:  # noqa: BLE001 (as above)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                failure = exc
    from lakescore.udfs.models.errors import UnfitModelError

    message = " ".join(str(failure).split()) or type(failure).__name__
    raise UnfitModelError(
        f"task generate: generate.json_schema: the grammar engine (llguidance) cannot use the tokenizer of "
        f"{getattr(tokenizer, 'name_or_path', '') or '?'} ({type(tokenizer).__name__}, {len(tokenizer)} tokens): "
        f"{message}"
    ) from None


def _without_long_tokens(serialized: str, limit: int) -> tuple[str, list[int]]:
    """A ``tokenizers`` JSON without its tokens over ``limit`` bytes (from a vocabulary mapping, the added tokens and
    the merges that make them), and their ids; other vocabularies (a Unigram's list) are returned as they are."""
    import json

    data = json.loads(serialized)
    dropped: list[int] = []
    model = data.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        for token, token_id in list(vocab.items()):
            if len(token.encode("utf-8")) > limit:
                dropped.append(token_id)
                del vocab[token]
        if isinstance(model.get("merges"), list):  # a merge's result is its two parts joined
            model["merges"] = [
                m
                for m in model["merges"]
                if len("".join(m.split(" ", 1) if isinstance(m, str) else m).encode("utf-8")) <= limit
            ]
    added = data.get("added_tokens") or []
    dropped += [a["id"] for a in added if len(a["content"].encode("utf-8")) > limit]
    data["added_tokens"] = [a for a in added if len(a["content"].encode("utf-8")) <= limit]
    return json.dumps(data), sorted(set(dropped))


@dataclass(frozen=True)
class Decoded:
    """One row's result: new token ids (EOS included), text, finish reason and, with ``logprobs``, each new token's
    log-probability."""

    ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float] | None = None


def _top_k(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """``probs`` (rows, vocab) restricted to each row's ``top_k`` most probable tokens, renormalised (transformers'
    ``TopKLogitsWarper``, on probabilities; ties at the k-th value are kept, as there)."""
    kth = probs.topk(min(top_k, probs.shape[-1]), dim=-1).values[:, -1:]
    kept = probs.masked_fill(probs < kth, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` (rows, vocab) restricted to each row's nucleus: the most probable tokens whose mass first reaches
    ``top_p`` (at least one), renormalised (transformers' ``TopPLogitsWarper``, on probabilities)."""
    ordered, order = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(-1) - ordered  # the mass of the more probable tokens: 0 for the first, always kept
    ordered = ordered.masked_fill(before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(1, order, ordered)
    return kept / kept.sum(-1, keepdim=True)


def generate(
    model,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    keys: Sequence[str],
    decoding: Decoding,
    prefill: dict[str, Any] | None = None,
    shared: Sequence[PrefixGroup] = (),
) -> list[Decoded]:
    """Decode one batch of left-padded prompts: each row's new tokens, text and finish reason, in row order.
    ``prefill``: more inputs the model reads with the prompts only (a vision-language model's ``pixel_values``).
    ``shared``: groups of rows whose first tokens are the same, computed once per group (a decoder's text prompts;
    :func:`_shared_prefill`)."""
    device = str(model.device)
    ids = to_device(torch.as_tensor(input_ids, dtype=torch.long), device)
    mask = to_device(torch.as_tensor(attention_mask, dtype=torch.long), device)
    prompts = (
        [row[mask_row.astype(bool)].tolist() for row, mask_row in zip(input_ids, attention_mask)]
        if decoding.penalty != 1.0
        else None
    )
    states = decoding.start(keys, prompts)
    with torch.inference_mode():
        most = decoding.options.max_new_tokens
        if model.config.is_encoder_decoder:
            logits, step = _seq2seq_steps(model, ids, mask, most)
        else:
            logits, step = _causal_steps(model, ids, mask, most, shared, **_on_device(prefill, device))
        active = list(range(len(states)))
        for made in range(1, most + 1):
            tokens = decoding.pick(logits, [states[i] for i in active])
            if decoding.options.logprobs:  # the logits as the model gave them: pick reshapes a copy
                chosen = torch.tensor(tokens, device=logits.device)[:, None]
                for i, value in zip(active, torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1).tolist()):
                    row_logprobs = states[i].logprobs
                    assert row_logprobs is not None  # start() gives every row a list when logprobs is on
                    row_logprobs.append(value)
            ended = [decoding.advance(states[i], t, last=made == most) for i, t in zip(active, tokens)]
            keep = [j for j, done in enumerate(ended) if not done]
            if not keep:
                break
            active = [active[j] for j in keep]
            selected = None if len(keep) == len(ended) else torch.tensor(keep, device=device)
            logits = step(torch.tensor([tokens[j] for j in keep], device=device), selected)
    decoded = []
    for s in states:
        assert s.finish_reason is not None  # the loop ends once every row has ended; the last step ends them all
        decoded.append(Decoded(s.ids, decoding.text_of(s), s.finish_reason, s.logprobs))
    return decoded


Step = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
"""``step(tokens, keep)``: drop the rows not in ``keep`` (``None``: keep all), feed each kept row its new token,
return the next float32 logits (rows, vocab)."""


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids counted from each row's first real token (``generate``'s rule for left-padded rows)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _keeps_last_logits(model) -> dict[str, int]:
    """``logits_to_keep=1`` where the model takes it, as ``generate`` passes it: the head runs on the last position
    only."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _causal_steps(
    model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, shared: Sequence[PrefixGroup] = (), **prefill
) -> tuple[torch.Tensor, Step]:
    """Prefill a decoder-only model's cache with the prompts (and ``prefill``'s inputs), each ``shared`` group's
    prefix once; the step that extends it one token a row."""
    last = _keeps_last_logits(model)
    if shared and not prefill and _plain_layers(model):
        out, cache, mask = _shared_prefill(model, ids, mask, new_tokens, shared, last)
    else:
        cache = _preallocated_cache(_text_config(model.config), ids.shape[1] + new_tokens)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=_positions(mask),
            past_key_values=cache,
            use_cache=True,
            **last,
            **prefill,
        )
    state = {"mask": mask}

    def step(tokens: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        mask = state["mask"]
        if keep is not None:
            cache.reorder_cache(keep)
            mask = mask[keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        state["mask"] = mask
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=mask.sum(-1, keepdim=True) - 1,
            past_key_values=cache,
            use_cache=True,
            **last,
        )
        return out.logits[:, -1].float()

    return out.logits[:, -1].float(), step


def _plain_layers(model) -> bool:
    """Whether every layer of the model's cache is a plain full-attention one (transformers' ``DynamicLayer``): what
    a prefix's keys and values can be copied from row to row in (a sliding window's layer drops old tokens)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=_text_config(model.config)).layers)


def _shared_prefill(
    model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, shared: Sequence[PrefixGroup], last: dict[str, int]
) -> tuple[Any, Any, torch.Tensor]:
    """Prefill left-padded prompts whose ``shared`` groups' prefixes are computed once: one forward over the groups'
    prefixes (left-padded, one row a group), their cache rows copied to every row of the group, then one forward
    over each row's own tokens (all of a row in no group), left-padded after the prefixes, the mask and position ids
    counting each row's real tokens. The model's output, the cache, and the attention mask over both parts."""
    rows, width = ids.shape
    lengths = mask.sum(-1).tolist()
    group_of, own = [-1] * rows, list(lengths)
    for g, group in enumerate(shared):
        for r in group.rows:
            group_of[r], own[r] = g, lengths[r] - group.length
    prefix_width, own_width = max(g.length for g in shared), max(own)
    prefix_ids = ids.new_zeros((len(shared), prefix_width))
    prefix_mask = mask.new_zeros((len(shared), prefix_width))
    for g, group in enumerate(shared):
        first = width - lengths[group.rows[0]]
        prefix_ids[g, prefix_width - group.length :] = ids[group.rows[0], first : first + group.length]
        prefix_mask[g, prefix_width - group.length :] = 1
    cache = _preallocated_cache(_text_config(model.config), prefix_width + own_width + new_tokens)
    model(
        input_ids=prefix_ids,
        attention_mask=prefix_mask,
        position_ids=_positions(prefix_mask),
        past_key_values=cache,
        use_cache=True,
        **last,
    )
    index = torch.tensor([max(g, 0) for g in group_of], dtype=torch.long, device=ids.device)
    cache.reorder_cache(index)  # each row gets its group's prefix; a row in none masks the slots it got
    in_group = torch.tensor([g >= 0 for g in group_of], dtype=mask.dtype, device=mask.device)
    full = torch.cat([prefix_mask[index] * in_group[:, None], mask[:, width - own_width :]], dim=1)
    for r in range(rows):  # a row's own tokens are its last ``own[r]``; its prefix tokens there are masked
        full[r, prefix_width : prefix_width + own_width - own[r]] = 0
    out = model(
        input_ids=ids[:, width - own_width :],
        attention_mask=full,
        position_ids=_positions(full)[:, prefix_width:],
        past_key_values=cache,
        use_cache=True,
        **last,
    )
    return out, cache, full


class _PreallocatedLayer:
    """Mixed into transformers' ``DynamicLayer``: keys and values written in place into buffers sized for the
    whole decode (prompt width plus new tokens), instead of concatenated into new tensors at every step."""

    def __init__(self, capacity: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rows, heads, _, _ = key_states.shape
        self.key_buffer = key_states.new_empty((rows, heads, self.capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty((rows, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:  # more tokens than planned: grow, as DynamicLayer would
            self._grow(end)
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def _grow(self, capacity: int) -> None:
        self.capacity = capacity
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = old.new_empty((old.shape[0], old.shape[1], capacity, old.shape[-1]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            beam_idx = beam_idx.to(self.device)
            self.key_buffer = self.key_buffer.index_select(0, beam_idx)
            self.value_buffer = self.value_buffer.index_select(0, beam_idx)
            self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)


def _text_config(config):
    """The language model's config of a vision-language model's (``text_config``), else ``config`` itself: what the
    cache's layers follow."""
    return getattr(config, "text_config", None) or config


def _on_device(inputs: dict[str, Any] | None, device: str) -> dict[str, Any]:
    return {name: to_device(value, device) for name, value in (inputs or {}).items()}


def _preallocated_cache(config, capacity: int):
    """transformers' ``DynamicCache`` for ``config``, its plain full-attention layers written in place into buffers of
    ``capacity`` tokens (sliding-window and other special layers stay transformers' own)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layer_class = type("PreallocatedDynamicLayer", (_PreallocatedLayer, DynamicLayer), {})
    cache = DynamicCache(config=config)
    cache.layers = [layer_class(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _seq2seq_steps(
    model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, **_prefill
) -> tuple[torch.Tensor, Step]:
    """Encode the prompts once; the decoder steps from the decoder start token, cross-attending to them."""
    from transformers import DynamicCache, EncoderDecoderCache

    encoded = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    start = torch.full((ids.shape[0], 1), _decoder_start(model), dtype=torch.long, device=ids.device)
    out = model(
        encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=start, past_key_values=cache, use_cache=True
    )
    state = {"mask": mask}

    def step(tokens: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        if keep is not None:
            cache.reorder_cache(keep)
            encoded["last_hidden_state"] = encoded["last_hidden_state"][keep]
            state["mask"] = state["mask"][keep]
        out = model(
            encoder_outputs=encoded,
            attention_mask=state["mask"],
            decoder_input_ids=tokens[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits[:, -1].float()

    return out.logits[:, -1].float(), step


def _decoder_start(model) -> int:
    start = getattr(model.generation_config, "decoder_start_token_id", None)
    if start is None:
        start = model.config.decoder_start_token_id
    if start is None:
        raise ValueError("the encoder-decoder model names no decoder_start_token_id")
    return int(start)


def choice_logprobs(
    model,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    choices: Sequence[Sequence[int]],
    pad: int,
    prefill: dict[str, Any] | None = None,
) -> np.ndarray:
    """float64 (rows, choices): for each left-padded prompt and each choice's token ids, the sum of the choice
    tokens' log-probabilities, each given the prompt and the choice tokens before it. ``prefill``: more inputs of the
    prompts, one entry per row along their first axis (a vision-language model's ``pixel_values``), repeated per
    choice."""
    device = str(model.device)
    ids = to_device(torch.as_tensor(input_ids, dtype=torch.long), device)
    mask = to_device(torch.as_tensor(attention_mask, dtype=torch.long), device)
    rows, k, width = ids.shape[0], len(choices), max(len(c) for c in choices)
    targets = torch.full((k, width), pad, dtype=torch.long, device=device)
    present = torch.zeros((k, width), dtype=torch.long, device=device)
    for j, choice in enumerate(choices):
        targets[j, : len(choice)] = torch.tensor(list(choice), dtype=torch.long)
        present[j, : len(choice)] = 1
    targets, present = targets.repeat(rows, 1), present.repeat(rows, 1)  # row r's choice j at r * k + j
    with torch.inference_mode():
        if model.config.is_encoder_decoder:
            encoded = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
            encoded["last_hidden_state"] = encoded["last_hidden_state"].repeat_interleave(k, 0)
            start = torch.full((rows * k, 1), _decoder_start(model), dtype=torch.long, device=device)
            decoder_ids = torch.cat([start, targets[:, :-1]], dim=1)
            logits = model(
                encoder_outputs=encoded,
                attention_mask=mask.repeat_interleave(k, 0),
                decoder_input_ids=decoder_ids,
                decoder_attention_mask=torch.cat([start.new_ones((rows * k, 1)), present[:, :-1]], 1),
            ).logits
        else:
            # the choice follows the prompt's last real token; its padding (on the right) is masked and never read
            full_mask = torch.cat([mask.repeat_interleave(k, 0), present], dim=1)
            full = torch.cat([ids.repeat_interleave(k, 0), targets], dim=1)
            tail = {"logits_to_keep": width + 1} if _keeps_last_logits(model) else {}
            extra = {name: value.repeat_interleave(k, 0) for name, value in _on_device(prefill, device).items()}
            logits = model(
                input_ids=full, attention_mask=full_mask, position_ids=_positions(full_mask), **tail, **extra
            ).logits
            logits = logits[:, logits.shape[1] - width - 1 : -1]  # the positions that predict the choice tokens
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
        return (logprobs.double() * present).sum(-1).view(rows, k).cpu().numpy()
