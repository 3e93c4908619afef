"""The ``model`` section of the config schema: where the model comes from and how its outputs are shaped.

Declared here, on the executors' side, because the worker's :class:`~lakescore.udfs.models.model_source.ModelSpec` takes
its fields from it (all but :data:`DRIVER_ONLY`); :mod:`lakescore.jobs.config` uses it as its ``model`` section.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from lakescore.udfs.models.cpu_paths import CpuFacts, CpuPath, choose_cpu_path
from lakescore.udfs.models.quantize import Tolerance
from lakescore.udfs.options.base import ConfigError, Fraction, Section, Text, checked, cli

__all__ = ["ModelOptions", "DRIVER_ONLY", "DEVICES", "DTYPES", "BACKENDS", "QUANTIZATIONS", "POOLING_MODES"]

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16", "auto")
BACKENDS = ("torch", "onnx", "auto")
"""What runs the transformer forward: torch, or ONNX Runtime on a graph exported from the same weights; ``auto``
(with ``dtype`` ``auto``): the path :func:`~lakescore.udfs.models.cpu_paths.choose_cpu_path` picks for the CPU."""
QUANTIZATIONS = ("none", "int8")
"""``int8``: dynamic int8 on the ONNX backend (:mod:`lakescore.udfs.models.quantize`), lossy and guarded by a
tolerance."""
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
"""sentence-transformers' pooling modes, every one of which the embed head computes
(:func:`lakescore.udfs.heads.embed.pool`)."""


class ModelOptions(Section):
    """Where the model comes from and how its outputs are shaped. Given as one string (``model: /models/minilm``),
    the section is its ``source``."""

    source: Text | None = Field(None, json_schema_extra=cli("--model", sweep=True))
    """A model directory (tabular: a ``.pt`` / ``.pt2`` file or a directory holding one), a Hadoop URI (``s3a://``,
    ``dbfs:/``, ``file:/``: copied once per host), an MLflow model (``models:/name/version``, ``models:/name@alias``,
    ``runs:/<run>/<path>``) or a Hugging Face hub id."""
    revision: Text | None = Field(None, json_schema_extra=cli("--revision", sweep=True))
    """Hub branch, tag or commit (recorded as ``model_revision``: for hub ids the resolved commit, for MLflow models
    the registry version); for other sources recorded as given."""
    device: Literal[DEVICES] = Field("cpu", json_schema_extra=cli("--device"))
    """Where workers run the model: ``cpu``, ``cuda``, or ``auto`` (CUDA where the worker sees a GPU; the GPU is the
    one Spark assigned the task)."""
    dtype: Literal[DTYPES] = Field("float32", json_schema_extra=cli("--dtype"))
    """Model precision; ``float16`` on CUDA only. ``auto`` (CPU, opt-in): the precision that is fastest on the
    driver's CPU by its flags, recorded with the reason in the report (``cpu_path``): ``bfloat16`` where the CPU has
    AMX (``amx_bf16``) or is an AMD CPU with AVX-512 BF16, else ``float32``; text tasks only take a lossy one, and
    it is checked against float32 like any ``bfloat16`` run. Executors are taken to have the driver's CPU."""
    expect_sha256: Annotated[
        Text | None,
        checked(
            lambda v: None if re.fullmatch(r"[0-9a-f]{64}", v.strip().lower()) else f"must be 64 hex digits, got {v!r}"
        ),
    ] = Field(None, json_schema_extra=cli("--expect-sha256", "HEX"))
    """Refuse to score (exit 2, nothing written) unless the weights digest equals this hex."""
    allow_pickle: bool = Field(False, json_schema_extra=cli("--allow-pickle"))
    """Allow pickle-based weights (``pytorch_model.bin``): loading them can run arbitrary code."""
    trust_remote_code: bool = Field(False, json_schema_extra=cli("--trust-remote-code"))
    """Run model code shipped with the model (transformers ``trust_remote_code``)."""
    cache_dir: Text = "~/.cache/lakescore/models"
    """Where each host keeps its copy of a remote (``s3a://``, ``dbfs:/``, MLflow) model and exported ONNX graphs."""
    max_seq_length: int | None = Field(None, ge=1)
    """Token limit per text; default: the model's own sentence-transformers setting."""
    pooling: Literal[POOLING_MODES] | None = None
    """Embeddings of models without a sentence-transformers config: the pooling (default ``mean``), one of
    sentence-transformers' modes, e.g. ``cls``, or ``lasttoken`` for a decoder embedder."""
    normalize: bool | None = None
    """L2-normalise embeddings; default: as the model's own config says (plain HF dirs: true)."""
    prompt_name: Annotated[
        Text | None,
        checked(lambda v: None if v.strip() else "must name one of the model's prompts, got an empty string"),
    ] = None
    """Embeddings: the model's prompt to prepend to every text, by its name in the model's sentence-transformers
    ``prompts`` (e.g. ``passage``); default: the model's ``default_prompt_name``, else none."""
    backend: Literal[BACKENDS] = Field("torch", json_schema_extra=cli("--backend"))
    """What runs the forward: ``torch``, or ``onnx`` (ONNX Runtime, CPU, float32; text tasks; exported once per host);
    ``auto`` (with ``dtype: auto``): the backend of the path ``dtype: auto`` picks (torch on every CPU measured)."""
    quantize: Literal[QUANTIZATIONS] = Field("none", json_schema_extra=cli("--quantize"))
    """``int8`` on the ``onnx`` backend: faster, lossy; the run refuses to score when a sample of its input is outside
    the ``quantize_*`` tolerance against float32 (which guards ``dtype`` ``bfloat16`` / ``float16`` runs the same
    way)."""
    quantize_min_cosine: Fraction = Tolerance.min_cosine
    """Reduced-precision embeddings: the 1st percentile of per-row cosine to float32 on the sample must reach this."""
    quantize_min_agreement: Fraction = Tolerance.min_agreement
    """Reduced-precision classifiers / token classifiers: the fraction of sampled rows with float32's label /
    entities."""
    quantize_max_prob_delta: Fraction = Tolerance.max_prob_delta
    """Reduced-precision classifiers: the 99th percentile over sampled rows of the largest probability difference."""

    def tolerance(self) -> Tolerance:
        """The reduced-precision tolerance these settings give (int8, bfloat16, float16 against float32)."""
        return Tolerance(self.quantize_min_cosine, self.quantize_min_agreement, self.quantize_max_prob_delta)

    def on_cpu(self, facts: CpuFacts, lossy_allowed: bool) -> tuple[ModelOptions, CpuPath | None]:
        """These settings with ``auto`` backend / dtype made concrete for a CPU with ``facts``
        (:func:`~lakescore.udfs.models.cpu_paths.choose_cpu_path`), and the path chosen (``None``: nothing was auto).
        ``lossy_allowed``: whether the task checks a reduced precision against float32 (text tasks)."""
        if "auto" not in (self.backend, self.dtype):
            return self, None
        path = choose_cpu_path(facts, self.backend, lossy_allowed)
        quantize = self.quantize if self.backend == "onnx" else path.quantize
        return self.model_copy(update={"backend": path.backend, "dtype": path.dtype, "quantize": quantize}), path

    @model_validator(mode="after")
    def _combinations(self) -> ModelOptions:
        if "auto" in (self.backend, self.dtype) and self.device != "cpu":
            raise ConfigError(
                "model.backend / model.dtype auto choose among CPU paths; use device cpu, or name the dtype on a GPU"
            )
        if self.backend == "auto" and (self.dtype != "auto" or self.quantize != "none"):
            raise ConfigError(
                "model.backend auto picks the precision too: set model.dtype auto and leave model.quantize none"
            )
        if self.dtype == "float16" and self.device == "cpu":
            raise ConfigError("model.dtype float16 needs a GPU (device cuda or auto); use bfloat16 on CPU")
        if self.backend == "onnx" and self.device == "cuda":
            raise ConfigError(
                "model.backend onnx runs on CPU (ONNX Runtime's CPU build); use device cpu, or backend torch on a GPU"
            )
        if self.backend == "onnx" and self.dtype not in ("float32", "auto"):
            raise ConfigError(
                f"model.backend onnx runs float32 (or model.quantize int8), got model.dtype {self.dtype!r}"
            )
        if self.quantize == "int8" and self.backend != "onnx":
            raise ConfigError("model.quantize int8 needs model.backend onnx")
        return self


DRIVER_ONLY = ("quantize_min_cosine", "quantize_min_agreement", "quantize_max_prob_delta")
"""Settings only the driver reads (the tolerance its preflight checks a lossy run against): not in the worker's spec."""
