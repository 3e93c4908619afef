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
entities past the limit are not found. See :func:`~lakescore.udfs.hf_models.truncation_limit`
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
from lakescore.udfs.devices import to_device
from lakescore.udfs.hf_models import load_labelled_model
from lakescore.udfs.model_source import ModelSpec
from lakescore.udfs.registry import get_task

__all__ = ["TokenClassifier", "load_token_classifier"]

TEXTS = "lakescore_texts"
"""Feature key of the texts themselves (numpy object array, one per row): postprocessing slices them by offsets."""


class TokenClassifier:
    """The ner head (:class:`~lakescore.udfs.batching.TextHead`): texts -> a 1-D object array, one list of
    entity dicts per row, each ``{entity_group, score, word, start, end}`` as the pipeline returns them
    (``start``/``end`` character offsets into the text; ``None`` with a tokenizer that has no offsets).

    Output: one ``array<struct<...>>`` column of the entities per row, typed by the task's output field.
    """

    def __init__(self, model, tokenizer, max_length: int, entities_type: pa.DataType) -> None:
        from transformers.pipelines.token_classification import AggregationStrategy, TokenClassificationPipeline

        self._model = model.eval()
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        self._model_inputs = tuple(tokenizer.model_input_names)
        self._entities_type = entities_type
        # The pipeline object only postprocesses (forward passes are ours). device= keeps it from moving the model
        # to cuda:0; its own tokenizer copy keeps its reads off the tokenizer the prefetch thread encodes with.
        self._postprocessor = TokenClassificationPipeline(
            model=model, tokenizer=copy.deepcopy(tokenizer), device=model.device
        )
        self._strategy = AggregationStrategy.SIMPLE

    def tokenize(self, texts: list[str]) -> dict[str, Any]:
        """Model inputs padded to the longest row (truncated at ``max_length``), plus what postprocessing needs per
        row: ``special_tokens_mask``, ``offset_mapping`` (fast tokenizers) and the texts, all shaped (n, ...)."""
        features = dict(
            self._tokenizer(
                texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt",
                return_special_tokens_mask=True, return_offsets_mapping=self._tokenizer.is_fast,
            )
        )
        features[TEXTS] = np.array(texts, dtype=object)  # shape (n,): numpy does not split strings
        return features

    @torch.inference_mode()
    def forward(self, features) -> np.ndarray:
        """One list of entity dicts per row (plain Python values), as a 1-D object array."""
        device = self._model.device
        inputs = {k: to_device(features[k], device) for k in self._model_inputs if k in features}
        logits = self._model(**inputs).logits.float().cpu()
        rows = np.empty(len(logits), dtype=object)
        for i in range(len(logits)):
            rows[i] = self._entities(features, logits, i)
        return rows

    def _entities(self, features, logits: torch.Tensor, i: int) -> list[dict[str, Any]]:
        """Row ``i``'s entities: its own tokens (padding cut), through the pipeline's postprocessing."""
        real = features["attention_mask"][i].bool()
        offsets = features.get("offset_mapping")
        row = {
            "logits": logits[i][real][None],
            "input_ids": features["input_ids"][i][real][None],
            "special_tokens_mask": features["special_tokens_mask"][i][real][None],
            "offset_mapping": None if offsets is None else offsets[i][real][None],
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


def load_token_classifier(spec: ModelSpec, model_dir: Path) -> TokenClassifier:
    """Load the token-classification model in ``model_dir`` as ``spec`` configures it.

    Safetensors only unless ``spec.allow_pickle``; remote code only with
    ``spec.trust_remote_code``; rows truncated at :func:`~lakescore.udfs.hf_models.truncation_limit`.
    Raises :class:`~lakescore.udfs.model_source.ModelSourceError` for refused weights,
    ``ValueError`` for a model without labels (:func:`~lakescore.udfs.hf_models.load_labelled_model`)
    or a task whose outputs are not the one entities column this head returns.
    """
    from transformers import AutoModelForTokenClassification

    loaded = load_labelled_model(spec, model_dir, AutoModelForTokenClassification, "token classifier")
    types = get_task(spec.task).output_arrow_types
    if len(types) != 1:
        raise ValueError(f"the token classifier returns one column; task {spec.task!r} declares {len(types)} outputs")
    return TokenClassifier(loaded.model, loaded.tokenizer, loaded.max_length, types[0])


def _python(value: Any) -> Any:
    """A numpy scalar (the pipeline's scores) as the Python value Arrow converts; anything else unchanged."""
    return value.item() if isinstance(value, np.generic) else value
