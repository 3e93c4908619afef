"""Backends: what runs a model's transformer forward, swappable under every text head (image heads: torch only).

A head (``embed``, ``classify``, ``ner``) tokenizes into numpy arrays, asks its backend for the
forward's one output as float32 numpy (the token embeddings for ``embed``, the logits for
``classify`` and ``ner``) and does its own pooling, activation or postprocessing on it: the same
code whatever ran the forward. A head may hand the forward a ``reduce`` step (``embed``'s pooling) that the
forward runs on its own arrays before anything reaches the host: on a GPU that copies (n, d) back instead
of (n, L, d) and pools on the device. Two backends:

* ``torch``: the Hugging Face model itself (safetensors are memory-mapped by ``safetensors``);
* ``onnx``: ONNX Runtime on a graph exported once per host from the same weights
  (:mod:`lakescore.udfs.models.onnx_export`; :func:`lakescore.udfs.models.forwards.load_forward` picks), optionally int8
  (:mod:`lakescore.udfs.models.quantize`). The session is created in the worker that scores (sessions neither pickle nor
  survive a fork), with the task's CPUs as its threads. A worker on this backend never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lakescore.udfs.models.devices import to_device, torch_dtype
from lakescore.udfs.models.model_source import ModelSpec, UnfitModelError

__all__ = [
    "ModelKind",
    "Forward",
    "Reduce",
    "TorchForward",
    "OnnxForward",
    "load_torch_model",
    "onnx_session",
    "WORKER_IMPORTS",
]

WORKER_IMPORTS: Mapping[str, tuple[str, ...]] = {
    "torch": ("torch", "transformers.modeling_utils", "transformers.models.auto.modeling_auto"),
    "onnx": (),
}
"""Backend -> the modules its forward imports in a worker (with the text tokenizers; torch's are the costly
ones): what a Python daemon imports once before forking workers
(:mod:`lakescore.jobs.platform.spark.local.python_daemon`). Not ``onnxruntime``: its import starts a native thread,
which a fork would not carry, and it is cheap anyway."""


@dataclass(frozen=True)
class ModelKind:
    """Which ``transformers`` auto class a head's forward runs, and which of its outputs the head reads."""

    auto_class: str
    """e.g. ``AutoModel``, ``AutoModelForSequenceClassification``."""
    output: str
    """e.g. ``last_hidden_state``, ``logits``: shaped (rows, tokens, ...) or (rows, ...)."""
    method: str | None = None
    """The model's method the forward calls instead of the model itself (torch only), e.g. ``get_image_features``
    of a CLIP model; it returns ``output`` (a model output holding it, or the tensor itself)."""
    unread: tuple[str, ...] = ()
    """Modules of the auto class whose weights ``output`` does not read (e.g. ``pooler`` under ``last_hidden_state``):
    a checkpoint may lack them. Any other weight the checkpoint lacks refuses the load (:func:`load_torch_model`)."""

    def needs(self, weight: str) -> bool:
        """Whether ``output`` reads ``weight`` (a parameter name such as ``pooler.dense.weight``)."""
        return not set(weight.split(".")) & set(self.unread)


Reduce = Callable[[Any, Mapping[str, Any]], Any]
"""``reduce(output, inputs)``: the model's float32 output and its inputs, both in the forward's own array library
(torch tensors on the model's device, or numpy) -> the reduced output, in that library."""


class Forward(Protocol):
    """A transformer forward: tokenized rows (numpy, shaped (n, L)) -> the model's one output, float32 numpy;
    with ``reduce``, ``reduce(output, inputs)`` instead, computed where the output is."""

    device: str
    input_names: tuple[str, ...]

    def __call__(self, features: Mapping[str, Any], reduce: Reduce | None = None) -> np.ndarray: ...


class TorchForward:
    """The forward on the torch model (or its ``method``): inputs to its device, floating-point inputs (an image's
    pixels) at the model's dtype, the output back as float32 numpy."""

    def __init__(self, model, output: str, input_names: Sequence[str], method: str | None = None) -> None:
        self._model = model.eval()
        self._call = getattr(self._model, method) if method else self._model
        self._output = output
        self.input_names = tuple(input_names)
        self.device = str(model.device)
        self._dtype = model.dtype

    def __call__(self, features: Mapping[str, Any], reduce: Reduce | None = None) -> np.ndarray:
        import torch

        with torch.inference_mode():
            inputs = {k: self._input(torch.as_tensor(features[k])) for k in self.input_names if k in features}
            result = self._call(**inputs)
            output = result if isinstance(result, torch.Tensor) else getattr(result, self._output, None)
            if output is None:
                raise ValueError(f"{type(self._model).__name__} returns no {self._output}")
            output = output.float()
            return (output if reduce is None else reduce(output, inputs)).cpu().numpy()

    def _input(self, value):
        value = to_device(value, self.device)
        return value.to(self._dtype) if value.is_floating_point() else value


class OnnxForward:
    """The forward on an ONNX Runtime session (CPU): the graph's inputs by name, its first output."""

    device = "cpu"

    def __init__(self, session) -> None:
        self._session = session
        self.input_names = tuple(i.name for i in session.get_inputs())

    def __call__(self, features: Mapping[str, Any], reduce: Reduce | None = None) -> np.ndarray:
        inputs = {k: np.ascontiguousarray(features[k], dtype=np.int64) for k in self.input_names}
        output = self._session.run(None, inputs)[0]
        return output if reduce is None else reduce(output, inputs)


def load_torch_model(spec: ModelSpec, model_dir: Path, kind: ModelKind):
    """``kind.auto_class`` from ``model_dir`` on ``spec.device`` at ``spec.dtype``, in eval mode: files from
    ``model_dir`` only, safetensors unless ``spec.allow_pickle``, remote code only with ``spec.trust_remote_code``.

    Raises :class:`~lakescore.udfs.models.model_source.UnfitModelError` naming the task, the class and the weights the
    checkpoint lacks that ``kind`` reads (:meth:`ModelKind.needs`): transformers would initialise them at random, and
    the task would publish what a random head says (a classifier's checkpoint loaded as a language model)."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker would flood executor logs
    auto_class = getattr(transformers, kind.auto_class)
    model, info = auto_class.from_pretrained(
        str(model_dir),
        use_safetensors=None if spec.allow_pickle else True,
        dtype=torch_dtype(spec.dtype),
        local_files_only=True,
        trust_remote_code=spec.trust_remote_code,
        output_loading_info=True,
    )
    missing = sorted(k for k in info.get("missing_keys") or () if kind.needs(k))
    if missing:
        raise UnfitModelError(
            f"task {spec.task}: {model_dir} loads as {type(model).__name__} without weights its output reads "
            f"({', '.join(missing[:4])}{f', and {len(missing) - 4} more' if len(missing) > 4 else ''}); transformers "
            f"would initialise them at random: use a checkpoint trained for {spec.task}"
        )
    return model.to(spec.device).eval()


def onnx_session(path: Path, threads: int):
    """An ONNX Runtime CPU session for ``path`` with ``threads`` intra-op threads.

    ``inter_op_num_threads=1`` and sequential execution: one task's forward at a time, on exactly
    the CPUs Spark gave the task (ORT's default pins a thread per physical core, and several
    workers would then fight for the same cores). The CPU arena and memory patterns are off:
    batch shapes change with every batch (rows x longest row), and the arena grows to the
    largest in power-of-two steps and never returns memory.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, int(threads))
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
