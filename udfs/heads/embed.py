"""The ``embed`` head: text -> sentence embedding, exactly as sentence-transformers computes it.

A sentence-transformers directory says what the model is in ``modules.json``: Transformer ->
Pooling -> [Normalize], with ``max_seq_length`` / ``do_lower_case`` in the Transformer's
``sentence_bert_config.json`` and the pooling modes in ``1_Pooling/config.json``. This head reads
those files and runs the same steps itself: the tokenizer (truncating at ``max_seq_length``,
lower-casing through the tokenizer's normalizer when configured, as sentence-transformers does),
the transformer forward on ``spec.backend`` (:mod:`lakescore.udfs.models.backends`), then pooling (one
function, run by the forward where its outputs are: numpy for ONNX Runtime, torch on the model's device)
and L2 normalisation in numpy. The vectors equal
``SentenceTransformer(dir).encode(texts)`` within float32 rounding (tested), and a worker never
imports sentence-transformers, which brings scikit-learn and scipy with it (seconds of CPU and
hundreds of MiB resident per process).

A plain Hugging Face directory without that configuration gets Transformer -> Pooling
(``mean`` unless configured ``cls``) -> Normalize (unless configured off); a dual-tower (CLIP-style)
one embeds with its text tower and projection, ``get_text_features`` (normalised unless configured
off), into the space its image tower embeds images in (:mod:`lakescore.udfs.heads.image_embed`). A directory with
modules this head does not read (e.g. a ``Dense`` projection) is loaded by sentence-transformers
itself, on the torch backend only.

Batching is ours (:mod:`lakescore.udfs.batching`): ``encode`` sorts by characters and cuts
fixed row counts; we tokenize once, sort by tokens and cut by a token budget.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lakescore.udfs.arrow_columns import list_column
from lakescore.udfs.heads.hf_models import load_tokenizer, model_facts, truncation_limit
from lakescore.udfs.models.backends import Forward, ModelKind
from lakescore.udfs.models.forwards import load_forward
from lakescore.udfs.models.model_source import POOLING_MODES, ModelSpec, refuse_pickle_weights, require_directory
from lakescore.udfs.tokenization import BatchEncoder

__all__ = [
    "SentenceEmbedder",
    "SentenceConfig",
    "load_embedder",
    "load_sentence_embedder",
    "served_embedding",
    "sentence_config",
    "dual_tower_text_config",
    "prompt_text",
    "pool",
    "KIND",
    "TEXT_TOWER",
    "POOLING_MODES",
]

KIND = ModelKind("AutoModel", "last_hidden_state", unread=("pooler",))
"""Token embeddings, pooled by the head: the base model's own pooler is not read, so a sentence-transformers checkpoint
saved without one loads."""
TEXT_TOWER = ModelKind("AutoModel", "pooler_output", "get_text_features")
"""A dual-tower model's text embedding: ``get_text_features``, whose output's ``pooler_output`` is the projection."""
_TEXT_POOLED_AT_LAST_POSITION = ("siglip", "siglip2")
"""Dual-tower models whose text tower pools the last position: trained on texts padded to a fixed length, they
embed a text padded to its batch's longest row differently, so this head does not run them."""
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class SentenceConfig:
    """What a model directory's sentence-transformers files (or their defaults) say about its embedding."""

    transformer_dir: Path
    max_seq_length: int | None
    do_lower_case: bool
    pooling: tuple[str, ...]
    normalize: bool


def pool(tokens, mask, modes: tuple[str, ...]):
    """sentence-transformers' ``Pooling`` over ``tokens`` (n, L, d) where ``mask`` (n, L) is 1, modes concatenated.

    ``cls`` is the first real token and ``lasttoken`` the last (either side padded; decoder embedders such as
    Qwen3-Embedding pad left and pool the last), ``max`` the largest over real tokens, ``mean`` their mean
    (``mean_sqrt_len_tokens``: the sum over the square root of the count), ``weightedmean`` their mean
    weighted by position (1 for the first real token, 2 for the next...). A row without real tokens pools
    to zeros in ``lasttoken``, as in sentence-transformers.

    ``tokens`` and ``mask`` are both numpy arrays or both torch tensors on one device (the torch backend pools
    where the model ran); the result is float32 in the same library. One function for both: the operations
    below are spelled the same in numpy and torch, and :func:`_array_library` covers the rest.
    """
    xp, astype, arange = _array_library(tokens)
    if xp is np:
        mask = np.asarray(mask)
    rows = arange(len(tokens))
    weights = astype(mask[..., None], tokens.dtype)
    vectors = []
    for mode in modes:
        if mode == "cls":
            vectors.append(tokens[rows, mask.argmax(axis=1)])
        elif mode == "lasttoken":
            last = mask.shape[1] - 1 - xp.flip(mask, (1,)).argmax(axis=1)
            vectors.append(tokens[rows, last] * astype(mask[rows, last][:, None], tokens.dtype))
        elif mode == "max":
            vectors.append(xp.amax(xp.where(weights > 0, tokens, -np.inf), axis=1))
        elif mode == "weightedmean":
            position = arange(1, mask.shape[1] + 1) - mask.argmax(axis=1)[:, None]  # left padding not counted
            weighted = weights * astype(position[..., None], tokens.dtype)
            vectors.append((tokens * weighted).sum(axis=1) / xp.clip(weighted.sum(axis=1), 1e-9, None))
        else:
            count = xp.clip(weights.sum(axis=1), 1e-9, None)
            total = (tokens * weights).sum(axis=1)
            vectors.append(total / (count if mode == "mean" else xp.sqrt(count)))
    return astype(xp.concatenate(vectors, axis=1), xp.float32)


