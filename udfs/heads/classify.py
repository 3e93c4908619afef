"""The ``classify`` head: text -> label, its probability and every label's probability.

The same computation as ``transformers.pipeline("text-classification", top_k=None)``:
the model's own tokenizer and ``AutoModelForSequenceClassification``, then the
pipeline's default activation over the logits (:func:`activation`: none for a regression
model, sigmoid for one label or multi-label models, softmax otherwise). Labels come from
the model's ``id2label``.
Unlike the pipeline, texts longer than the model's limit are truncated (the
pipeline raises on them) and batching is ours (:mod:`lakescore.udfs.batching`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from lakescore.udfs.arrow_columns import list_column, scalar_column, string_column
from lakescore.udfs.heads.hf_models import LabelledModel, ModelFacts, load_labelled_model
from lakescore.udfs.models.backends import ModelKind
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.tokenization import BatchEncoder

__all__ = ["SequenceClassifier", "load_classifier", "activation", "probabilities", "label_columns", "KIND"]

KIND = ModelKind("AutoModelForSequenceClassification", "logits")


class SequenceClassifier:
    """The classify head (:class:`~lakescore.udfs.batching.TextHead`): texts -> float64 ``(n, num_labels)``
    probabilities.

    Outputs per row: the label (string), its probability (double) and every label's
    probability (``array<double>`` in label-id order); a regression model's score in place of a probability.
    """

    def __init__(self, loaded: LabelledModel) -> None:
        self._forward = loaded.forward
        self._encode = BatchEncoder(loaded.tokenizer, loaded.max_length)
        self.max_length = loaded.max_length
        self.padding_side = self._encode.padding_side
        self.labels = list(loaded.facts.labels)
        self.activation = activation(loaded.facts)

    def tokenize(self, texts: list[str]):
        return self._encode(texts)

    def forward(self, features) -> np.ndarray:
        """Probabilities per label (a regression model's scores), float64 ``(n, num_labels)``: the pipeline's
        activation over the logits, computed in float32 as torch computes it, then widened."""
        return probabilities(self._forward(features), self.activation)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        return label_columns(self.labels, outputs, ok)

    def score(self, texts: list[str]) -> np.ndarray:
        """Convenience for small lists: one padded batch (the job uses :func:`~lakescore.udfs.batching.score_texts`)."""
        return self.forward(self.tokenize(texts))

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """How close ``outputs`` are to ``reference`` (same rows): label agreement, and the 99th percentile
        (and max) over rows of the largest per-label probability difference."""
        delta = np.abs(np.asarray(outputs) - np.asarray(reference)).max(axis=1)
        return {
            "agreement": float((outputs.argmax(axis=1) == reference.argmax(axis=1)).mean()),
            "prob_delta_p99": float(np.percentile(delta, 99)),
            "prob_delta_max": float(delta.max()),
        }


def probabilities(logits: np.ndarray, activation: str) -> np.ndarray:
    """``activation`` (:func:`activation`) over ``logits`` (n, num_labels), computed in float32 as the pipelines
    compute it, then widened to float64."""
    logits = np.asarray(logits).astype(np.float32, copy=False)
    if activation == "sigmoid":
        probs = 1.0 / (1.0 + np.exp(-logits))
    elif activation == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = shifted / shifted.sum(axis=-1, keepdims=True)
    else:
        probs = logits
    return probs.astype(np.float64)


def label_columns(labels: Sequence[str], outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
    """The classify columns for per-label ``outputs`` (n, len(labels)): the best label, its probability, and every
    label's probability in label-id order; null where not ``ok``."""
    ok = np.asarray(ok, dtype=bool)
    best = outputs.argmax(axis=1)
    return (
        string_column([labels[i] for i in best], ok),
        scalar_column(outputs[np.arange(len(ok)), best], ok, pa.float64()),
        list_column(outputs, ok, pa.float64()),
    )


def activation(facts: ModelFacts) -> str:
    """``none``, ``sigmoid`` or ``softmax``: what the text-classification pipeline applies to this model's logits by
    default. A ``regression`` model's output is its score; one label or ``multi_label_classification``: each label's
    own probability; otherwise one distribution over the labels."""
    if facts.problem_type == "regression":
        return "none"
    if facts.problem_type == "multi_label_classification" or len(facts.labels) == 1:
        return "sigmoid"
    return "softmax"


def load_classifier(spec: ModelSpec, model_dir: Path) -> SequenceClassifier:
    """Load the sequence-classification model in ``model_dir`` as ``spec`` configures it.

    Safetensors only unless ``spec.allow_pickle``; remote code only with
    ``spec.trust_remote_code``; rows truncated at :func:`~lakescore.udfs.heads.hf_models.truncation_limit`;
    the forward on ``spec.backend``. Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError`
    for refused weights and ``ValueError`` for a model without labels
    (:func:`~lakescore.udfs.heads.hf_models.load_labelled_model`).
    """
    return SequenceClassifier(load_labelled_model(spec, model_dir, KIND, "sequence classifier"))
