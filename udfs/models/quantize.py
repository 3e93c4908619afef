"""int8 for the ONNX backend: the quantization recipe, and the tolerance a run's output must stay within.

**Recipe** (:data:`RECIPE`): ONNX Runtime's dynamic quantization (int8 weights, uint8
activations scaled per batch at run time: no calibration data, so no dependence on which rows
a worker saw first), weights per output channel, applied only to the ``MatMul`` nodes whose
second input is a square weight matrix: in a BERT-like encoder, the attention projections
(query, key, value, output). Left in float32: the embeddings (``Gather``), the attention
score products, the softmax and the feed-forward ``MatMul`` nodes. Why: quantizing every ``MatMul`` and
``Gather`` (ORT's defaults), or every weight ``MatMul``, moves a small encoder's embeddings well outside the
default cosine tolerance; the attention projections alone keep them within it.

The feed-forward inputs carry outlier channels (after the LayerNorm and again after the GELU) that one
per-tensor activation scale cannot represent; excluding a layer instead of an op type helps no layer enough.
ORT's ``MatMulNBits`` (per-block activation scales) keeps the accuracy but is slower than float32 on CPU.

Classifiers are more sensitive: on a small sentiment classifier neither this recipe nor a narrower one
(query, key and value; query and key; the first layers' projections) keeps label agreement and probability
difference within the default :class:`Tolerance`, so such a run is refused by its preflight.

**Tolerance**: whatever the recipe, a run refuses to score when a sample of its own input,
scored both ways (float32 and this path) in the executors' preflight, falls outside
the configured :class:`Tolerance` (:func:`check_fidelity`). The figures are the head's own
(``fidelity`` of each text head): per-row cosine for embeddings, label agreement and
probability difference for classifiers, identical entities for token classifiers. The same
check guards the other reduced-precision path, ``model.dtype`` ``bfloat16`` / ``float16`` on torch
(:attr:`~lakescore.udfs.models.model_source.ModelSpec.reduced_precision`): lossy paths are opt-in, and each
run proves it stayed within tolerance on its own input.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakescore.udfs.models.errors import ModelSourceError

__all__ = [
    "RECIPE",
    "Tolerance",
    "QuantizationToleranceError",
    "quantize_int8",
    "quantized_nodes",
    "check_fidelity",
    "recipe",
]

RECIPE = "int8-dyn-pc-attnproj-v1"
"""Names the recipe in the export cache key: a changed recipe never reuses an old graph."""


def cpu_has_vnni() -> bool:
    """Whether this CPU has VNNI (AVX-512 VNNI, AVX-VNNI or AMX int8): u8 x s8 products that cannot saturate."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def recipe() -> str:
    """:data:`RECIPE` on this host: ``-rr`` (7-bit weights, ``reduce_range``) where the CPU lacks VNNI, as
    ONNX Runtime advises for AVX2 / AVX-512 without VNNI (u8 x s8 pair sums can saturate there)."""
    return RECIPE if cpu_has_vnni() else f"{RECIPE}-rr"


@dataclass(frozen=True)
class Tolerance:
    """How far a quantized run may be from float32 on its sample before it refuses to score."""

    min_cosine: float = 0.99
    """Embeddings: the 1st percentile of per-row cosine to float32."""
    min_agreement: float = 0.99
    """Classifiers: the fraction of rows with the same label; token classifiers: with the same entities."""
    max_prob_delta: float = 0.02
    """Classifiers: the 99th percentile over rows of the largest per-label probability difference."""


_LIMITS = {
    "cosine_p1": ("min_cosine", ">="),
    "agreement": ("min_agreement", ">="),
    "prob_delta_p99": ("max_prob_delta", "<="),
}
"""Figure a head reports -> the :class:`Tolerance` field that bounds it, and which way."""


class QuantizationToleranceError(ModelSourceError):
    """A reduced-precision model's outputs (int8, bfloat16, float16) on the run's sample are outside the configured
    tolerance against float32: nothing is scored."""


_FLOAT32_SETTING = {"int8": "model.quantize: none"}
"""The setting that turns each reduced-precision path off (a ``dtype`` path: ``model.dtype: float32``)."""


def check_fidelity(
    figures: Mapping[str, float], tolerance: Tolerance, rows: int, source: str, path: str = "int8"
) -> None:
    """Raise :class:`QuantizationToleranceError` naming every figure outside ``tolerance``.

    ``figures`` come from a head's ``fidelity(reference, outputs)``; names without a limit
    (e.g. ``cosine_min``) are reported, not checked. ``rows`` is the sample's size; ``path`` the
    reduced-precision path checked (``int8``, ``bfloat16``, ``float16``), named in the error.
    """
    failed = []
    for name, value in figures.items():
        if name not in _LIMITS:
            continue
        field, direction = _LIMITS[name]
        limit = getattr(tolerance, field)
        if not (value >= limit if direction == ">=" else value <= limit):
            failed.append(f"{name} {value:.4f} (model.quantize_{field} {limit:g})")
    if failed:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in figures.items())
        off = _FLOAT32_SETTING.get(path, "model.dtype: float32")
        raise QuantizationToleranceError(
            f"{path} model {source!r} is outside tolerance against float32 on {rows} sampled input rows: "
            f"{'; '.join(failed)} [{shown}]; refusing to score. Use {off}, or loosen the tolerance"
        )


def quantized_nodes(graph_path: Path) -> list[str]:
    """The recipe's ``MatMul`` nodes of the graph at ``graph_path``: those whose second input is a square weight."""
    import onnx

    graph = onnx.load(str(graph_path), load_external_data=False).graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    return [
        node.name
        for node in graph.node
        if node.op_type == "MatMul" and len(shapes.get(node.input[1], ())) == 2 and len(set(shapes[node.input[1]])) == 1
    ]


def quantize_int8(source: Path, target: Path) -> None:
    """Write the recipe's int8 graph of the float32 graph ``source`` to ``target`` (weights beside it).

    Raises ``ValueError`` when the graph has no node the recipe quantizes (nothing would change).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = quantized_nodes(source)
    if not nodes:
        raise ValueError(
            f"{source} has no MatMul with a square weight; the int8 recipe {RECIPE} has nothing to quantize"
        )
    model = _without_weight_shapes(source)
    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # ORT logs a "consider pre-processing" warning on every call
    try:
        quantize_dynamic(
            model,
            str(target),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=not cpu_has_vnni(),
            op_types_to_quantize=["MatMul"],
            nodes_to_quantize=nodes,
            use_external_data_format=True,
        )
    finally:
        quiet.setLevel(level)


def _without_weight_shapes(source: Path):
    """The graph at ``source`` (weights loaded) without the ``value_info`` entries that restate its weights' shapes.

    The dynamo exporter records one for every weight. ONNX Runtime's dynamic quantizer first rewrites each
    ``Gemm(transB=1)`` as a ``MatMul`` by transposing its weight in place, under the same name; the stale
    entry then contradicts shape inference and the quantizer fails ("Inferred shape and existing shape
    differ", onnxruntime#25890). A sequence classifier's pooler and head are such ``Gemm`` nodes, so every
    classifier failed. Weights carry their own shapes: nothing is lost.
    """
    import onnx

    model = onnx.load(str(source))
    weights = {init.name for init in model.graph.initializer}
    kept = [info for info in model.graph.value_info if info.name not in weights]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return model
