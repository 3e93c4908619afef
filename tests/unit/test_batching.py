"""The batching core on a transparent numpy head (its contract), then on the real embed head."""

import threading
import time
import weakref

import numpy as np
import pytest
import torch

from lakescore.udfs.batching import (
    AdaptiveBudget,
    BatchPolicy,
    plan_batches,
    prefetch,
    score_matrix,
    score_texts,
    take_rows,
)


class CharHead:
    """Tokenizes a text as one token per character (right-padded); outputs (length, first char code).

    Records the shape of every forward batch so tests can see the budget at work.
    """

    padding_side = "right"

    def __init__(self):
        self.batches: list[tuple[int, int]] = []

    def tokenize(self, texts):
        width = max(1, max(len(t) for t in texts))
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for i, t in enumerate(texts):
            ids[i, : len(t)] = [ord(c) for c in t]
            mask[i, : len(t)] = 1
        return {"input_ids": ids, "attention_mask": mask, "modality": "text"}

    def forward(self, features):
        ids, mask = features["input_ids"], features["attention_mask"]
        assert features["modality"] == "text"  # non-row entries pass through
        self.batches.append(ids.shape)
        return np.stack([mask.sum(1), ids[:, 0]], axis=1)


def test_outputs_come_back_in_input_order():
    texts = ["ccc", "a", "", "bbbbbb", "dd", "eeeee", "a"]
    scored = score_texts(texts, CharHead(), BatchPolicy(max_tokens=8, max_rows=2))
    outputs, valid = scored.outputs, scored.ok
    assert valid.all()
    expected = [[len(t), ord(t[0]) if t else 0] for t in texts]
    assert outputs.tolist() == expected


def test_batches_respect_token_budget_and_row_cap_with_padding_trimmed():
    rng = np.random.default_rng(0)
    texts = ["x" * int(n) for n in rng.lognormal(3, 1, size=300).clip(1, 400)]
    head = CharHead()
    outputs = score_texts(texts, head, BatchPolicy(max_tokens=512, max_rows=32)).outputs
    assert outputs[:, 0].tolist() == [len(t) for t in texts]
    for rows, width in head.batches:
        assert rows <= 32
        assert rows * width <= 512 or rows == 1  # a row longer than the budget runs alone
    widths = [w for _, w in head.batches]
    assert widths == sorted(widths, reverse=True)  # longest first, each batch padded only to its own longest
    assert sum(r for r, _ in head.batches) == len(texts)
    padded = sum(r * w for r, w in head.batches)
    assert padded <= 1.1 * sum(len(t) for t in texts)  # sorted batches waste little on padding


def test_plan_batches_short_rows_get_big_batches():
    lengths = [10] * 100 + [200] * 4
    batches = plan_batches(lengths, BatchPolicy(max_tokens=400, max_rows=64))
    assert [len(b) for b in batches] == [2, 2, 40, 40, 20]
    assert sorted(np.concatenate(batches).tolist()) == list(range(104))


def test_null_texts_are_masked_and_never_tokenized():
    head = CharHead()
    scored = score_texts(["abc", None, "de", float("nan")], head, BatchPolicy(64, 8))
    outputs, valid = scored.outputs, scored.ok
    assert valid.tolist() == [True, False, True, False]
    assert scored.reasons == [None, "null_input", None, "null_input"]
    assert head.batches == [(2, 3)]
    assert outputs[0].tolist() == [3, ord("a")] and outputs[2].tolist() == [2, ord("d")]


def test_all_null_batch_scores_nothing():
    head = CharHead()
    scored = score_texts([None, None], head, BatchPolicy(64, 8))
    assert not scored.ok.any() and head.batches == [] and len(scored.outputs) == 2


def test_head_returning_wrong_row_count_is_an_error():
    class Short(CharHead):
        def forward(self, features):
            return np.zeros((1, 2))

    with pytest.raises(ValueError, match="head returned 1 rows for a batch of 2"):
        score_texts(["a", "b"], Short(), BatchPolicy(64, 8))


