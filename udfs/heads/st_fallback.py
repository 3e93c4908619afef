"""Embedding models whose sentence-transformers modules the embed head does not read itself (e.g. ``Dense``).

sentence-transformers loads the whole module chain and runs it as the forward (torch only);
the embed head then neither pools nor normalises (the chain did). Every other embedding
model skips this module and sentence-transformers' import (:mod:`lakescore.udfs.heads.embed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lakescore.udfs.models.backends import Reduce
from lakescore.udfs.models.devices import to_device, torch_dtype
from lakescore.udfs.models.model_source import ModelSpec

__all__ = ["SentenceTransformerForward", "load_with_sentence_transformers"]


class SentenceTransformerForward:
    """A ``SentenceTransformer``'s whole module chain as a forward: tokenized rows -> sentence embeddings."""

    def __init__(self, model) -> None:
        self._model = model.eval()
        self.device = str(model.device)
        self.input_names = tuple(model.tokenizer.model_input_names)

    def __call__(self, features: Mapping[str, Any], reduce: Reduce | None = None) -> np.ndarray:
        import torch

        with torch.inference_mode():
            inputs = {
                k: to_device(torch.as_tensor(features[k]), self.device) for k in self.input_names if k in features
            }
            output = self._model(inputs)["sentence_embedding"].float()
            return (output if reduce is None else reduce(output, inputs)).cpu().numpy()


def load_with_sentence_transformers(spec: ModelSpec, model_dir: Path, head_class, prompt: str = ""):
    """``head_class(forward, tokenizer, max_seq_length, pooling=(), normalize=False, prompt=prompt)`` around
    ``SentenceTransformer(model_dir)``, with ``spec``'s ``normalize`` and ``max_seq_length`` applied."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    model = SentenceTransformer(
        str(model_dir),
        device=spec.device,
        local_files_only=True,
        trust_remote_code=spec.trust_remote_code,
        model_kwargs={"use_safetensors": True} if not spec.allow_pickle else {},
    )
    if spec.normalize is not None:
        kept = [m for m in model if not isinstance(m, Normalize)] + ([Normalize()] if spec.normalize else [])
        model = SentenceTransformer(modules=kept, device=spec.device)
    if spec.max_seq_length is not None:
        model.max_seq_length = spec.max_seq_length
    model = model.to(torch_dtype(spec.dtype))
    return head_class(SentenceTransformerForward(model), model.tokenizer, model.max_seq_length, (), False, prompt)
