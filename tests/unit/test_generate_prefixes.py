"""Prompts sharing a prefix, in-process: the groups found, the batches planned, and the prefix computed once giving
the token ids the unshared path gives, on a tiny Llama and a tiny GPT-2 (no Spark)."""

import numpy as np
import pytest
import torch

from lakescore.udfs.batching import BatchPolicy, plan_grouped_batches
from lakescore.udfs.heads.generate import GenerateOptions, score_prompts, token_traffic
from lakescore.udfs.heads.prefixes import PrefixGroup, prefix_groups
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from tests.tiny_generators import CHAT_TEMPLATE, reviews, save_causal, train_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    tokenizer = train_tokenizer("bos")
    tokenizer.chat_template = CHAT_TEMPLATE
    return save_causal(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = train_tokenizer("none")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=160,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    target = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def load(model_dir, **options):
    spec = ModelSpec("generate", str(model_dir), generate=GenerateOptions(**options))
    return get_task("generate").load(spec, model_dir)


def documents(n: int, seed: int) -> list[str]:
    """``n`` documents of a few reviews each: some 40-70 tokens of the tiny tokenizer."""
    return [" ".join(reviews(5, seed=seed + d)) for d in range(n)]


QUESTIONS = ("Who wrote it?", "Is it good?", "What is it about?", "Would you buy it?", "Why?")


def test_groups_skip_the_most_tokens_and_keep_a_token_of_each_row_its_own():
    system, doc_a, doc_b = [1] * 6, list(range(10, 30)), list(range(40, 60))
    rows = [
        system + doc_a + [7],
        system + doc_b + [8, 9],
        system + doc_a + [8],
        [5, 5, 5],
        system + doc_b + [7],
        system + doc_a,  # the prefix itself: the group's shared part leaves it its last token
    ]
    # the system prompt is shared by five rows (4 x 6 skipped), each document by its rows (2 x 25 + 1 x 26)
    assert prefix_groups(rows, 4) == [PrefixGroup((0, 2, 5), 25), PrefixGroup((1, 4), 26)]
    assert prefix_groups(rows, 27) == []
    assert prefix_groups(rows, 0) == [] and prefix_groups(rows[:1], 1) == []
    # a long shared head outweighs two short documents: one group of all, the documents' tails computed per row
    assert prefix_groups([[1] * 50 + [2, 3, 4], [1] * 50 + [2, 3, 5], [1] * 50 + [6, 7, 8]], 4) == [
        PrefixGroup((0, 1, 2), 50)
    ]


def test_grouped_batches_keep_a_group_whole_and_apart_from_rows_in_none():
    lengths = np.array([10, 12, 11, 30, 9, 12, 10, 5])
    group_of = np.array([0, 1, 0, -1, 1, 0, 1, -1])
    batches = plan_grouped_batches(lengths, group_of, BatchPolicy(max_tokens=40, max_rows=8))
    assert [b.tolist() for b in batches] == [[5, 2, 0], [1, 6, 4], [3], [7]]  # 3 x 12 fits, 6 x 12 not
    assert sorted(np.concatenate(batches).tolist()) == list(range(8))
    # a group larger than a batch is cut by the budget as the plain plan cuts
    assert [b.tolist() for b in plan_grouped_batches(lengths[:3], np.zeros(3), BatchPolicy(24, 8))] == [[1, 2], [0]]


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_a_shared_prefix_computed_once_gives_the_unshared_token_ids(model, llama_dir, gpt2_dir):
    """Greedy token ids equal, row by row, with the prefix computed once and without, for every batch mix: all rows
    of a batch sharing one document, none sharing, two documents, one row; the report's count is the tokens skipped."""
    model_dir = llama_dir if model == "llama" else gpt2_dir
    shared, whole = load(model_dir, max_new_tokens=8), load(model_dir, max_new_tokens=8, share_prefix_tokens=0)
    docs = documents(3, seed=7)
    two = [f"{doc}\n{q}" for doc in docs[:2] for q in QUESTIONS]
    mixes = {
        "all share": [f"{docs[2]}\n{q}" for q in QUESTIONS],
        "none share": reviews(6, seed=3),
        "two groups": two,
        "two groups and rows in none": two + reviews(3, seed=4),
        "one row": [f"{docs[0]}\n{QUESTIONS[0]}"],
    }
    policy = BatchPolicy(max_tokens=16 * 96, max_rows=16)
    for mix, prompts in mixes.items():
        got, expected = score_prompts(prompts, shared, policy), score_prompts(prompts, whole, policy)
        assert got.ok.all() and expected.ok.all(), (mix, got.errors, expected.errors)
        assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs], mix
        features = shared.tokenize(prompts)
        groups = shared.shared_prefixes(features)
        skipped = token_traffic(got.outputs, got.ok).tokens_in_cached
        assert skipped == sum(g.skipped for g in groups), mix
        assert token_traffic(expected.outputs, expected.ok).tokens_in_cached == 0
        if mix.startswith("two groups"):
            assert len(groups) == 2 and min(g.length for g in groups) >= 32, mix
        elif mix == "all share":
            assert [len(g.rows) for g in groups] == [len(prompts)] and skipped > 4 * 32
        else:
            assert skipped == 0, mix
    assert len({o.text for o in got.outputs}) >= 1


def test_sampled_rows_compute_their_prompts_whole(llama_dir):
    head = load(llama_dir, max_new_tokens=4, temperature=0.7, seed=3)
    doc = documents(1, seed=9)[0]
    scored = score_prompts([f"{doc}\n{q}" for q in QUESTIONS], head, BatchPolicy(4096, 16))
    assert head.share_prefix_tokens == 0 and token_traffic(scored.outputs, scored.ok).tokens_in_cached == 0
    assert GenerateOptions(share_prefix_tokens=0).identity() == GenerateOptions().identity()
