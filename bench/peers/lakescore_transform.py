"""Peer (t): ``lakescore.transform`` — the job's ``mapInArrow`` scoring path as a lazy DataFrame, no Delta, no GX.

The same scoring loop as (d)'s scoring stage, in the same harness as (b), (c) and (p), so
(p)/(t) isolates what a pandas UDF in a ``select`` costs against ``mapInArrow``.
"""

from __future__ import annotations

from bench.model import model_dir


def score_frame(frame):
    """``review_id`` and ``embedding`` of every row of ``frame`` (``transform`` spreads a small input over every
    core)."""
    import lakescore

    scored = lakescore.transform(frame, task="embed", model=model_dir(), text_col="body", id_col="review_id")
    return scored.select("review_id", "embedding")
