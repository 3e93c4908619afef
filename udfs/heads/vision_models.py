"""Loading a Hugging Face vision model for an image head: its image processor and its forward, and what every image
head shares.

The same trust rules as the text heads (:mod:`lakescore.udfs.heads.hf_models`): safetensors only unless
``spec.allow_pickle``, the model's own code only with ``spec.trust_remote_code``, files from ``model_dir`` only.
Preprocessing is the model's own ``AutoImageProcessor``, the one ``transformers.pipeline`` loads, so resizing,
cropping and normalisation are the pipeline's. The forward runs on torch
(:class:`~lakescore.udfs.models.backends.TorchForward`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lakescore.schemas.reasons import RowFailure
from lakescore.udfs.images import decode_image, pixel_limit, read_header
from lakescore.udfs.models.backends import Forward, ModelKind, TorchForward, load_torch_model
from lakescore.udfs.models.model_source import ModelSpec, refuse_pickle_weights, require_directory

__all__ = ["ImageHead", "INPUT_NAMES", "load_image_processor", "load_vision_forward"]

INPUT_NAMES = ("pixel_values",)


class ImageHead:
    """What every image head shares: the model's image processor and its forward.

    A head adds ``forward(features)`` (``{"pixel_values": (n, C, H, W)}`` -> one output row per image),
    ``columns(outputs, ok)`` and ``fidelity``; the image runner (:class:`~lakescore.udfs.runners.ImageRunner`)
    decodes, calls :meth:`preprocess` in bounded chunks and scores through the batching core.
    """

    def __init__(self, forward: Forward, processor: Any) -> None:
        self._forward = forward
        self._processor = processor

    def preprocess(self, images: list) -> Any:
        """The processor's ``pixel_values`` for RGB ``images``, as the image pipelines call it (torch tensors)."""
        return self._processor(images=images, return_tensors="pt")["pixel_values"]

    def score(self, values: Sequence[bytes]) -> np.ndarray:
        """Convenience for a few images (the executors' preflight): encoded ``values`` decoded, preprocessed and run
        as one batch. Raises ``ValueError`` for an image that cannot be decoded."""
        images = []
        for data in values:
            image = read_header(data, pixel_limit(None))[1] or decode_image(data)
            if isinstance(image, RowFailure):
                raise ValueError(f"{image.reason}: {image.error}")
            images.append(image)
        return self.forward({INPUT_NAMES[0]: self.preprocess(images)})

    def forward(self, features) -> np.ndarray:
        raise NotImplementedError


def load_image_processor(spec: ModelSpec, model_dir: Path):
    """``AutoImageProcessor`` from ``model_dir``, as ``transformers.pipeline`` loads it."""
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(
        str(model_dir), local_files_only=True, trust_remote_code=spec.trust_remote_code
    )


def load_vision_forward(spec: ModelSpec, model_dir: Path, kind: ModelKind, method: str | None = None) -> TorchForward:
    """The torch forward of ``kind`` for the model in ``model_dir``, calling the model's ``method`` when it has one
    (e.g. ``get_image_features``; else the model itself).

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` for a file where a directory is needed or
    refused pickle weights, :class:`~lakescore.udfs.models.model_source.UnfitModelError` for weights the model lacks
    that ``kind`` reads; loader errors of transformers propagate.
    """
    require_directory(model_dir, spec.task)
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    model = load_torch_model(spec, model_dir, kind)
    return TorchForward(model, kind.output, INPUT_NAMES, method if method and hasattr(model, method) else None)