def test_a_poisoned_row_is_retried_alone_and_does_not_take_its_batch_down():
    class Poisoned(CharHead):
        def forward(self, features):
            if (features["input_ids"] == ord("!")).any():
                raise RuntimeError("cannot score '!'")
            return super().forward(features)

    head = Poisoned()
    texts = ["abc", "x!y", "de", "fgh", "ij"]
    scored = score_texts(texts, head, BatchPolicy(max_tokens=64, max_rows=8))
    assert scored.reasons == [None, "scoring_error", None, None, None]
    assert scored.errors[1] == "RuntimeError: cannot score '!'"
    assert scored.outputs[[0, 2, 3, 4], 0].tolist() == [3, 2, 3, 2]
    assert (scored.outputs[1] == 0).all()


class SmallGpu(CharHead):
    """A head whose "GPU" holds ``capacity`` padded tokens: larger batches raise CUDA's out-of-memory error."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def forward(self, features):
        rows, width = features["input_ids"].shape
        if rows * width > self.capacity:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(features)


def test_cuda_out_of_memory_halves_the_budget_for_the_rest_of_the_task():
    head = SmallGpu(capacity=8)
    budget = AdaptiveBudget(BatchPolicy(max_tokens=32, max_rows=16))
    texts = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op"]
    scored = score_texts(texts, head, budget)
    assert scored.ok.all() and scored.outputs[:, 0].tolist() == [2] * 8
    assert budget.policy.max_tokens == 8 and budget.halvings == 1
    head.batches.clear()
    assert score_texts(texts, head, budget).ok.all()  # the next Arrow batch plans with the lower budget
    assert all(rows * width <= 8 for rows, width in head.batches) and len(head.batches) == 2


def test_batches_planned_before_an_out_of_memory_do_not_compound_the_budget():
    head = SmallGpu(capacity=4)
    budget = AdaptiveBudget(BatchPolicy(max_tokens=32, max_rows=8))
    texts = [chr(ord("a") + i % 26) for i in range(32)]  # 32 one-token rows: four planned batches of 8 tokens
    scored = score_texts(texts, head, budget)
    assert scored.ok.all() and scored.outputs[:, 0].tolist() == [1] * 32
    # Every planned batch ran out of memory, but only the first one says something new: the budget
    # ends at half of an 8-token batch, not halved again by each batch planned before it.
    assert budget.policy.max_tokens == 4 and budget.halvings == 1
    assert len(head.batches) == 8 and all(rows * width <= 4 for rows, width in head.batches)


class Activations:
    """What a failed forward leaves in its frame (on a GPU: the activations it had allocated)."""


class FreesOnlyWhatIsReleased(SmallGpu):
    """A "GPU" that can hold one batch's activations: a forward raises CUDA's out-of-memory error while any earlier
    forward's activations are still referenced, or when the batch is over ``capacity`` padded tokens."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.held: list[weakref.ref] = []

    def forward(self, features):
        activations = Activations()  # referenced by this frame, and so by a traceback through it
        if any(ref() is not None for ref in self.held):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory: an earlier batch's activations are still held")
        self.held.append(weakref.ref(activations))
        return super().forward(features)


def test_out_of_memory_retries_run_after_the_failed_forward_is_released():
    # On an H100 a retry inside the except block found the failed batch's activations still on the GPU (the
    # traceback holds the forward's frame), ran out of memory again at every size, and lost all 16,384 rows.
    head = FreesOnlyWhatIsReleased(capacity=8)
    texts = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op"]
    scored = score_texts(texts, head, BatchPolicy(max_tokens=32, max_rows=16))
    assert scored.ok.all() and scored.outputs[:, 0].tolist() == [2] * 8


def test_matrix_rows_with_nan_or_inf_are_bad_feature_values():
    class Sum:
        def forward(self, matrix):
            return matrix.sum(axis=1, keepdims=True)

    matrix = np.array([[1.0, 2.0], [np.nan, 1.0], [3.0, 4.0], [np.inf, 0.0], [0.5, 0.5]])
    scored = score_matrix(matrix, Sum(), BatchPolicy(max_tokens=1024, max_rows=2))
    assert scored.reasons == [None, "bad_feature_value", None, "bad_feature_value", None]
    assert scored.outputs[:, 0].tolist() == [3.0, 0.0, 7.0, 0.0, 1.0]


