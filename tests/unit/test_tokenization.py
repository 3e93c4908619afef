"""The text heads' batch tokenization and pooling: the same numbers as transformers' call and numpy, faster.

:class:`~lakescore.udfs.tokenization.BatchEncoder` builds the padded arrays from the Rust backend itself;
each case compares it, array by array, with ``tokenizer(texts, padding=True, truncation="longest_first",
max_length=..., return_tensors="np")`` on tokenizers of every kind the heads meet (WordPiece with
lower-casing, byte-level BPE, Unigram, left padding), rows longer than the limit included. Pooling runs in
numpy (ONNX Runtime) or torch (on the model's device); both must give the same vectors.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from lakescore.udfs.heads.embed import POOLING_MODES, pool
from lakescore.udfs.tokenization import BatchEncoder
from tests.unit.test_architectures import FAMILIES, _tokenizer
from tests.unit.test_heads import UNSEEN

TEXTS = UNSEEN + ["", "ok", "Ünïcödé — naïve café, 東京 ✓", " ".join(["overlong"] * 300), "  spaced   out  "]


def _reference(tokenizer, texts, max_length):
    return dict(tokenizer(texts, padding=True, truncation="longest_first", max_length=max_length, return_tensors="np"))


def _assert_same(ours, expected):
    assert ours.keys() == expected.keys()
    for name, array in expected.items():
        assert ours[name].dtype == np.int64, name
        np.testing.assert_array_equal(ours[name], array, err_msg=name)


@pytest.mark.parametrize("max_length", [8, 128])
def test_minilm_wordpiece_matches_transformers(minilm_dir, max_length):
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    _assert_same(BatchEncoder(tokenizer, max_length)(TEXTS), _reference(tokenizer, TEXTS, max_length))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("truncation_side", ["right", "left"])
def test_bpe_and_unigram_tokenizers_either_side_match_transformers(family, truncation_side):
    tokenizer = _tokenizer(FAMILIES[family])
    tokenizer.truncation_side = truncation_side
    encoder = BatchEncoder(tokenizer, 16)
    assert encoder.padding_side == FAMILIES[family].padding_side
    _assert_same(encoder(TEXTS), _reference(tokenizer, TEXTS, 16))


def test_the_tokenizer_is_left_as_it_was(minilm_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    before = tokenizer.backend_tokenizer.to_str()
    BatchEncoder(tokenizer, 8)(TEXTS)
    assert tokenizer.backend_tokenizer.to_str() == before


def test_a_tokenizer_without_a_pad_token_fails_as_transformers_does():
    tokenizer = _tokenizer(FAMILIES["roberta"])
    tokenizer.pad_token = None
    with pytest.raises(ValueError, match="padding token"):
        BatchEncoder(tokenizer, 16)(TEXTS)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pooling_in_torch_equals_pooling_in_numpy(padding_side):
    rng = np.random.default_rng(7)
    lengths = np.array([5, 1, 3, 0, 5])
    positions = np.arange(5)[None, :]
    mask = (positions < lengths[:, None]) if padding_side == "right" else (positions >= 5 - lengths[:, None])
    tokens = rng.normal(size=(5, 5, 6)).astype(np.float32)
    modes = tuple(POOLING_MODES)
    expected = pool(tokens, mask.astype(np.int64), modes)
    pooled = pool(torch.from_numpy(tokens), torch.from_numpy(mask.astype(np.int64)), modes)
    assert isinstance(pooled, torch.Tensor) and pooled.dtype == torch.float32
    np.testing.assert_allclose(pooled.numpy(), expected, rtol=1e-6, atol=1e-6)


_COUNT_TOKENIZER_THREADS = """
import os, sys
from tokenizers import Tokenizer  # the pool is the Rust library's; transformers' import would only add seconds
from lakescore.udfs.models.devices import bound_tokenizer_threads
if sys.argv[2] != "host":
    bound_tokenizer_threads(int(sys.argv[2]))
tokenizer = Tokenizer.from_file(os.path.join(sys.argv[1], "tokenizer.json"))
before = len(os.listdir("/proc/self/task"))
tokenizer.encode_batch(["the battery lasts two days and the screen is bright"] * 4000)
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not os.path.isdir("/proc/self/task"), reason="needs 2 CPUs and /proc"
)
def test_the_tokenizer_pool_is_bounded_by_the_task_cpus(minilm_dir):
    """A worker bounds the Rust tokenizer's pool to its task's CPUs before it first tokenizes; unbounded, the pool
    is as wide as the host (each run in a fresh process: the pool is created once per process)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}

    def threads_started(cpus: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _COUNT_TOKENIZER_THREADS, str(minilm_dir), cpus],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.strip().splitlines()[-1])

    assert threads_started("1") <= 1 < threads_started("host")
