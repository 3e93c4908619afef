"""The model errors the executors raise and the driver reports: each one line an operator reads."""

from __future__ import annotations

__all__ = ["ModelSourceError", "ModelIntegrityError", "UnfitModelError"]


class ModelSourceError(RuntimeError):
    """The model source cannot be found, fetched or read, or holds weights we refuse to load."""


class ModelIntegrityError(ModelSourceError):
    """The weights found are not the weights the run was pinned to (``--expect-sha256``)."""


class UnfitModelError(ModelSourceError):
    """The model does not fit its task: an architecture of another kind, weights the task's output reads that the
    checkpoint lacks (transformers would initialise them at random), or a tokenizer the task's engine cannot use.
    Its message is the one line an operator reads."""
