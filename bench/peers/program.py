"""What every peer program of the side-by-side bench shares: its command line and the timings file it leaves."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable

__all__ = ["peer_arguments", "write_timings"]


def peer_arguments(prog: str, workloads: Iterable[str]) -> argparse.ArgumentParser:
    """The options every peer program takes: the workload, the input lakescore reads, the model, the Delta output,
    the timings file and the workloads' own knobs."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--workload", required=True, choices=sorted(workloads))
    parser.add_argument("--input", required=True, help="the Parquet directory lakescore reads")
    parser.add_argument("--model", required=True, help="the model directory (W6: the TorchScript file)")
    parser.add_argument("--output", required=True, help="Delta path to write")
    parser.add_argument("--timings", required=True, help="JSON file for the output's rows and the job's seconds")
    parser.add_argument("--batch", type=int, default=None, help="rows per batch (W4, W5; default the peer's)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--features", default="", help="W6: feature columns in the program's order")
    parser.add_argument("--top-k", type=int, default=10)
    return parser


def write_timings(path: str, output: str, seconds: float, engine: str, version: str) -> None:
    """Write to ``path`` the rows of the Delta table at ``output`` (read with deltalake, as the peers write it) and the
    job's ``seconds``."""
    from deltalake import DeltaTable

    rows = DeltaTable(output).to_pyarrow_dataset().count_rows()
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"rows": rows, "seconds": seconds, "engine": engine, "version": version}, handle)
