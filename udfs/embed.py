"""The ``embed`` head: text -> sentence embedding, exactly as sentence-transformers computes it.

The model is a ``SentenceTransformer`` built from the model directory's own
configuration (``modules.json``: Transformer -> Pooling -> [Dense] ->
[Normalize], ``max_seq_length`` from ``sentence_bert_config.json``), so the
vectors are the ones ``SentenceTransformer(dir).encode(texts)`` returns. A
plain Hugging Face directory without that configuration gets Transformer ->
Pooling (``mean`` unless configured ``cls``) -> Normalize (unless configured off).

We call the model's own ``preprocess`` and forward pass instead of ``encode``
because batching is ours (:mod:`lakescore.udfs.batching`): ``encode`` sorts by characters
and cuts fixed row counts; we tokenize once, sort by tokens and cut by a token budget.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from lakescore.udfs.arrow_columns import list_column
from lakescore.udfs.devices import to_device, torch_dtype
from lakescore.udfs.model_source import ModelSpec, refuse_pickle_weights, require_directory

__all__ = ["SentenceEmbedder", "load_embedder"]


class SentenceEmbedder:
    """The embed head (:class:`~lakescore.udfs.batching.TextHead`): texts -> float32 ``(n, dimension)``.

    Output: the embedding per row (``array<float>``).
    """

    def __init__(self, model) -> None:
        self._model = model.eval()
        self.dimension = int(model.get_embedding_dimension())
        self.max_seq_length = model.max_seq_length
        self.padding_side = getattr(model.tokenizer, "padding_side", "right")

    def tokenize(self, texts: list[str]):
        """The model's own preprocessing: tokenized, truncated at ``max_seq_length``, padded to the longest."""
        return self._model.preprocess(texts)

    @torch.inference_mode()
    def forward(self, features) -> np.ndarray:
        device = self._model.device
        features = {k: to_device(v, device) for k, v in features.items()}
        return self._model(features)["sentence_embedding"].float().cpu().numpy()

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        return (list_column(outputs.astype(np.float32, copy=False), ok, pa.float32()),)

    def score(self, texts: list[str]) -> np.ndarray:
        """Convenience for small lists: one padded batch, no budget (the job uses :func:`~lakescore.udfs.batching.score_texts`)."""
        return self.forward(self.tokenize(texts))


def load_embedder(spec: ModelSpec, model_dir: Path) -> SentenceEmbedder:
    """Load the embedding model in ``model_dir`` as ``spec`` configures it.

    Only safetensors weights load unless ``spec.allow_pickle``; remote code runs
    only with ``spec.trust_remote_code``. Raises ``ValueError`` for a pooling
    override on a model whose sentence-transformers config already fixes its
    pooling, :class:`~lakescore.udfs.model_source.ModelSourceError` for refused weights.
    """
    require_directory(model_dir, "embed")
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker would flood executor logs

    model_kwargs = {"use_safetensors": True} if not spec.allow_pickle else {}
    if (model_dir / "modules.json").is_file():
        if spec.pooling is not None:
            raise ValueError(
                f"model.pooling={spec.pooling!r} conflicts with the pooling fixed by {model_dir / 'modules.json'}; "
                "remove the setting to use the model's own"
            )
        model = SentenceTransformer(
            str(model_dir),
            device=spec.device,
            local_files_only=True,
            trust_remote_code=spec.trust_remote_code,
            model_kwargs=model_kwargs,
        )
    else:
        remote = {"trust_remote_code": spec.trust_remote_code}
        transformer = Transformer(
            str(model_dir), model_kwargs={**model_kwargs, **remote}, config_kwargs=remote, processor_kwargs=remote
        )
        pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=spec.pooling or "mean")
        model = SentenceTransformer(modules=[transformer, pooling, Normalize()], device=spec.device)

    if spec.normalize is not None:
        has_normalize = any(isinstance(m, Normalize) for m in model)
        if spec.normalize and not has_normalize:
            model.append(Normalize())
        elif not spec.normalize and has_normalize:
            model = SentenceTransformer(modules=[m for m in model if not isinstance(m, Normalize)], device=spec.device)
    if spec.max_seq_length is not None:
        model.max_seq_length = spec.max_seq_length
    return SentenceEmbedder(model.to(torch_dtype(spec.dtype)))
