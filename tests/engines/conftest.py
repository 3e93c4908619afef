"""The engine tier (``make test-engines``): lakescore against a real vLLM (CPU build, ``make engine-vllm``). Every test
skips with the reason when ``build/engines/vllm`` is absent, as in CI. Each module starts its engine once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import spark, spark_dirs  # noqa: F401  (one real session per worker, as integration's)


@pytest.fixture(scope="session")
def vllm_llama_dir(tmp_path_factory) -> Path:
    """A seeded random 2-layer Llama, hidden 128 over 2 heads (head_dim 64: vLLM's CPU attention refuses the 16 of
    the integration tier's model), 512 positions, with a trained byte-level BPE tokenizer."""
    from tests.tiny_generators import save_causal, train_tokenizer

    return save_causal(
        tmp_path_factory.mktemp("vllm-llama"), train_tokenizer("bos"), hidden_size=128, heads=2, context=512
    )
