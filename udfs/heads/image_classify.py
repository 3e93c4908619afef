"""The ``image_classify`` head: image -> label, its probability and every label's probability.

The same computation as ``transformers.pipeline("image-classification", top_k=None)``: the image decoded as
``load_image`` does (:mod:`lakescore.udfs.images`), the model's own ``AutoImageProcessor``, any
``AutoModelForImageClassification`` (ViT, ResNet, ConvNeXt, ...), then the pipeline's default activation over the
logits (:func:`~lakescore.udfs.heads.classify.activation`: softmax, or sigmoid for one label or multi-label models).
Labels come from the model's ``id2label``; the columns are ``classify``'s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from lakescore.udfs.heads.classify import SequenceClassifier, activation, label_columns, probabilities
from lakescore.udfs.heads.hf_models import ModelFacts, model_facts
from lakescore.udfs.heads.vision_models import ImageHead, load_image_processor, load_vision_forward
from lakescore.udfs.models.backends import ModelKind
from lakescore.udfs.models.model_source import ModelSpec, UnfitModelError, require_directory

__all__ = ["ImageClassifier", "load_image_classifier", "KIND"]

KIND = ModelKind("AutoModelForImageClassification", "logits")


class ImageClassifier(ImageHead):
    """The image_classify head: ``pixel_values`` -> float64 ``(n, num_labels)`` probabilities.

    Outputs per row: the label (string), its probability (double) and every label's probability
    (``array<double>`` in label-id order).
    """

    def __init__(self, forward, processor, facts: ModelFacts) -> None:
        super().__init__(forward, processor)
        self.labels = list(facts.labels)
        self.activation = activation(facts)

    def forward(self, features) -> np.ndarray:
        return probabilities(self._forward(features), self.activation)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        return label_columns(self.labels, outputs, ok)

    fidelity = staticmethod(SequenceClassifier.fidelity)


def load_image_classifier(spec: ModelSpec, model_dir: Path) -> ImageClassifier:
    """Load the image-classification model in ``model_dir`` as ``spec`` configures it (torch).

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` for refused weights, its
    :class:`~lakescore.udfs.models.model_source.UnfitModelError` for a checkpoint without the classifier's weights (a
    base model's) or labels (``id2label``).
    """
    require_directory(model_dir, spec.task)
    forward = load_vision_forward(spec, model_dir, KIND)  # first: a base model's load names the head weights it lacks
    facts = model_facts(model_dir)
    if not facts.labels:
        raise UnfitModelError(
            f"task {spec.task}: {model_dir} has no id2label (config.json); it is not an image classifier"
        )
    return ImageClassifier(forward, load_image_processor(spec, model_dir), facts)
