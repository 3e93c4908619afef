"""The sampling settings issue 48 adds, in-process, against transformers' own ``model.generate`` on a tiny seeded
model: ``repetition_penalty``, ``min_new_tokens`` and ``stop_token_ids`` under greedy decoding give the tokens
``generate`` gives; ``top_k: 1`` sampling is greedy; ``top_k`` keeps the k likeliest tokens as transformers does."""

import pytest
import torch

from lakescore.udfs.batching import BatchPolicy
from lakescore.udfs.heads.generate import GenerateOptions, score_prompts
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from tests.tiny_generators import reviews, save_causal, train_tokenizer

PROMPTS = reviews(12, seed=5)


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    return save_causal(tmp_path_factory.mktemp("tiny-llama"), train_tokenizer("bos"))


@pytest.fixture(scope="module")
def reference(causal_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(causal_dir).eval(), AutoTokenizer.from_pretrained(causal_dir)


def _scored(model_dir, **options):
    spec = ModelSpec("generate", str(model_dir), generate=GenerateOptions(**options))
    head = get_task("generate").load(spec, model_dir)
    scored = score_prompts(PROMPTS, head, BatchPolicy(4096, 5))
    assert all(r is None for r in scored.reasons)
    return scored.outputs


def _generate(reference, prompt, **kwargs):
    model, tokenizer = reference
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    return out.sequences[0, ids.shape[1] :].tolist(), [step[0] for step in out.logits]


def test_repetition_penalty_min_new_tokens_and_stop_token_ids_decode_as_transformers_does(causal_dir, reference):
    _, tokenizer = reference
    greedy = _scored(causal_dir, max_new_tokens=8)
    stop = next(
        t for row in greedy for t in row.token_ids[1:3] if t != tokenizer.eos_token_id
    )  # a token some row makes
    outputs = _scored(causal_dir, max_new_tokens=8, repetition_penalty=1.8, min_new_tokens=3, stop_token_ids=(stop,))
    stopped = 0
    for prompt, row in zip(PROMPTS, outputs):
        expected, _ = _generate(
            reference,
            prompt,
            max_new_tokens=8,
            repetition_penalty=1.8,
            min_new_tokens=3,
            eos_token_id=[tokenizer.eos_token_id, stop],
        )
        assert list(row.token_ids) == expected
        assert len(row.token_ids) >= 3
        if row.token_ids[-1] == stop:
            stopped += 1
            assert row.finish_reason == "stop" and row.text == tokenizer.decode(
                row.token_ids[:-1], skip_special_tokens=True
            )
    assert stopped >= 1


def test_top_k_one_samples_the_greedy_text(causal_dir):
    greedy = _scored(causal_dir, max_new_tokens=6)
    sampled = _scored(causal_dir, max_new_tokens=6, temperature=1.5, top_k=1, seed=3)
    assert [r.text for r in sampled] == [r.text for r in greedy]


def test_top_k_keeps_the_k_likeliest_tokens_renormalised():
    from lakescore.udfs.heads.decoding import _top_k

    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    kept = _top_k(probs, 2)
    torch.testing.assert_close(kept[0], torch.tensor([0.0, 4 / 7, 0.0, 3 / 7], dtype=torch.float64))
    torch.testing.assert_close(kept[1], probs[1])  # ties at the k-th value stay, as transformers keeps them
