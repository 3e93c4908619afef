"""Is a peer's output the same work as lakescore's? Each workload's comparison of two Delta tables, read without Spark.

Run in lakescore's venv after the timed runs; never imports Ray or Daft (``make test`` has neither). Every function
returns counts and a verdict ``same`` (bool) with, when false, ``why`` (one phrase): a peer whose output differs is
reported as such, never timed as equal work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from bench.equivalence import delta_files, min_cosine

__all__ = ["COSINE_MIN", "read_delta", "compare_embeddings", "compare_labels", "compare_texts", "compare_top"]

COSINE_MIN = 0.9999
"""Lowest per-row cosine between two peers' vectors for the same review that still counts as the same embedding."""


def read_delta(table: Path, columns: Sequence[str]) -> pd.DataFrame:
    """``columns`` of the latest version of the Delta table at ``table`` (written by Spark, delta-rs or Ray)."""
    files = delta_files(table)
    if not files:
        return pd.DataFrame({name: [] for name in columns})
    return pq.read_table(files, columns=list(columns)).to_pandas()


def _coverage(ours: pd.DataFrame, theirs: pd.DataFrame, key: list[str]) -> dict:
    both = ours.merge(theirs, on=key, suffixes=("_lakescore", "_peer"))
    return {
        "both": both,
        "matched": len(both),
        "only_lakescore": len(ours) - len(both),
        "only_peer": len(theirs) - len(both),
    }


def _verdict(counts: dict, problems: list[str]) -> dict:
    """``counts`` without the merged frame, with ``same`` and the first reason it is not."""
    counts = {k: v for k, v in counts.items() if k != "both"}
    if counts["only_lakescore"] or counts["only_peer"]:
        problems.insert(
            0, f"{counts['only_lakescore']} rows only in lakescore's output, {counts['only_peer']} only in the peer's"
        )
    return {**counts, "same": not problems, "why": "; ".join(problems)}


def compare_embeddings(ours: Path, theirs: Path, id_col: str = "review_id", column: str = "embedding") -> dict:
    """Per-id cosine of the peer's vectors to lakescore's: the same work when every id is on both sides and the
    lowest cosine is at least :data:`COSINE_MIN`."""
    mine, other = read_delta(ours, [id_col, column]), read_delta(theirs, [id_col, column])
    vectors = lambda frame: np.stack(frame[column].map(np.asarray)) if len(frame) else np.zeros((0, 1))  # noqa: E731
    found = min_cosine(mine[id_col].to_numpy(), vectors(mine), other[id_col].to_numpy(), vectors(other))
    counts = {
        "matched": found["matched"],
        "only_lakescore": found["missing_in_b"],
        "only_peer": found["missing_in_a"],
        "min_cosine": found["min_cosine"],
    }
    low = found["min_cosine"] is None or found["min_cosine"] < COSINE_MIN
    return _verdict(counts, [f"lowest cosine {found['min_cosine']} < {COSINE_MIN}"] if low else [])


def compare_labels(ours: Path, theirs: Path, id_col: str = "id", column: str = "label") -> dict:
    """The peer's label per id against lakescore's: the same work when every id has the same label."""
    counts = _coverage(read_delta(ours, [id_col, column]), read_delta(theirs, [id_col, column]), [id_col])
    both = counts["both"]
    counts["equal"] = int((both[f"{column}_lakescore"] == both[f"{column}_peer"]).sum())
    differ = counts["matched"] - counts["equal"]
    return _verdict(
        counts, [f"{differ} of {counts['matched']} labels differ"] if differ or not counts["matched"] else []
    )


def compare_texts(ours: Path, theirs: Path, id_col: str = "id", column: str = "generated_text") -> dict:
    """The peer's generated text per id against lakescore's greedy text: the same work when every text is equal."""
    counts = _coverage(read_delta(ours, [id_col, column]), read_delta(theirs, [id_col, column]), [id_col])
    both = counts["both"]
    counts["equal"] = int((both[f"{column}_lakescore"] == both[f"{column}_peer"]).sum())
    differ = counts["matched"] - counts["equal"]
    return _verdict(
        counts, [f"{differ} of {counts['matched']} texts differ"] if differ or not counts["matched"] else []
    )


def compare_top(ours: Path, theirs: Path, key: Sequence[str] = ("user_id", "item_id", "rank")) -> dict:
    """The peer's kept (user, item, rank) rows against lakescore's: the same work when both keep exactly the same
    rows."""
    counts = _coverage(read_delta(ours, list(key)), read_delta(theirs, list(key)), list(key))
    return _verdict(counts, [] if counts["matched"] else ["no rows in common"])
