"""Loading a Hugging Face model with a labelled head (``classify``, ``ner``): the rules those heads share.

One place decides, for every head built on ``AutoTokenizer`` + an ``AutoModelFor...``
class, how the files are trusted and how long a row may be:

* safetensors only unless ``spec.allow_pickle`` (:func:`~lakescore.udfs.model_source.refuse_pickle_weights`
  before anything is read, and ``use_safetensors=True`` for the load itself);
* the model's own code only with ``spec.trust_remote_code``;
* files from ``model_dir`` only (``local_files_only``): workers never reach a hub;
* rows are truncated at :func:`truncation_limit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakescore.udfs.devices import torch_dtype
from lakescore.udfs.model_source import ModelSpec, refuse_pickle_weights, require_directory

__all__ = ["LabelledModel", "load_labelled_model", "truncation_limit"]

NO_TOKENIZER_LIMIT = 1_000_000
"""A ``tokenizer.model_max_length`` at or above this records no limit (transformers' placeholder is 1e30)."""


@dataclass(frozen=True)
class LabelledModel:
    """A loaded model (eval mode is the head's business), its tokenizer and the row length rows are cut to."""

    model: Any
    tokenizer: Any
    max_length: int


def load_labelled_model(spec: ModelSpec, model_dir: Path, auto_class: Any, kind: str) -> LabelledModel:
    """Load ``model_dir`` with ``auto_class`` (e.g. ``AutoModelForTokenClassification``) as ``spec`` configures it.

    The tokenizer is the directory's own; the model goes to ``spec.device`` at ``spec.dtype``.
    Raises :class:`~lakescore.udfs.model_source.ModelSourceError` for a file where a directory
    is needed or refused pickle weights, and ``ValueError`` for a model without labels
    (``id2label``; the message calls what was expected a ``kind``, e.g. "token classifier").
    Loader errors of transformers propagate.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker would flood executor logs
    require_directory(model_dir, spec.task)
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    common = {"local_files_only": True, "trust_remote_code": spec.trust_remote_code}
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), **common)
    model = auto_class.from_pretrained(
        str(model_dir), use_safetensors=None if spec.allow_pickle else True, dtype=torch_dtype(spec.dtype), **common
    ).to(spec.device)
    if not getattr(model.config, "id2label", None):
        raise ValueError(f"model {model_dir} has no id2label; it is not a {kind}")
    return LabelledModel(model, tokenizer, truncation_limit(spec, model.config, tokenizer))


def truncation_limit(spec: ModelSpec, config: Any, tokenizer: Any) -> int:
    """Tokens per row, special tokens included: the smallest of ``spec.max_seq_length``, the model's
    ``max_position_embeddings`` and the tokenizer's ``model_max_length``, each where set.

    The pipelines truncate at ``tokenizer.model_max_length`` alone; this is the same number
    whenever the model can run a row that long (and a limit where the tokenizer records none).
    """
    limits = [
        spec.max_seq_length,
        getattr(config, "max_position_embeddings", None),
        tokenizer.model_max_length if tokenizer.model_max_length < NO_TOKENIZER_LIMIT else None,
    ]
    return min(v for v in limits if v)
