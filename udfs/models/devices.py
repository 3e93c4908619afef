"""Device and precision for a worker: which torch device a task scores on, at which dtype.

``auto`` means CUDA when this process sees a GPU, else CPU. On CUDA the device
index comes from the GPU Spark assigned to the running task
(``TaskContext.get().resources()["gpu"].addresses``), so two tasks on one
executor never share a GPU by accident; outside a task (the driver) it is the
current CUDA device.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = [
    "resolve_device",
    "torch_dtype",
    "effective_dtype",
    "task_gpu_address",
    "task_cpus",
    "bound_tokenizer_threads",
    "to_device",
]

log = logging.getLogger(__name__)
# torch is imported where a function needs it: a worker on the ONNX backend never pays its import
# (seconds of CPU and hundreds of MiB of resident libraries per process).


def task_gpu_address(context=None) -> str | None:
    """The first GPU address Spark gave the running task, or ``None`` (no task, or no GPU resource)."""
    if context is None:
        try:
            from pyspark import TaskContext

            context = TaskContext.get()
        except ImportError:
            return None
    if context is None:
        return None
    gpu = context.resources().get("gpu")
    return gpu.addresses[0] if gpu is not None and gpu.addresses else None


def resolve_device(device: str, *, cuda_available: bool | None = None, gpu_address: str | None = None) -> str:
    """A concrete torch device string for the configured ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``).

    ``cuda_available`` and ``gpu_address`` default to this process's view
    (``torch.cuda.is_available()`` and :func:`task_gpu_address`).
    Raises ``RuntimeError`` when ``cuda`` is asked for and this process sees no GPU.
    """
    if device == "cpu" or device.startswith("cuda:"):
        return device
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        if device == "cuda":
            raise RuntimeError("model.device is 'cuda' but this process sees no CUDA device")
        return "cpu"
    if gpu_address is None:
        gpu_address = task_gpu_address()
    return f"cuda:{gpu_address}" if gpu_address is not None else "cuda"


def effective_dtype(dtype: str, device: str) -> str:
    """The dtype actually used on ``device``: float16 has no fast CPU kernels, so CPU runs it as float32."""
    if dtype == "float16" and device == "cpu":
        log.warning("model.dtype float16 on CPU runs as float32 (use bfloat16 for reduced precision on CPU)")
        return "float32"
    return dtype


def torch_dtype(dtype: str):
    """``float32`` / ``bfloat16`` / ``float16`` as a torch dtype; ``KeyError`` for anything else."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def task_cpus(context=None) -> int:
    """The CPUs Spark gave the running task (``spark.task.cpus`` or its resource profile); outside a task,
    the CPUs this process may run on."""
    if context is None and "pyspark" in sys.modules:
        from pyspark import TaskContext

        context = TaskContext.get()
    cpus = context.cpus() if context is not None else None
    return int(cpus) if cpus else len(os.sched_getaffinity(0))


def bound_tokenizer_threads(cpus: int) -> None:
    """Size the Rust tokenizers' thread pool of this process to ``cpus`` (``RAYON_NUM_THREADS``), unless it is set
    already. Effective only before the process first tokenizes a batch: the pool is created then, as wide as the
    host, so several single-CPU tasks on one executor would each run a host-wide pool."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(int(cpus)))


def to_device(value, device):
    """``value`` on ``device``; CPU tensors headed for CUDA go through pinned memory with a non-blocking copy,
    so the host-to-GPU transfer overlaps the work already queued on the GPU."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    target = torch.device(device)
    if target.type == "cuda" and value.device.type == "cpu":
        return value.pin_memory().to(target, non_blocking=True)
    return value.to(target)