def _array_library(tokens):
    """numpy or torch (whichever ``tokens`` belongs to), a dtype cast, and ``arange`` on ``tokens``' device."""
    torch = sys.modules.get("torch")  # a tensor implies torch is imported already
    if torch is not None and isinstance(tokens, torch.Tensor):
        return torch, lambda a, dtype: a.to(dtype), lambda *args: torch.arange(*args, device=tokens.device)
    return np, lambda a, dtype: np.asarray(a).astype(dtype, copy=False), np.arange


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as ``torch.nn.functional.normalize`` (norms below 1e-12 divide by 1e-12)."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


class SentenceEmbedder:
    """The embed head (:class:`~lakescore.udfs.batching.TextHead`): texts -> float32 ``(n, dimension)``.

    Output: the embedding per row (``array<float>``).
    """

    def __init__(
        self,
        forward: Forward,
        tokenizer: Any,
        max_seq_length: int,
        pooling: tuple[str, ...],
        normalize: bool,
        prompt: str = "",
    ) -> None:
        self._forward = forward
        self.tokenizer = tokenizer  # the chunker splits documents with it (lakescore.udfs.chunking)
        self._encode = BatchEncoder(tokenizer, max_seq_length)
        self.max_seq_length = max_seq_length
        self.pooling = pooling
        self.normalize = normalize
        self.prompt = prompt
        self.padding_side = self._encode.padding_side

    def tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Tokenized as sentence-transformers does: the prompt prepended, truncated at ``max_seq_length``, padded to
        the longest."""
        if self.prompt:
            texts = [self.prompt + text for text in texts]
        return self._encode(texts)

    def forward(self, features) -> np.ndarray:
        # The forward pools where its outputs are (on the GPU for a CUDA model: only (n, d) comes back to the host);
        # empty pooling: the forward pooled already (a model sentence-transformers loaded).
        vectors = self._forward(features, reduce=self._pool if self.pooling else None)
        return (l2_normalize(vectors) if self.normalize else vectors).astype(np.float32, copy=False)

    def _pool(self, tokens, inputs):
        return pool(tokens, inputs["attention_mask"], self.pooling)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        return (list_column(outputs.astype(np.float32, copy=False), ok, pa.float32()),)

    def score(self, texts: list[str]) -> np.ndarray:
        """Convenience for small lists: one padded batch, no budget (the job uses
        :func:`~lakescore.udfs.batching.score_texts`)."""
        return self.forward(self.tokenize(texts))

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """How close ``outputs`` are to ``reference`` (same rows): per-row cosine, 1st percentile and minimum."""
        a, b = np.asarray(reference, dtype=np.float64), np.asarray(outputs, dtype=np.float64)
        norms = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
        cosine = (a * b).sum(axis=1) / norms
        return {"cosine_p1": float(np.percentile(cosine, 1)), "cosine_min": float(cosine.min())}


def sentence_config(spec: ModelSpec, model_dir: Path) -> SentenceConfig | None:
    """The embedding ``model_dir`` describes (``spec.pooling`` / ``spec.normalize`` applied), or ``None``
    when its ``modules.json`` holds modules other than Transformer -> Pooling -> [Normalize].

    Raises ``ValueError`` for a pooling override on a model whose configuration fixes its pooling,
    or a pooling mode this head does not compute.
    """
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        pooling = (spec.pooling or "mean",)
        return SentenceConfig(model_dir, None, False, pooling, spec.normalize is not False)
    if spec.pooling is not None:
        raise ValueError(
            f"model.pooling={spec.pooling!r} conflicts with the pooling fixed by {modules_file}; "
            "remove the setting to use the model's own"
        )
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return None
    transformer_dir = model_dir / modules[0].get("path", "")
    settings = _read_json(transformer_dir / "sentence_bert_config.json")
    pooling = _pooling_modes(_read_json(model_dir / modules[1].get("path", "") / "config.json"), model_dir)
    normalize = len(kinds) == 3 if spec.normalize is None else spec.normalize
    return SentenceConfig(
        transformer_dir, settings.get("max_seq_length"), bool(settings.get("do_lower_case")), pooling, normalize
    )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _pooling_modes(config: dict, model_dir: Path) -> tuple[str, ...]:
    """The pooling modes of a ``Pooling`` config: ``pooling_mode`` (one or a list), else the legacy booleans."""
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in _LEGACY_POOLING_KEYS.items() if config.get(key)] or ["mean"]
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise ValueError(f"{model_dir} pools with {unknown}; lakescore computes {', '.join(POOLING_MODES)}")
    return modes


def load_embedder(spec: ModelSpec, model_dir: Path) -> Any:
    """Load the embedding model in ``model_dir`` as ``spec`` configures it (:func:`load_sentence_embedder`); with
    ``embed.chunk`` (``spec.embed``) over chunks of each text (:func:`~lakescore.udfs.chunking.chunked_embedder`).
    Raises as :func:`load_sentence_embedder` does, and ``ValueError`` for chunk settings the model cannot take."""
    head = load_sentence_embedder(spec, model_dir)
    options = spec.embed
    if options is None or not options.chunked:
        return head
    from lakescore.udfs.chunking import chunked_embedder

    chunk = options.chunk
    return chunked_embedder(
        head, chunk.max_tokens, chunk.overlap_tokens, chunk.max_chunks, chunk.document_vector == "mean"
    )


def load_sentence_embedder(spec: ModelSpec, model_dir: Path) -> SentenceEmbedder:
    """Load the embedding model in ``model_dir`` as ``spec`` configures it.

    Only safetensors weights load unless ``spec.allow_pickle``; remote code runs only with
    ``spec.trust_remote_code``. Raises ``ValueError`` for a pooling override on a model whose
    sentence-transformers config already fixes its pooling, or for modules this head does not
    read on the ONNX backend; :class:`~lakescore.udfs.models.model_source.ModelSourceError` for refused weights.
    """
    require_directory(model_dir, "embed")
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    prompt = prompt_text(spec, model_dir)
    if not (model_dir / "modules.json").is_file() and dual_tower_text_config(model_dir) is not None:
        return _load_text_tower(spec, model_dir, prompt)
    config = sentence_config(spec, model_dir)
    if config is None:
        if spec.backend != "torch":
            raise ValueError(
                f"{model_dir / 'modules.json'} holds modules beyond Transformer, Pooling and Normalize; "
                f"they run on the torch backend only, not {spec.backend}"
            )
        from lakescore.udfs.heads.st_fallback import load_with_sentence_transformers

        return load_with_sentence_transformers(spec, model_dir, SentenceEmbedder, prompt)
    tokenizer = load_tokenizer(spec, config.transformer_dir)
    if config.do_lower_case:
        _lowercase_first(tokenizer)
    forward = load_forward(spec, config.transformer_dir, KIND, tokenizer.model_input_names)
    max_length = _max_length(spec, config, tokenizer)
    return SentenceEmbedder(forward, tokenizer, max_length, config.pooling, config.normalize, prompt)


def _max_length(spec: ModelSpec, config: SentenceConfig, tokenizer: Any) -> int:
    """The tokens a text is truncated at: ``model.max_seq_length``, else the model's ``max_seq_length``, within its
    positions and the tokenizer's limit (:func:`~lakescore.udfs.heads.hf_models.truncation_limit`)."""
    facts = model_facts(config.transformer_dir)
    limit_spec = spec if spec.max_seq_length is not None else _with_max_seq_length(spec, config.max_seq_length)
    return truncation_limit(limit_spec, facts.max_position_embeddings, tokenizer)


