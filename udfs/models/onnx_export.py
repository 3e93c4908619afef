"""The ONNX graph of a text model: exported offline from the local weights, once per host.

One graph per (weights sha256, task, forward class, opset, quantization), kept under
``<model.cache_dir>/onnx/<key>/model.onnx`` (:func:`exported_model`) (weights as external data beside it, which ONNX
Runtime memory-maps). The first worker of a host exports under a file lock
(:func:`~lakescore.udfs.models.model_source.stage_once`); the others wait and reuse it, as does every
later run with the same weights. Nothing here reaches the network.

Export is ``torch.onnx.export(dynamo=True)`` (torch's default exporter since 2.9): the legacy
TorchScript tracer gave wrong outputs for transformers 5 BERT models at other shapes than the
traced one (max abs difference 2.4 on MiniLM's hidden states), while the dynamo graph with
dynamic batch and sequence axes matches torch within 4e-6. optimum's exporter pins
transformers < 5, hence torch's own.

Every stage is checked as it is made, before it is cached (:func:`check_graph`): the export against
the torch model it came from, the fused graph against the export, both on seeded probe inputs of other
shapes than the traced one, padding included. An export that ONNX Runtime cannot run, or outside
:data:`GRAPH_ATOL` / :data:`GRAPH_RTOL`, is not cached and the run fails with :class:`GraphMismatchError`; a
fused graph that fails its check is replaced by the export (fusion only speeds a graph up; onnxscript's
rewriter broke GPT-2's). So the float32 graph stands for float32 torch wherever it is used, the int8
tolerance check's reference included.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from lakescore.udfs.models.backends import ModelKind, OnnxForward, load_torch_model, onnx_session
from lakescore.udfs.models.model_fit import read_json
from lakescore.udfs.models.model_source import ModelSpec, stage_once, weights_sha256

__all__ = [
    "OPSET",
    "GRAPH_FILE",
    "GRAPH_ATOL",
    "GRAPH_RTOL",
    "GraphMismatchError",
    "export_key",
    "exported_model",
    "export_onnx",
    "fuse_for_ort",
    "probe_inputs",
    "check_graph",
]

OPSET = 18
"""The dynamo exporter's lowest supported opset."""
GRAPH_FILE = "model.onnx"
GRAPH_ATOL = 1e-4
GRAPH_RTOL = 1e-4
"""How far a graph's output may be from its source's on the probe inputs: ``|graph - source| <= atol + rtol *
|source|`` elementwise: loose enough for float32 rounding in the export and its fusion, tight enough to catch a
wrong graph."""


class GraphMismatchError(RuntimeError):
    """An exported or fused graph that ONNX Runtime cannot run, or that disagrees with its source beyond
    :data:`GRAPH_ATOL` / :data:`GRAPH_RTOL`."""


def export_key(sha256: str, spec: ModelSpec, kind: ModelKind, stage: str) -> str:
    """The cache directory name of one ``stage`` (``export``, ``fp32``, or the int8 recipe) of ``spec``'s graph."""
    return f"{sha256[:24]}-{spec.task}-{kind.auto_class}-opset{OPSET}-{stage}"


def exported_model(spec: ModelSpec, model_dir: Path, kind: ModelKind, input_names: Sequence[str]) -> Path:
    """The graph file ``spec`` runs on this host, exported (and fused, or quantized) first if no process has yet.

    Three cached stages, each made once per host under its own lock: the plain export; the
    float32 graph (the export with ONNX Runtime's fusions, :func:`fuse_for_ort`, or the export itself where
    the fused graph fails its check: ONNX Runtime refuses it or it computes something else); the int8 graph
    (the plain export through :func:`~lakescore.udfs.models.quantize.quantize_int8`: the recipe selects
    plain ``MatMul`` nodes, which fusion would hide inside ``Attention``). Raises whatever
    export, fusion or quantization raises; a failed stage leaves nothing behind.
    """
    from lakescore.udfs.models.quantize import quantize_int8, recipe

    root = Path(spec.cache_dir).expanduser() / "onnx"
    sha256 = weights_sha256(model_dir)

    def export(target: Path) -> None:
        export_onnx(model_dir, spec, kind, input_names, target / GRAPH_FILE)

    def fuse(target: Path) -> None:
        fuse_for_ort(plain, target / GRAPH_FILE)
        probes = probe_inputs(model_dir, input_names)
        try:
            check_graph(
                target / GRAPH_FILE, _graph_outputs(plain, probes), probes, "the fused graph against the export"
            )
        except GraphMismatchError as exc:  # the export passed against torch: it runs, unfused
            logging.getLogger(__name__).warning("ONNX fusion undone for %s: %s", model_dir, exc)
            _save_graph(plain, target / GRAPH_FILE)

    plain = stage_once(export_key(sha256, spec, kind, "export"), root, export) / GRAPH_FILE
    if spec.quantize == "int8":
        stage, derive = recipe(), lambda target: quantize_int8(plain, target / GRAPH_FILE)
    else:
        stage, derive = "fp32", fuse
    return stage_once(export_key(sha256, spec, kind, stage), root, derive) / GRAPH_FILE


