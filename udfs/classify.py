"""The ``classify`` head: text -> label, its probability and every label's probability.

The same computation as ``transformers.pipeline("text-classification", top_k=None)``:
the model's own tokenizer and ``AutoModelForSequenceClassification``, then the
pipeline's default activation (sigmoid for one label or multi-label models,
softmax otherwise) over the logits. Labels come from the model's ``id2label``.
Unlike the pipeline, texts longer than the model's limit are truncated (the
pipeline raises on them) and batching is ours (:mod:`lakescore.udfs.batching`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from lakescore.udfs.arrow_columns import list_column, scalar_column, string_column
from lakescore.udfs.devices import to_device
from lakescore.udfs.hf_models import load_labelled_model
from lakescore.udfs.model_source import ModelSpec

__all__ = ["SequenceClassifier", "load_classifier"]


class SequenceClassifier:
    """The classify head (:class:`~lakescore.udfs.batching.TextHead`): texts -> float64 ``(n, num_labels)`` probabilities.

    Outputs per row: the label (string), its probability (double) and every label's
    probability (``array<double>`` in label-id order).
    """

    def __init__(self, model, tokenizer, max_length: int) -> None:
        self._model = model.eval()
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        config = model.config
        self.labels = [str(config.id2label[i]) for i in range(config.num_labels)]
        self._sigmoid = config.num_labels == 1 or config.problem_type == "multi_label_classification"

    def tokenize(self, texts: list[str]):
        return self._tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")

    @torch.inference_mode()
    def forward(self, features) -> np.ndarray:
        device = self._model.device
        features = {k: to_device(v, device) for k, v in features.items()}
        logits = self._model(**features).logits.float()
        probs = torch.sigmoid(logits) if self._sigmoid else torch.softmax(logits, dim=-1)
        return probs.double().cpu().numpy()

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        ok = np.asarray(ok, dtype=bool)
        best = outputs.argmax(axis=1)
        return (
            string_column([self.labels[i] for i in best], ok),
            scalar_column(outputs[np.arange(len(ok)), best], ok, pa.float64()),
            list_column(outputs, ok, pa.float64()),
        )

    def score(self, texts: list[str]) -> np.ndarray:
        """Convenience for small lists: one padded batch (the job uses :func:`~lakescore.udfs.batching.score_texts`)."""
        return self.forward(self.tokenize(texts))


def load_classifier(spec: ModelSpec, model_dir: Path) -> SequenceClassifier:
    """Load the sequence-classification model in ``model_dir`` as ``spec`` configures it.

    Safetensors only unless ``spec.allow_pickle``; remote code only with
    ``spec.trust_remote_code``; rows truncated at :func:`~lakescore.udfs.hf_models.truncation_limit`.
    Raises :class:`~lakescore.udfs.model_source.ModelSourceError` for refused weights and
    ``ValueError`` for a model without labels (:func:`~lakescore.udfs.hf_models.load_labelled_model`).
    """
    from transformers import AutoModelForSequenceClassification

    loaded = load_labelled_model(spec, model_dir, AutoModelForSequenceClassification, "sequence classifier")
    return SequenceClassifier(loaded.model, loaded.tokenizer, loaded.max_length)