def served_embedding(spec: ModelSpec, model_dir: Path) -> tuple[int, bool, str]:
    """What the in-process head reads of ``model_dir`` besides the weights, for a served engine to embed as it does:
    the tokens a text is truncated at, whether the vectors are normalised, and the prompt every text is prefixed with.
    ``ValueError`` for a model this head would not run as a sentence-transformers one (a dual-tower model, modules
    beyond Transformer, Pooling and Normalize), and as :func:`load_sentence_embedder` raises."""
    require_directory(model_dir, "embed")
    prompt = prompt_text(spec, model_dir)
    config = (
        None
        if dual_tower_text_config(model_dir) is not None and not (model_dir / "modules.json").is_file()
        else sentence_config(spec, model_dir)
    )
    if config is None:
        raise ValueError(
            f"{model_dir} is not a Transformer, Pooling[, Normalize] embedding model (a dual-tower model, or "
            "modules beyond those); embed.server runs only those, embed it in-process"
        )
    return _max_length(spec, config, load_tokenizer(spec, config.transformer_dir)), config.normalize, prompt


def dual_tower_text_config(model_dir: Path) -> dict | None:
    """The text tower's configuration of a dual-tower (CLIP-style: ``text_config`` and ``vision_config``) model in
    ``model_dir``, else ``None``."""
    config = _read_json(model_dir / "config.json")
    return config.get("text_config") if "text_config" in config and "vision_config" in config else None


