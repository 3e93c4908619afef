"""W8's data and its hand-written peer's chunking (bench/documents.py, bench/peers/chunk_loop.py)."""

import pandas as pd
from transformers import AutoTokenizer

from bench.documents import make_w8_data
from bench.peers.chunk_loop import chunk_spans


def test_w8_documents_are_seeded_and_500_to_5000_tokens(tmp_path, minilm_dir):
    assert make_w8_data(tmp_path / "a", 6) == 6
    make_w8_data(tmp_path / "b", 6)
    a, b = pd.read_parquet(tmp_path / "a"), pd.read_parquet(tmp_path / "b")
    assert a.equals(b) and list(a.review_id) == list(range(1, 7))
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    tokens = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in a.body]
    assert min(tokens) >= 400 and max(tokens) <= 6000


def test_the_peer_chunks_with_the_tokenizers_overflowing_windows(minilm_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    text = " ".join(f"word{i}" for i in range(400))
    spans = chunk_spans(tokenizer, text, 64, 8)
    assert len(spans) > 5 and spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(len(tokenizer(text[s:e])["input_ids"]) <= 64 for s, e in spans)
    assert all(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # windows share tokens