def fuse_for_ort(source: Path, target: Path) -> None:
    """``source`` with ONNX Runtime's fused kernels (``Attention``, ``SkipLayerNormalization``, ``BiasGelu``)
    written to ``target``: onnxscript's rewriter for dynamo-exported graphs, which makes the forward faster
    than unfused with the same outputs (tested). A graph the rewriter cannot handle is used unfused (logged)."""
    import onnx_ir as ir
    from onnxscript.rewriter import ort_fusions

    try:
        model, _ = ort_fusions.optimize_for_ort(ir.load(str(source)))
    except Exception as exc:  # the rewriter knows common encoder layouts; others still run, unfused
        logging.getLogger(__name__).warning("ONNX fusion skipped for %s: %s: %s", source, type(exc).__name__, exc)
        _save_graph(source, target)
        return
    ir.save(model, str(target), external_data=f"{target.name}.data")


def _save_graph(source: Path, target: Path) -> None:
    """A copy of the graph ``source`` at ``target``, its weights in ``<target>.data``."""
    import onnx_ir as ir

    ir.save(ir.load(str(source)), str(target), external_data=f"{target.name}.data")


def export_onnx(model_dir: Path, spec: ModelSpec, kind: ModelKind, input_names: Sequence[str], target: Path) -> None:
    """Export ``kind`` of the model in ``model_dir`` (float32, CPU) to ``target``.

    Inputs are ``input_names`` (int64, shaped (batch, sequence), both axes dynamic); the one
    output is the model's ``kind.output``. Weights go to ``<target>.data`` beside the graph.
    """
    import torch

    model = load_torch_model(dataclasses.replace(spec, device="cpu", dtype="float32"), model_dir, kind)
    names = list(input_names)
    wrapper = _one_output_module(model, kind.output, names).eval()
    example = tuple(torch.ones((2, 8), dtype=torch.long) for _ in names)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    with warnings.catch_warnings(), _quiet_exporter_logs():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            wrapper,
            example,
            dynamo=True,
            opset_version=OPSET,
            input_names=names,
            output_names=[kind.output],
            dynamic_shapes=(tuple({0: batch, 1: sequence} for _ in names),),
            verbose=False,
        )
    program.save(str(target), external_data=True)
    probes = probe_inputs(model_dir, names)
    with torch.inference_mode():
        expected = [wrapper(*(torch.as_tensor(p[n]) for n in names)).float().numpy() for p in probes]
    check_graph(target, expected, probes, "the export against torch")


def probe_inputs(model_dir: Path, input_names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """Seeded inputs for :func:`check_graph`: 3 rows x 13 tokens (one row padded after 9) and 1 row x 40, other
    shapes than the export's (2 x 8). Token ids are below ``config.json``'s ``vocab_size`` (100 when it has none);
    ``attention_mask`` marks the padding; every other input (``token_type_ids``) is zeros."""
    vocab = int((read_json(model_dir / "config.json") or {}).get("vocab_size") or 100)
    rng = np.random.default_rng(0)
    probes = []
    for rows, tokens, valid in ((3, 13, 9), (1, 40, 40)):
        mask = np.ones((rows, tokens), dtype=np.int64)
        mask[0, valid:] = 0
        ids = rng.integers(0, vocab, size=(rows, tokens), dtype=np.int64) * mask
        probes.append(
            {n: ids if n == "input_ids" else mask if n == "attention_mask" else np.zeros_like(ids) for n in input_names}
        )
    return probes


def check_graph(
    graph: Path, expected: Sequence[np.ndarray], probes: Sequence[Mapping[str, np.ndarray]], what: str
) -> None:
    """Raise :class:`GraphMismatchError` naming ``what`` when ONNX Runtime cannot run ``graph`` on ``probes``, or
    its output is not within :data:`GRAPH_ATOL` / :data:`GRAPH_RTOL` of ``expected`` (one array per probe)."""
    try:
        outputs = _graph_outputs(graph, probes)
    except Exception as exc:  # noqa: BLE001 (ORT's errors share no base class but Exception)
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise GraphMismatchError(
            f"ONNX graph check failed, {what}: ONNX Runtime cannot run it ({type(exc).__name__}: {reason}); "
            "model.backend torch runs this model"
        ) from exc
    for probe, reference, actual in zip(probes, expected, outputs):
        if actual.shape != reference.shape or not np.allclose(actual, reference, rtol=GRAPH_RTOL, atol=GRAPH_ATOL):
            worst = float(np.abs(actual - reference).max()) if actual.shape == reference.shape else float("inf")
            shape = next(iter(probe.values())).shape
            raise GraphMismatchError(
                f"ONNX graph check failed, {what}: max abs difference {worst:.3g} on a {shape[0]}x{shape[1]} probe "
                f"(tolerance {GRAPH_ATOL} + {GRAPH_RTOL} x |expected|); model.backend torch runs this model"
            )


def _graph_outputs(graph: Path, probes: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """The first output of ``graph`` (one thread, ONNX Runtime CPU) on each probe."""
    forward = OnnxForward(onnx_session(graph, 1))
    return [np.asarray(forward(probe), dtype=np.float32) for probe in probes]


def _one_output_module(model, output: str, names: list[str]):
    """``model`` called with named inputs, returning the one output a head reads (positional inputs for the
    exporter)."""
    import torch

    class OneOutput(torch.nn.Module):
        def __init__(self, model, output: str, names: list[str]) -> None:
            super().__init__()
            self.model, self.output, self.names = model, output, names

        def forward(self, *inputs):
            return getattr(self.model(**dict(zip(self.names, inputs))), self.output)

    return OneOutput(model, output, names)


class _quiet_exporter_logs:
    """The dynamo exporter logs a warning per missing optional library (torchvision ops); not the user's concern."""

    _loggers = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")

    def __enter__(self):
        self._levels = {name: logging.getLogger(name).level for name in self._loggers}
        for name in self._loggers:
            logging.getLogger(name).setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