def _load_text_tower(spec: ModelSpec, model_dir: Path, prompt: str) -> SentenceEmbedder:
    """The embed head over a dual-tower model's text tower (:data:`TEXT_TOWER`, torch), rows truncated at the text
    tower's position limit. Raises ``ValueError`` for another backend, a pooling override (the tower pools), and a
    tower that pools the last position (:data:`_TEXT_POOLED_AT_LAST_POSITION`)."""
    model_type = _read_json(model_dir / "config.json").get("model_type")
    if spec.backend != "torch":
        raise ValueError(
            f"{model_dir} is a dual-tower ({model_type}) model, whose text tower runs on torch, not {spec.backend}"
        )
    if spec.pooling is not None:
        raise ValueError(
            f"model.pooling={spec.pooling!r}: the text tower of {model_dir} pools itself; remove the setting"
        )
    if model_type in _TEXT_POOLED_AT_LAST_POSITION:
        raise ValueError(
            f"{model_dir} is a {model_type} model, whose text tower pools the last of a fixed number of "
            "positions; lakescore's embed does not compute that"
        )
    tokenizer = load_tokenizer(spec, model_dir)
    forward = load_forward(spec, model_dir, TEXT_TOWER, tokenizer.model_input_names)
    limit = truncation_limit(spec, (dual_tower_text_config(model_dir) or {}).get("max_position_embeddings"), tokenizer)
    return SentenceEmbedder(forward, tokenizer, limit, (), spec.normalize is not False, prompt)


def prompt_text(spec: ModelSpec, model_dir: Path) -> str:
    """What every text is prefixed with, as ``SentenceTransformer.encode(prompt_name=spec.prompt_name)`` does:
    the prompt named ``spec.prompt_name`` in ``config_sentence_transformers.json``, else the one its
    ``default_prompt_name`` names, else none (``""``).

    Raises ``ValueError`` for a name the model's ``prompts`` lack, and for a prompt on a model whose pooling leaves
    the prompt's tokens out (``include_prompt: false``, INSTRUCTOR-style), which this head does not compute.
    """
    settings = _read_json(model_dir / "config_sentence_transformers.json")
    prompts = settings.get("prompts") or {}
    name = spec.prompt_name if spec.prompt_name is not None else settings.get("default_prompt_name")
    if name is None:
        return ""
    if name not in prompts:
        what = "model.prompt_name" if spec.prompt_name is not None else f"{model_dir}'s default_prompt_name"
        raise ValueError(
            f"{what} {name!r} is not one of the model's prompts: {', '.join(sorted(prompts)) or 'it has none'}"
        )
    prompt = prompts[name] or ""
    if prompt and not _pooling_includes_prompt(model_dir):
        raise ValueError(
            f"{model_dir} pools without its prompt's tokens (include_prompt: false), which lakescore does not compute; "
            "use a prompt-free model.prompt_name"
        )
    return prompt


def _pooling_includes_prompt(model_dir: Path) -> bool:
    """Whether the ``Pooling`` module of ``model_dir``'s ``modules.json`` pools the prompt's tokens too (the
    default)."""
    modules = (
        json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        if (model_dir / "modules.json").is_file()
        else []
    )
    pooling = [m for m in modules if str(m.get("type", "")).endswith("Pooling")]
    return (
        not pooling
        or _read_json(model_dir / pooling[0].get("path", "") / "config.json").get("include_prompt", True) is not False
    )


def _with_max_seq_length(spec: ModelSpec, max_seq_length: int | None) -> ModelSpec:
    import dataclasses

    return dataclasses.replace(spec, max_seq_length=max_seq_length)


def _lowercase_first(tokenizer) -> None:
    """Lower-case in the tokenizer's normalizer, unless it does already: what sentence-transformers' Transformer
    does for ``do_lower_case`` (so casing follows the tokenizer's Unicode rules, not Python's ``str.lower``)."""
    from tokenizers.normalizers import Lowercase, Sequence

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    if current is not None and "Lowercase" in repr(current):
        return
    backend.normalizer = Sequence([Lowercase()] + ([current] if current is not None else []))
