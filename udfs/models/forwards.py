"""The forward a text head runs: ``spec.backend``'s (:mod:`lakescore.udfs.models.backends`), for ONNX the graph
:mod:`lakescore.udfs.models.onnx_export` exports on first use. A module above both, as the exporter builds on the
backends."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lakescore.udfs.models.backends import Forward, ModelKind, OnnxForward, TorchForward, load_torch_model, onnx_session
from lakescore.udfs.models.devices import task_cpus
from lakescore.udfs.models.model_source import ModelSpec

__all__ = ["load_forward"]


def load_forward(spec: ModelSpec, model_dir: Path, kind: ModelKind, input_names: Sequence[str]) -> Forward:
    """The forward ``spec.backend`` runs for the model in ``model_dir``, reading ``kind.output``.

    ``input_names`` are what the tokenizer produces (``input_ids``, ``attention_mask``, ...).
    ONNX: the graph for these weights, task and quantization, exported on this host on first use.
    Loader and export errors propagate.
    """
    if spec.backend == "onnx":
        from lakescore.udfs.models.onnx_export import exported_model

        return OnnxForward(onnx_session(exported_model(spec, model_dir, kind, input_names), task_cpus()))
    return TorchForward(load_torch_model(spec, model_dir, kind), kind.output, input_names, kind.method)
