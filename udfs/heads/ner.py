"""The ``ner`` head: text -> the entities in it, as token classification finds them.

The same result as ``transformers.pipeline("token-classification", aggregation_strategy="simple")``:
the model's own tokenizer and ``AutoModelForTokenClassification``, then the pipeline's
own postprocessing (softmax over each token's logits, the arg-max label per token,
special tokens dropped, adjacent ``B-``/``I-`` tokens of one tag grouped, ``O`` dropped),
called on the logits our batches computed. Only the forward passes are ours
(:mod:`lakescore.udfs.batching`): tokens of a padded row are cut back to the row's own
before postprocessing, so a row's entities do not depend on its batch.

Texts longer than the model's limit are truncated, as the pipeline does by default
(``stride`` unset: one chunk, ``truncation=True`` at ``tokenizer.model_max_length``);
entities past the limit are not found. See :func:`~lakescore.udfs.heads.hf_models.truncation_limit`
for when the limit differs from the pipeline's (``model.max_seq_length`` set, or a
tokenizer that records no limit, where the pipeline fails on long rows).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lakescore.udfs.arrow_columns import python_column
from lakescore.udfs.heads.hf_models import LabelledModel, load_labelled_model
from lakescore.udfs.models.backends import ModelKind
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task

__all__ = ["TokenClassifier", "load_token_classifier", "KIND"]

KIND = ModelKind("AutoModelForTokenClassification", "logits")

TEXTS = "lakescore_texts"
"""Feature key of the texts themselves (numpy object array, one per row): postprocessing slices them by offsets."""


class TokenClassifier:
    """The ner head (:class:`~lakescore.udfs.batching.TextHead`): texts -> a 1-D object array, one list of
    entity dicts per row, each ``{entity_group, score, word, start, end}`` as the pipeline returns them
    (``start``/``end`` character offsets into the text; ``None`` with a tokenizer that has no offsets).

    Output: one ``array<struct<...>>`` column of the entities per row, typed by the task's output field.
    """

    def __init__(self, loaded: LabelledModel, postprocessor, entities_type: pa.DataType) -> None:
        from transformers.pipelines.token_classification import AggregationStrategy

        self._forward = loaded.forward
        self._tokenizer = loaded.tokenizer
        self.max_length = loaded.max_length
        self.padding_side = getattr(loaded.tokenizer, "padding_side", "right")
        self._entities_type = entities_type
        self._postprocessor = postprocessor
        self._strategy = AggregationStrategy.SIMPLE

    def tokenize(self, texts: list[str]) -> dict[str, Any]:
        """Model inputs padded to the longest row (truncated at ``max_length``), plus what postprocessing needs per
        row: ``special_tokens_mask``, ``offset_mapping`` (fast tokenizers) and the texts, all shaped (n, ...)."""
        features = dict(
            self._tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="np",
                return_special_tokens_mask=True,
                return_offsets_mapping=self._tokenizer.is_fast,
            )
        )
        features[TEXTS] = np.array(texts, dtype=object)  # shape (n,): numpy does not split strings
        return features

    def forward(self, features) -> np.ndarray:
        """One list of entity dicts per row (plain Python values), as a 1-D object array."""
        logits = torch.from_numpy(np.asarray(self._forward(features), dtype=np.float32))
        rows = np.empty(len(logits), dtype=object)
        for i in range(len(logits)):
            rows[i] = self._entities(features, logits, i)
        return rows

    def _entities(self, features, logits: torch.Tensor, i: int) -> list[dict[str, Any]]:
        """Row ``i``'s entities: its own tokens (padding cut), through the pipeline's postprocessing."""
        real = np.asarray(features["attention_mask"][i]).astype(bool)
        offsets = features.get("offset_mapping")

        def cut(values):  # the row's own tokens, as the (1, tokens, ...) tensor the pipeline's postprocess reads
            return torch.as_tensor(np.asarray(values)[real][None])

        row = {
            "logits": logits[i][torch.from_numpy(real)][None],
            "input_ids": cut(features["input_ids"][i]),
            "special_tokens_mask": cut(features["special_tokens_mask"][i]),
            "offset_mapping": None if offsets is None else cut(offsets[i]),
            "sentence": features[TEXTS][i],
        }
        entities = self._postprocessor.postprocess([row], aggregation_strategy=self._strategy)
        return [{key: _python(value) for key, value in entity.items()} for entity in entities]

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        return (python_column(outputs, np.asarray(ok, dtype=bool), self._entities_type),)

    def score(self, texts: list[str]) -> np.ndarray:
        """Convenience for small lists: one padded batch (the job uses :func:`~lakescore.udfs.batching.score_texts`)."""
        return self.forward(self.tokenize(texts))

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        """How close ``outputs`` are to ``reference`` (same rows): the fraction of rows with the same entities
        (tag, start, end), and the largest score difference over entities found both ways."""
        same, deltas = [], [0.0]
        for ref, out in zip(reference, outputs):
            spans = {(e["entity_group"], e["start"], e["end"]): e["score"] for e in ref}
            found = {(e["entity_group"], e["start"], e["end"]): e["score"] for e in out}
            same.append(spans.keys() == found.keys())
            deltas += [abs(spans[k] - found[k]) for k in spans.keys() & found.keys()]
        return {"agreement": float(np.mean(same)) if same else 1.0, "score_delta_max": float(max(deltas))}


def load_token_classifier(spec: ModelSpec, model_dir: Path) -> TokenClassifier:
    """Load the token-classification model in ``model_dir`` as ``spec`` configures it.

    Safetensors only unless ``spec.allow_pickle``; remote code only with
    ``spec.trust_remote_code``; rows truncated at :func:`~lakescore.udfs.heads.hf_models.truncation_limit`;
    the forward on ``spec.backend``. Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError`
    for refused weights, ``ValueError`` for a model without labels
    (:func:`~lakescore.udfs.heads.hf_models.load_labelled_model`) or a task whose outputs are not the
    one entities column this head returns.
    """
    types = get_task(spec.task).output_arrow_types
    if len(types) != 1:
        raise ValueError(f"the token classifier returns one column; task {spec.task!r} declares {len(types)} outputs")
    loaded = load_labelled_model(spec, model_dir, KIND, "token classifier")
    return TokenClassifier(loaded, _postprocessor(spec, model_dir, loaded.tokenizer), types[0])


def _postprocessor(spec: ModelSpec, model_dir: Path, tokenizer):
    """The pipeline object that only postprocesses (forward passes are ours): built around a weightless
    copy of the model on the ``meta`` device (it reads the labels from its config, nothing else), with its
    own tokenizer copy, so its reads stay off the tokenizer the prefetch thread encodes with."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.pipelines.token_classification import TokenClassificationPipeline

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=spec.trust_remote_code)
    with torch.device("meta"):
        shell = AutoModelForTokenClassification.from_config(config, trust_remote_code=spec.trust_remote_code)
    return TokenClassificationPipeline(model=shell, tokenizer=copy.deepcopy(tokenizer), device=torch.device("meta"))


def _python(value: Any) -> Any:
    """A numpy scalar (the pipeline's scores) as the Python value Arrow converts; anything else unchanged."""
    return value.item() if isinstance(value, np.generic) else value
