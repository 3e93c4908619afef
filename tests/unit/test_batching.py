import numpy as np
import pytest

from udfs.batching import length_order, score_in_length_order


class RecordingScorer:
    """Scores a text as (its length, a per-text hash) and records every batch it saw."""

    def __init__(self):
        self.batches: list[list[str]] = []

    def __call__(self, texts):
        self.batches.append(list(texts))
        return np.array([[len(t), hash(t) % 1000] for t in texts], dtype=np.int64)


def test_outputs_come_back_in_input_order():
    texts = ["ccc", "a", "", "bbbbbb", "dd", "eeeee", "a"]
    scorer = RecordingScorer()
    outputs, valid = score_in_length_order(texts, scorer, batch_size=2)
    assert valid.all()
    expected = np.array([[len(t), hash(t) % 1000] for t in texts])
    np.testing.assert_array_equal(outputs, expected)


def test_batches_are_capped_and_length_sorted():
    rng = np.random.default_rng(0)
    texts = ["x" * int(n) for n in rng.integers(0, 300, size=101)]
    scorer = RecordingScorer()
    score_in_length_order(texts, scorer, batch_size=16)
    assert [len(b) for b in scorer.batches] == [16] * 6 + [5]
    seen = [len(t) for batch in scorer.batches for t in batch]
    assert seen == sorted(seen, reverse=True)  # longest first, so each batch pads to similar lengths
    assert sorted(seen) == sorted(len(t) for t in texts)  # every text scored exactly once


def test_null_texts_are_masked_and_never_scored():
    texts = ["abc", None, "de", float("nan")]
    scorer = RecordingScorer()
    outputs, valid = score_in_length_order(texts, scorer, batch_size=8)
    assert valid.tolist() == [True, False, True, False]
    assert scorer.batches == [["abc", "de"]]
    assert outputs[0, 0] == 3 and outputs[2, 0] == 2


def test_all_null_batch_scores_nothing():
    scorer = RecordingScorer()
    outputs, valid = score_in_length_order([None, None], scorer, batch_size=4)
    assert not valid.any() and scorer.batches == [] and len(outputs) == 2


def test_scorer_returning_wrong_row_count_is_an_error():
    with pytest.raises(ValueError, match="returned 1 rows for a batch of 2"):
        score_in_length_order(["a", "b"], lambda texts: np.zeros((1, 3)), batch_size=4)


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        score_in_length_order(["a"], RecordingScorer(), batch_size=0)


def test_length_order_is_stable_for_ties():
    assert length_order(["aa", "b", "cc", "d"]).tolist() == [0, 2, 1, 3]
