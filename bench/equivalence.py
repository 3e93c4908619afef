"""Output equivalence: lakescore's Delta vectors against the plain loop's, per ``review_id``.

The Delta table is read without Spark: its JSON commit log is replayed (``add``
minus ``remove``) to find the live Parquet files, which pyarrow reads. That is
exact for the tables lakescore writes in the bench (a fresh path, one commit,
no checkpoint, no deletion vectors, no column mapping, no partitions); any of
those features makes :func:`delta_files` raise instead of guessing.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow.parquet as pq

__all__ = ["delta_files", "min_cosine", "compare", "compare_npz"]


def delta_files(table: Path) -> list[Path]:
    """Parquet files of the latest version of the Delta table at ``table``."""
    log = table / "_delta_log"
    commits = sorted(log.glob("*.json"))  # zero-padded version numbers: name order is version order
    if not commits or commits[0].name != f"{0:020d}.json" or (log / "_last_checkpoint").exists():
        raise ValueError(f"{table}: needs a checkpoint to read; use Spark")
    live: dict[str, None] = {}
    for commit in commits:
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            meta = action.get("metaData")
            if meta and (
                meta.get("partitionColumns")
                or (meta.get("configuration") or {}).get("delta.columnMapping.mode", "none") != "none"
            ):
                raise ValueError(f"{table}: partitioned or column-mapped table; use Spark")
            if "add" in action:
                if action["add"].get("deletionVector"):
                    raise ValueError(f"{table}: has deletion vectors; use Spark")
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return [table / unquote(path) for path in live]


def min_cosine(ids_a: np.ndarray, vecs_a: np.ndarray, ids_b: np.ndarray, vecs_b: np.ndarray) -> dict:
    """Compare two id-keyed sets of vectors; return counts and the minimum cosine over shared ids."""
    index_b = {int(i): n for n, i in enumerate(ids_b)}
    shared = [(n, index_b[int(i)]) for n, i in enumerate(ids_a) if int(i) in index_b]
    result = {
        "rows_a": len(ids_a),
        "rows_b": len(ids_b),
        "matched": len(shared),
        "missing_in_a": len(ids_b) - len(shared),
        "missing_in_b": len(ids_a) - len(shared),
        "min_cosine": None,
        "p1_cosine": None,
    }
    if shared:
        rows_a, rows_b = (np.fromiter(side, dtype=np.int64) for side in zip(*shared))
        a, b = vecs_a[rows_a].astype(np.float64), vecs_b[rows_b].astype(np.float64)
        cosine = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        result["min_cosine"] = float(cosine.min())
        result["p1_cosine"] = float(np.percentile(cosine, 1))
    return result


def compare(delta_table: Path, reference_npz: Path, id_col: str = "review_id") -> dict:
    """:func:`min_cosine` of the plain loop's ``.npz`` (a) against lakescore's Delta output (b)."""
    files = delta_files(delta_table)
    table = pq.read_table(files, columns=[id_col, "embedding"]) if files else None
    ids = table.column(id_col).to_numpy() if table is not None else np.zeros(0, dtype=np.int64)
    vectors = (
        np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        if table is not None and table.num_rows
        else np.zeros((0, 0), dtype=np.float32)
    )
    reference = np.load(reference_npz)
    return min_cosine(reference["ids"], reference["embeddings"], ids, vectors)


def compare_npz(vectors_npz: Path, reference_npz: Path) -> dict:
    """:func:`min_cosine` of the plain loop's ``.npz`` (a) against another loop's ``.npz`` (b)."""
    ours, reference = np.load(vectors_npz), np.load(reference_npz)
    return min_cosine(reference["ids"], reference["embeddings"], ours["ids"], ours["embeddings"])
