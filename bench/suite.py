"""What gets measured: the peers, the workloads, and the round-robin schedule of runs.

Each run is one whole process started by :func:`bench.proctree.run_measured`;
rows/s is the input's row count over that process's wall time, so start-up
(JVM, imports, model loads), scoring and writing all count, for every peer.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.model import model_dir

__all__ = ["Peer", "Job", "PEERS", "peer_command", "schedule"]


@dataclass(frozen=True)
class Peer:
    """One way of embedding a Parquet table, run as its own process."""

    key: str
    label: str


PEERS = (
    Peer("a", "plain loop (pandas + ST encode, length-sorted, 1 process)"),
    Peer("b", "naive Spark pandas UDF (64-row chunks, table order)"),
    Peer("c", "Spark predict_batch_udf (batch_size=64)"),
    Peer("d", "lakescore score (end to end, Delta + validation)"),
    Peer("t", "lakescore.transform (mapInArrow, no write)"),
    Peer("p", "lakescore.pandas_udf in a select (no write)"),
    Peer("e", "plain loop on ONNX Runtime int8 (pandas + ORT, length-sorted, 1 process): (a) on q's graph"),
    Peer("o", "lakescore score --backend onnx (float32)"),
    Peer("q", "lakescore score --backend onnx --quantize int8"),
    Peer("f", "plain loop on torch bfloat16 (pandas + ST encode, length-sorted, 1 process): (a) at k's precision"),
    Peer("k", "lakescore score --dtype bfloat16"),
    Peer("u", "lakescore score --backend auto --dtype auto (the CPU path its flags pick)"),
)
LAKESCORE_RUNS = {
    "d": (),
    "o": ("--backend", "onnx"),
    "q": ("--backend", "onnx", "--quantize", "int8"),
    "k": ("--dtype", "bfloat16"),
    "u": ("--backend", "auto", "--dtype", "auto"),
}
"""The ``lakescore score`` peers: the default (torch float32), the ONNX backends, torch bfloat16 and the automatic
CPU path (:mod:`lakescore.udfs.models.cpu_paths`)."""


def model_cache_dir(run_dir: Path) -> Path:
    """``model.cache_dir`` of every run of one bench (``<out>/model-cache``): each ONNX graph is exported once."""
    return run_dir.parent.parent / "model-cache"


@dataclass(frozen=True)
class Job:
    """One peer on one workload: which file, how many rows, how many repeats."""

    workload: str
    peer: Peer
    input: Path
    rows: int
    repeats: int
    note: str = ""


def peer_command(peer: Peer, input_path: Path, run_dir: Path) -> list[str]:
    """The command line that runs ``peer`` on ``input_path``; its files go under ``run_dir``."""
    python = sys.executable
    if peer.key in "af":
        return [
            python,
            "-m",
            "bench.peers.plain_loop",
            "--input",
            str(input_path),
            "--output",
            str(run_dir / "embeddings.npz"),
            "--dtype",
            "float32" if peer.key == "a" else "bfloat16",
            "--report",
            str(run_dir / "report.json"),
        ]
    if peer.key == "b":
        return [python, "-m", "bench.spark_helper", "--peer", "naive_udf", "--input", str(input_path)]
    if peer.key == "c":
        return [python, "-m", "bench.spark_helper", "--peer", "predict_batch", "--input", str(input_path)]
    if peer.key == "t":
        return [python, "-m", "bench.spark_helper", "--peer", "lakescore_transform", "--input", str(input_path)]
    if peer.key == "p":
        return [python, "-m", "bench.spark_helper", "--peer", "lakescore_pandas_udf", "--input", str(input_path)]
    if peer.key == "e":
        return [
            python,
            "-m",
            "bench.peers.ort_loop",
            "--input",
            str(input_path),
            "--quantize",
            "int8",
            "--output",
            str(run_dir / "embeddings.npz"),
            "--cache-dir",
            str(model_cache_dir(run_dir)),
        ]
    if peer.key in LAKESCORE_RUNS:
        # A fresh Delta path, warehouse and Derby metastore per run: embedded Derby is single-process.
        return [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            "--input",
            str(input_path),
            "--output",
            str(run_dir / "delta"),
            "--task",
            "embed",
            "--model",
            str(model_dir()),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
            "--report",
            str(run_dir / "report.json"),
            "--set",
            f"spark.warehouse_dir={run_dir / 'warehouse'}",
            "--set",
            f"spark.metastore_dir={run_dir / 'metastore_db'}",
            "--set",
            f"model.cache_dir={model_cache_dir(run_dir)}",
            *LAKESCORE_RUNS[peer.key],
        ]
    raise ValueError(f"unknown peer {peer.key!r}")


def schedule(jobs: Sequence[Job]) -> Iterator[tuple[Job, int]]:
    """``(job, repeat)`` in rounds: a, b, c, d, a, b, c, d, ... so drift and noise hit every peer alike.

    A job with fewer repeats simply drops out of the later rounds.
    """
    for repeat in range(max((job.repeats for job in jobs), default=0)):
        for job in jobs:
            if repeat < job.repeats:
                yield job, repeat
