"""Whether a model directory fits its task, read on the driver from its JSON files: refused before any compute.

Two layers refuse a model that would publish what a random head says, each where it is cheap:

* here, on the driver's copy of the model: an architecture ``config.json`` names that is not of the task's kind
  (:attr:`~lakescore.udfs.registry.Task.architectures`: a sequence classifier given to ``generate``), and the task's
  own checks of its settings against the model (:attr:`~lakescore.udfs.registry.Task.model_check`: ``generate``'s
  ``max_new_tokens`` against the context). JSON only: the driver imports no model library;
* on the executors, as they load the weights (:func:`lakescore.udfs.models.backends.load_torch_model`): weights the
  task's output reads that the checkpoint lacks.

Either raises :class:`~lakescore.udfs.models.model_source.UnfitModelError`, one line naming the task, the architecture
and what does not fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lakescore.udfs.models.json_files import NO_TOKENIZER_LIMIT, read_json
from lakescore.udfs.models.model_source import ModelSpec, UnfitModelError
from lakescore.udfs.registry import get_task, named

__all__ = ["check_model_fits", "read_json", "architectures", "NO_TOKENIZER_LIMIT"]


def architectures(config: dict[str, Any]) -> tuple[str, ...]:
    """The class names ``config.json`` says its weights were saved from (``architectures``)."""
    names = config.get("architectures") or ()
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, (list, tuple)) else ()


def check_model_fits(spec: ModelSpec, model_dir: Path) -> None:
    """Refuse, with :class:`~lakescore.udfs.models.model_source.UnfitModelError`, a model whose ``config.json`` names
    only architectures of another kind than ``spec.task``'s, or that the task's own model check refuses. A directory
    without a readable ``config.json`` (a tabular program, a broken copy) is left to the executors' load."""
    config = read_json(Path(model_dir) / "config.json")
    if config is None:
        return
    task = get_task(spec.task)
    names = architectures(config)
    # a model with its own code ("auto_map") may name its classes as it likes; the executors' load still checks weights
    if (
        task.architectures
        and names
        and "auto_map" not in config
        and not any(part in name for name in names for part in task.architectures)
    ):
        raise UnfitModelError(
            f"task {spec.task}: {model_dir} holds a {', '.join(names)} (config.json architectures), not a "
            f"{' / '.join('…' + part for part in task.architectures)} model; its weights have no trained head for "
            f"{spec.task}"
        )
    if task.model_check:
        named(task.model_check)(spec, Path(model_dir), config)