def test_policy_bounds_must_be_positive():
    with pytest.raises(ValueError, match="must be >= 1"):
        BatchPolicy(max_tokens=0, max_rows=4)


def test_take_rows_trims_on_the_padding_side():
    ids = np.array([[1, 2, 0, 0], [3, 4, 5, 0], [6, 0, 0, 0]])
    feats = {"input_ids": ids, "attention_mask": (ids > 0).astype(int), "lengths": np.array([2, 3, 1])}
    right = take_rows(feats, np.array([1, 0]), 3, "right")
    assert right["input_ids"].tolist() == [[3, 4, 5], [1, 2, 0]] and right["lengths"].tolist() == [3, 2]
    left_ids = np.array([[0, 0, 1, 2], [0, 3, 4, 5]])
    left = take_rows({"input_ids": left_ids, "attention_mask": (left_ids > 0).astype(int)}, np.array([1, 0]), 3, "left")
    assert left["input_ids"].tolist() == [[3, 4, 5], [0, 1, 2]]


@pytest.mark.parametrize("rows", [[2, 0], [1]])
def test_take_rows_keeps_numpy_values_beside_torch_tensors_row_shaped(rows):
    # A head may carry per-row numpy values (here the texts, an object array) next to torch tensors; a
    # one-row batch must still come back as one row, not as the bare element.
    ids = torch.tensor([[1, 2, 0], [3, 0, 0], [4, 5, 6]])
    texts = np.array(["ab", "c", "def"], dtype=object)
    feats = {"input_ids": ids, "attention_mask": (ids > 0).long(), "texts": texts, "offsets": torch.zeros(3, 3, 2)}
    out = take_rows(feats, np.array(rows), 2)
    assert isinstance(out["texts"], np.ndarray) and out["texts"].tolist() == texts[rows].tolist()
    assert out["input_ids"].tolist() == ids[rows, :2].tolist() and tuple(out["offsets"].shape) == (len(rows), 2, 2)


def test_prefetch_overlaps_work_and_keeps_order():
    started = []

    def work(item):
        started.append((item, threading.current_thread().name))
        time.sleep(0.05)
        return item * 10

    seen = []
    for item, result in prefetch(range(4), work):
        seen.append((item, result))
        if item == 0:
            time.sleep(0.1)  # while the consumer is busy, item 1's work is already running
            assert [i for i, _ in started] == [0, 1]
    assert seen == [(0, 0), (1, 10), (2, 20), (3, 30)]
    assert all(name.startswith("lakescore-prefetch") for _, name in started)
    assert list(prefetch([], work)) == []


def test_prefetch_surfaces_errors():
    def work(item):
        if item == 2:
            raise RuntimeError("bad batch 2")
        return item

    got = []
    with pytest.raises(RuntimeError, match="bad batch 2"):
        for item, _ in prefetch(range(4), work):
            got.append(item)
    assert got == [0, 1]  # items before the failing one are all delivered, in order


def test_real_embed_head_in_token_budget_batches_matches_sentence_transformers(minilm_dir, sentence_transformer):
    from lakescore.udfs.heads.embed import load_embedder
    from lakescore.udfs.models.model_source import ModelSpec

    head = load_embedder(ModelSpec("embed", str(minilm_dir)), minilm_dir)
    rng = np.random.default_rng(1)
    words = "the kettle is quiet and the lid fits well but shipping took ten days".split()
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.lognormal(3, 1.2, size=120).clip(0, 900)]
    texts[7] = ""
    scored = score_texts(texts, head, BatchPolicy(max_tokens=1024, max_rows=16))
    ours, valid = scored.outputs, scored.ok
    peer = sentence_transformer.encode(texts, normalize_embeddings=True)
    assert valid.all()
    cosine = (ours * peer).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(peer, axis=1)
    assert cosine.min() >= 0.9999
