"""The ``tabular`` head: numeric feature columns -> a prediction and the model's scores.

The model is a TorchScript program (``torch.jit.save``, ``.pt``) or a
``torch.export`` program (``torch.export.save``, ``.pt2``; export it with a
dynamic batch dimension). Neither format unpickles arbitrary Python objects,
so both load by default. The program takes one ``(rows, features)`` tensor,
columns in ``feature_cols`` order, and returns ``(rows,)`` / ``(rows, 1)``
(regression: ``prediction`` is the value) or ``(rows, k)`` (classification:
``prediction`` is the argmax class index). ``scores`` holds the program's raw
outputs for the row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from lakescore.udfs.arrow_columns import list_column, scalar_column
from lakescore.udfs.models.devices import to_device, torch_dtype
from lakescore.udfs.models.model_source import ModelSourceError, ModelSpec

__all__ = ["TabularModel", "load_tabular", "PROGRAM_SUFFIXES"]

PROGRAM_SUFFIXES = (".pt", ".pt2")


class TabularModel:
    """The tabular head: ``(n, features)`` float matrix -> float64 ``(n, outputs)``.

    Outputs per row: the prediction (double) and the program's raw outputs (``array<double>``).
    """

    def __init__(self, program, feature_cols: tuple[str, ...], device: str, dtype: torch.dtype) -> None:
        self._program = program
        self.feature_cols = feature_cols
        self._device = device
        self._dtype = dtype

    @torch.inference_mode()
    def forward(self, matrix: np.ndarray) -> np.ndarray:
        inputs = to_device(torch.as_tensor(np.asarray(matrix), dtype=self._dtype), self._device)
        out = self._program(inputs)
        if isinstance(out, (tuple, list)):
            out = out[0]
        out = out.float().cpu().numpy().astype(np.float64)
        return out.reshape(len(matrix), -1)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """The task's output columns for scored ``outputs``, in output-schema order (rows not ``ok`` are null)."""
        ok = np.asarray(ok, dtype=bool)
        prediction = outputs[:, 0] if outputs.shape[1] == 1 else outputs.argmax(axis=1).astype(np.float64)
        return (scalar_column(prediction, ok, pa.float64()), list_column(outputs, ok, pa.float64()))

    def score(self, matrix: np.ndarray) -> np.ndarray:
        return self.forward(matrix)


def program_file(model_path: Path) -> Path:
    """The program file: ``model_path`` itself, or the one ``.pt`` / ``.pt2`` file in that directory.

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` when there is none or more than one.
    """
    if model_path.is_file():
        return model_path
    found = sorted(p for p in model_path.iterdir() if p.suffix in PROGRAM_SUFFIXES)
    if len(found) != 1:
        raise ModelSourceError(
            f"tabular model directory {model_path} must hold exactly one .pt (TorchScript) or .pt2 (torch.export) "
            f"file, found {[p.name for p in found] or 'none'}"
        )
    return found[0]


def load_tabular(spec: ModelSpec, model_path: Path) -> TabularModel:
    """Load the TorchScript or torch.export program at ``model_path`` for ``spec.feature_cols``.

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` for a file that is neither.
    """
    path = program_file(model_path)
    dtype = torch_dtype(spec.dtype)
    try:
        if path.suffix == ".pt2":
            program = torch.export.load(str(path)).module()
            program.to(spec.device)
        else:
            program = torch.jit.load(str(path), map_location=spec.device).eval()
            program.to(dtype)
    except Exception as exc:
        raise ModelSourceError(
            f"cannot load {path} as a {'torch.export' if path.suffix == '.pt2' else 'TorchScript'} program: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    if path.suffix == ".pt2" and dtype != torch.float32:
        program = program.to(dtype)
    return TabularModel(program, spec.feature_cols, spec.device, dtype)
