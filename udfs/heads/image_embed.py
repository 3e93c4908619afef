"""The ``image_embed`` head: image -> L2-normalised embedding.

A CLIP / SigLIP-style model (one with ``get_image_features``) embeds with its image tower and projection, exactly
``model.get_image_features(pixel_values)``, into the space its text tower embeds text in (the ``embed`` task on the
same model directory: :mod:`lakescore.udfs.heads.embed`), so images can be searched by text. Any other vision backbone
(``AutoModel``: ViT, ResNet, ConvNeXt, DINOv2, ...) embeds with its pooled output (``pooler_output``, flattened).
Either is normalised to unit length. Preprocessing is the model's own ``AutoImageProcessor``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from lakescore.udfs.arrow_columns import list_column
from lakescore.udfs.heads.embed import SentenceEmbedder, l2_normalize
from lakescore.udfs.heads.vision_models import ImageHead, load_image_processor, load_vision_forward
from lakescore.udfs.models.backends import ModelKind
from lakescore.udfs.models.model_source import ModelSpec

__all__ = ["ImageEmbedder", "load_image_embedder", "KIND", "TOWER_METHOD"]

KIND = ModelKind("AutoModel", "pooler_output")
TOWER_METHOD = "get_image_features"
"""What a dual-tower (CLIP-style) model embeds an image with; its output's ``pooler_output`` is the projection."""


class ImageEmbedder(ImageHead):
    """The image_embed head: ``pixel_values`` -> float32 ``(n, dimension)`` unit vectors. Output: ``embedding``."""

    def forward(self, features) -> np.ndarray:
        vectors = self._forward(features)
        return l2_normalize(vectors.reshape(len(vectors), -1)).astype(np.float32, copy=False)  # ResNet: (n, C, 1, 1)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        return (list_column(outputs.astype(np.float32, copy=False), ok, pa.float32()),)

    fidelity = staticmethod(SentenceEmbedder.fidelity)


def load_image_embedder(spec: ModelSpec, model_dir: Path) -> ImageEmbedder:
    """Load the vision model in ``model_dir`` as ``spec`` configures it (torch): its image tower's features when it
    has ``get_image_features``, else its pooled output.

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` for refused weights and its
    :class:`~lakescore.udfs.models.model_source.UnfitModelError` for a checkpoint that lacks weights the embedding reads
    (e.g. a classifier's, whose base model has no trained pooler).
    """
    return ImageEmbedder(
        load_vision_forward(spec, model_dir, KIND, TOWER_METHOD), load_image_processor(spec, model_dir)
    )
