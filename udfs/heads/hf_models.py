"""Loading a Hugging Face text model for a head: its tokenizer, its facts, its forward. The rules every text head
shares.

One place decides, for every head built on a Hugging Face directory, how the files are
trusted and how long a row may be:

* safetensors only unless ``spec.allow_pickle`` (:func:`~lakescore.udfs.models.model_source.refuse_pickle_weights`
  before anything is read, and ``use_safetensors=True`` for the load itself);
* the model's own code only with ``spec.trust_remote_code``;
* files from ``model_dir`` only (``local_files_only``): workers never reach a hub;
* rows are truncated at :func:`truncation_limit`;
* the forward runs on ``spec.backend`` (:mod:`lakescore.udfs.models.backends`).

The tokenizer class is the one ``tokenizer_config.json`` names, imported alone: ``AutoTokenizer``
(the fallback) imports torch through transformers' configuration module, which a worker on the
ONNX backend otherwise never needs. ``config.json`` is read as JSON for the same reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakescore.udfs.models.backends import Forward, ModelKind
from lakescore.udfs.models.forwards import load_forward
from lakescore.udfs.models.model_fit import NO_TOKENIZER_LIMIT
from lakescore.udfs.models.model_source import ModelSpec, UnfitModelError, refuse_pickle_weights, require_directory

__all__ = ["ModelFacts", "LabelledModel", "load_tokenizer", "model_facts", "load_labelled_model", "truncation_limit"]


@dataclass(frozen=True)
class ModelFacts:
    """What a head needs from ``config.json``: labels in id order, the problem type, the position limit; and the
    vocabulary's size (``None`` when not stated), below which the ONNX export's probe token ids are drawn."""

    labels: tuple[str, ...]
    problem_type: str | None
    max_position_embeddings: int | None
    vocab_size: int | None = None


@dataclass(frozen=True)
class LabelledModel:
    """A labelled model's forward, tokenizer, facts, and the row length rows are cut to."""

    forward: Forward
    tokenizer: Any
    facts: ModelFacts
    max_length: int


def load_tokenizer(spec: ModelSpec, model_dir: Path):
    """The directory's own tokenizer: the class ``tokenizer_config.json`` names, else ``AutoTokenizer``."""
    import transformers

    common = {"local_files_only": True, "trust_remote_code": spec.trust_remote_code}
    config = model_dir / "tokenizer_config.json"
    name = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class") if config.is_file() else None
    cls = getattr(transformers, name, None) if isinstance(name, str) and not spec.trust_remote_code else None
    if cls is None:
        cls = transformers.AutoTokenizer
    return cls.from_pretrained(str(model_dir), **common)


def model_facts(model_dir: Path) -> ModelFacts:
    """Labels, problem type, position limit and vocabulary size from ``model_dir/config.json`` (labels empty when it
    has none)."""
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    id2label = config.get("id2label")
    if id2label:
        labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
    elif config.get("num_labels"):
        labels = tuple(f"LABEL_{i}" for i in range(int(config["num_labels"])))  # transformers' default names
    else:
        labels = ()
    return ModelFacts(
        labels, config.get("problem_type"), config.get("max_position_embeddings"), config.get("vocab_size")
    )


def load_labelled_model(spec: ModelSpec, model_dir: Path, kind: ModelKind, what: str) -> LabelledModel:
    """Tokenizer, facts and ``spec.backend``'s forward of ``kind`` for the model in ``model_dir``.

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` for a file where a directory
    is needed or refused pickle weights, and its :class:`~lakescore.udfs.models.model_source.UnfitModelError` for a
    model without labels (``id2label``; the message calls what was expected ``what``, e.g. "token classifier") or
    without the weights of its head.
    Loader and export errors of transformers / ONNX propagate.
    """
    require_directory(model_dir, spec.task)
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    tokenizer = load_tokenizer(spec, model_dir)
    # the forward first: a base model's load names the head weights it lacks, which says more than its missing labels
    forward = load_forward(spec, model_dir, kind, tokenizer.model_input_names)
    facts = model_facts(model_dir)
    if not facts.labels:
        raise UnfitModelError(f"task {spec.task}: {model_dir} has no id2label (config.json); it is not a {what}")
    return LabelledModel(forward, tokenizer, facts, truncation_limit(spec, facts.max_position_embeddings, tokenizer))


def truncation_limit(spec: ModelSpec, max_position_embeddings: int | None, tokenizer: Any) -> int:
    """Tokens per row, special tokens included: the smallest of ``spec.max_seq_length``, the model's
    ``max_position_embeddings`` and the tokenizer's ``model_max_length``, each where set.

    The pipelines truncate at ``tokenizer.model_max_length`` alone; this is the same number
    whenever the model can run a row that long (and a limit where the tokenizer records none).
    """
    limits = [
        spec.max_seq_length,
        max_position_embeddings,
        tokenizer.model_max_length if tokenizer.model_max_length < NO_TOKENIZER_LIMIT else None,
    ]
    return min(v for v in limits if v)
