"""The generate head against transformers' own ``model.generate`` and a hand computation, on tiny seeded models.

A Llama-shaped decoder (with a chat template) and a T5-shaped encoder-decoder are built here from configs,
with a byte-level BPE tokenizer trained in a second on synthetic reviews, saved with ``save_pretrained`` and
loaded through the task registry. Every test scores through :func:`score_prompts`, the real batching core.
"""

import json
import pickle

import jsonschema
import numpy as np
import pyarrow as pa
import pytest
import torch

from lakescore.jobs.config import ConfigError, load_config
from lakescore.udfs.batching import BatchPolicy, plan_batches
from lakescore.udfs.heads.decoding import row_seed
from lakescore.udfs.heads.generate import GenerateOptions, score_prompts, template_columns, template_parts, token_counts
from lakescore.udfs.models.model_fit import check_model_fits
from lakescore.udfs.models.model_source import ModelSpec, UnfitModelError
from lakescore.udfs.registry import get_task, named_columns
from tests.tiny_generators import CHAT_TEMPLATE, CONTEXT, reviews, save_causal, train_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    tokenizer = train_tokenizer("bos")
    tokenizer.chat_template = CHAT_TEMPLATE
    return save_causal(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="module")
def seq2seq_dir(tmp_path_factory):
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer = train_tokenizer("eos")
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        initializer_factor=20.0,  # a T5 at the default scale emits <pad> at every step: no output to compare
        decoder_start_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    target = tmp_path_factory.mktemp("tiny-t5")
    T5ForConditionalGeneration(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def load(model_dir, **options):
    spec = ModelSpec("generate", str(model_dir), generate=GenerateOptions(**options))
    return get_task("generate").load(spec, model_dir)


def reference_new_tokens(model, prompt_ids, max_new_tokens):
    """transformers' greedy ``generate`` on one unpadded row: its new token ids and each step's raw logits."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    start = (
        1 if model.config.is_encoder_decoder else ids.shape[1]
    )  # an encoder-decoder's output opens with its start token
    return out.sequences[0, start:].tolist(), [step[0] for step in out.logits]


def assert_greedy_matches_generate(head, prompts, prompt_ids, max_new_tokens, policy):
    features = head.tokenize(prompts)
    batches = plan_batches(head.row_cost(features), policy)
    assert max(len(b) for b in batches) >= 8 and len(batches) >= 3  # real batches, of prompts of several lengths
    assert len(set(features["prompt_tokens"].tolist())) >= 8  # so most rows run left-padded
    scored = score_prompts(prompts, head, policy)
    assert scored.ok.all(), scored.errors
    same = 0
    for ids, out in zip(prompt_ids, scored.outputs):
        expected, logits = reference_new_tokens(head.model, ids, max_new_tokens)
        got = list(out.token_ids)
        if got == expected:
            same += 1
            continue
        step = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
        top = torch.topk(logits[step].float(), 2).values
        assert float(top[0] - top[1]) < 1e-4, f"diverged at step {step} with a logit margin of {float(top[0] - top[1])}"
    assert same >= 0.99 * len(prompts), f"{same} of {len(prompts)} rows equal transformers' generate"
    return scored


def test_options_are_frozen_hashable_picklable_and_refuse_bad_values():
    options = GenerateOptions(stop=["\n", "###"], choices=["yes", "no"], temperature=0.7, seed=3)
    assert options.stop == ("\n", "###") and options.choices == ("yes", "no")
    spec = ModelSpec("generate", "/m", generate=options)
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert hash(spec) == hash(
        ModelSpec(
            "generate",
            "/m",
            generate=GenerateOptions(stop=("\n", "###"), choices=("yes", "no"), temperature=0.7, seed=3),
        )
    )
    assert (
        spec.identity()["generate"]
        != ModelSpec("generate", "/m", generate=GenerateOptions(seed=4)).identity()["generate"]
    )
    assert json.loads(json.dumps(spec.identity()))["generate"]["stop"] == ["\n", "###"]  # every setting, by name
    assert "generate" not in ModelSpec("embed", "/m").identity()  # other tasks' specs (and digests) as before
    assert (
        options.deterministic and not GenerateOptions(temperature=0.7).deterministic and GenerateOptions().deterministic
    )
    for bad, message in [
        (dict(chat_template="always"), "chat_template"),
        (dict(truncate="right"), "truncate"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(stop=[""]), "stop"),
        (dict(stop="END"), "stop"),
        (dict(choices=["a", "a"]), "choices"),
        (dict(choices=["a", "b"], json_schema="{}"), "exclude"),
        (dict(json_schema="{not json"), "not JSON"),
        (dict(choices=["a"]), "two choices at least"),
        (dict(choice_score="max"), "choice_score"),
        (
            dict(json_schema='{"properties": {"n": {"type": "integr"}}}'),
            "not a valid JSON Schema: at properties/n/type",
        ),
        (dict(json_schema="[1]"), "JSON object"),
        (dict(prompt_template="{0} and {}"), "placeholder"),
        (dict(prompt_template="{row.attr}"), "placeholder"),
        (dict(prompt_template="{unclosed"), "str.format"),
    ]:
        with pytest.raises(ValueError, match=message):
            GenerateOptions(**bad)


def test_prompt_templates_name_columns_and_nothing_else():
    template = "Review: {text}\nStars: {stars}\nSummary of {{{text}}}:"
    values = {"text": "good food", "stars": "4"}
    rendered = "".join(literal + (values[name] if name else "") for literal, name in template_parts(template))
    assert rendered == template.format(**values) == "Review: good food\nStars: 4\nSummary of {good food}:"
    assert template_columns(template) == ("text", "stars")
    for bad, message in [
        ("{stars:.1f}", "format spec"),
        ("{text!r}", "format spec"),
        ("{0}", "placeholder"),
        ("{}", "placeholder"),
    ]:
        with pytest.raises(ValueError, match=message):
            template_parts(bad)


def test_greedy_equals_transformers_generate_per_row(causal_dir):
    """Chat template and system prompt included: the reference prompt ids come from ``apply_chat_template`` itself."""
    head = load(causal_dir, max_new_tokens=10, system_prompt="Summarise the review.")
    prompts = reviews(100, seed=1)
    tokenizer = head.tokenizer
    prompt_ids = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": "Summarise the review."}, {"role": "user", "content": p}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for p in prompts
    ]
    scored = assert_greedy_matches_generate(head, prompts, prompt_ids, 10, BatchPolicy(12 * 64, 256))
    assert [o.prompt_tokens for o in scored.outputs] == [len(ids) for ids in prompt_ids]
    assert {o.finish_reason for o in scored.outputs} <= {"stop", "length"}
    assert len({o.text for o in scored.outputs}) > 50  # the model says different things to different prompts
    tokens_in, tokens_out = token_counts(scored.outputs, scored.ok)
    assert tokens_in == sum(map(len, prompt_ids)) and tokens_out == sum(o.completion_tokens for o in scored.outputs)


def test_seq2seq_greedy_equals_transformers_generate_per_row(seq2seq_dir):
    head = load(seq2seq_dir, max_new_tokens=8)
    assert head.encoder_decoder and not head.use_chat_template
    prompts = reviews(60, seed=2)
    prompt_ids = [head.tokenizer(p)["input_ids"] for p in prompts]
    scored = assert_greedy_matches_generate(head, prompts, prompt_ids, 8, BatchPolicy(10 * 24, 256))
    assert len({o.text for o in scored.outputs}) > 30


def test_choices_are_scored_as_the_hand_computed_continuation_logprobs(causal_dir, seq2seq_dir):
    choices = ("good", "bad movie", "never again!")
    prompts = reviews(12, seed=3)
    for model_dir in (causal_dir, seq2seq_dir):
        head = load(model_dir, choices=choices, chat_template="never")
        scored = score_prompts(prompts, head, BatchPolicy(3 * 40 * 3, 256))
        assert scored.ok.all(), scored.errors
        model, tokenizer = head.model, head.tokenizer
        for prompt, out in zip(prompts, scored.outputs):
            prompt_ids = tokenizer(prompt)["input_ids"]
            expected = []
            for choice in choices:
                ids = tokenizer(choice, add_special_tokens=False)["input_ids"]
                with torch.no_grad():
                    if model.config.is_encoder_decoder:
                        decoder = [model.config.decoder_start_token_id] + ids[:-1]
                        logits = model(
                            input_ids=torch.tensor([prompt_ids]), decoder_input_ids=torch.tensor([decoder])
                        ).logits[0]
                    else:
                        logits = model(input_ids=torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1]
                expected.append(float(torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).sum()))
            np.testing.assert_allclose(out.choice_logprobs, expected, rtol=1e-6, atol=1e-4)  # float32 sums
            best = int(np.argmax(expected))
            assert (out.text, out.finish_reason) == (choices[best], "choice")
            assert out.completion_tokens == len(tokenizer(choices[best], add_special_tokens=False)["input_ids"])
        assert len({o.choice_logprobs for o in scored.outputs}) == len(prompts)  # each prompt scores them its own way


def test_sampling_is_reproducible_per_row_whatever_the_batch(causal_dir):
    head = load(causal_dir, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    prompts = reviews(24, seed=4)
    prompts[5] = prompts[6]  # one prompt on two rows: their keys differ, so do their samples
    keys = [f"row-{i}" for i in range(len(prompts))]
    small = score_prompts(prompts, head, BatchPolicy(40, 256), keys=keys)  # about one row a batch
    large = score_prompts(prompts, head, BatchPolicy(100_000, 256), keys=keys[:])  # every row in one batch
    assert max(map(len, plan_batches(head.row_cost(head.tokenize(prompts)), BatchPolicy(40, 256)))) <= 2
    assert [o.token_ids for o in small.outputs] == [o.token_ids for o in large.outputs]
    assert small.outputs[5].token_ids != small.outputs[6].token_ids
    alone = score_prompts([prompts[9]], head, BatchPolicy(40, 256), keys=[keys[9]])
    assert alone.outputs[0].token_ids == small.outputs[9].token_ids
    greedy = score_prompts(prompts, load(causal_dir, max_new_tokens=12), BatchPolicy(100_000, 256))
    assert sum(a.token_ids != b.token_ids for a, b in zip(small.outputs, greedy.outputs)) >= 20  # it does sample
    reseeded = score_prompts(
        prompts,
        load(causal_dir, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=8),
        BatchPolicy(100_000, 256),
        keys=keys,
    )
    assert sum(a.token_ids != b.token_ids for a, b in zip(small.outputs, reseeded.outputs)) >= 20
    assert row_seed(7, "row-1") == row_seed(7, "row-1") != row_seed(7, "row-2")


def test_stop_strings_cut_the_text_before_the_first_one(causal_dir):
    prompts = reviews(16, seed=5)
    plain = score_prompts(prompts, load(causal_dir, max_new_tokens=16), BatchPolicy(100_000, 256))
    texts = [o.text for o in plain.outputs]
    ascii_pairs = [
        t[i : i + 2] for t in texts for i in range(2, len(t) - 1) if t[i : i + 2].isascii() and t[i : i + 2].strip()
    ]
    stops = (ascii_pairs[0], ascii_pairs[len(ascii_pairs) // 2])
    stopped = score_prompts(prompts, load(causal_dir, max_new_tokens=16, stop=stops), BatchPolicy(100_000, 256))
    cut = 0
    for text, before, out in zip(texts, plain.outputs, stopped.outputs):
        found = [i for i in (text.find(s) for s in stops) if i >= 0]
        if found:
            cut += 1
            assert (out.text, out.finish_reason) == (text[: min(found)], "stop")
            assert out.completion_tokens <= before.completion_tokens
        else:
            assert (out.text, out.finish_reason, out.completion_tokens) == (
                text,
                before.finish_reason,
                before.completion_tokens,
            )
    assert cut >= 2
    assert sum(o.completion_tokens for o in stopped.outputs) < sum(o.completion_tokens for o in plain.outputs)


SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["good", "bad", "mixed"]},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "ok": {"type": "boolean"},
        "why": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["food", "staff", "price"]}, "maxItems": 2},
    },
    "required": ["label", "stars", "ok", "why", "tags"],
    "additionalProperties": False,
}


def test_choice_score_mean_is_transformers_mean_token_log_probability(causal_dir):
    """``choice_score: mean`` compares choices by their mean token log-probability, which transformers' own loss over
    the choice's tokens is (negated); ``sum`` stays the default."""
    choices = ("good", "bad movie", "never again!")
    prompts = reviews(8, seed=11)
    policy = BatchPolicy(3 * 40 * 3, 256)
    head = load(causal_dir, choices=choices, chat_template="never", choice_score="mean")
    scored = score_prompts(prompts, head, policy)
    summed = score_prompts(prompts, load(causal_dir, choices=choices, chat_template="never"), policy)
    assert scored.ok.all() and summed.ok.all()
    model, tokenizer = head.model, head.tokenizer
    lengths = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in choices]
    assert len(set(lengths)) == len(choices)  # choices of different lengths, where sum and mean differ
    for prompt, out, total in zip(prompts, scored.outputs, summed.outputs):
        prompt_ids = tokenizer(prompt)["input_ids"]
        expected = []
        for choice in choices:
            ids = tokenizer(choice, add_special_tokens=False)["input_ids"]
            labels = torch.tensor([[-100] * len(prompt_ids) + ids])  # the loss reads the choice's tokens only
            with torch.no_grad():
                expected.append(-float(model(input_ids=torch.tensor([prompt_ids + ids]), labels=labels).loss))
        np.testing.assert_allclose(out.choice_logprobs, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.array(total.choice_logprobs) / lengths, expected, rtol=1e-5, atol=1e-5)
        assert out.text == choices[int(np.argmax(expected))] and out.finish_reason == "choice"


def test_a_json_schema_that_is_no_json_schema_is_refused_when_the_config_loads():
    flags = {
        "input": "in",
        "output": "out",
        "task": "generate",
        "model.source": "/m",
        "id_col": "id",
        "generate.json_schema": {"type": "object", "properties": {"n": {"type": "integr"}}},
    }
    with pytest.raises(
        ConfigError, match=r"generate.json_schema is not a valid JSON Schema: at properties/n/type: 'integr'"
    ):
        load_config(flags=flags)
    with pytest.raises(ConfigError, match="generate.choices needs two choices at least"):
        load_config(flags={**flags, "generate.json_schema": None, "generate.choices": ["positive"]})


def test_a_vocabulary_with_tokens_too_long_for_the_grammar_engine_generates_json_without_them(tmp_path):
    """llguidance panics (a BaseException) on a token over 1024 bytes: the head builds its grammar without such tokens,
    and constrained text never uses them."""
    tokenizer = train_tokenizer("bos")
    tokenizer.add_tokens(["z" * 2000])
    model_dir = save_causal(tmp_path / "m", tokenizer)
    head = load(model_dir, max_new_tokens=80, json_schema=json.dumps(SCHEMA))
    scored = score_prompts(reviews(4, seed=2), head, BatchPolicy(100_000, 256))
    assert scored.ok.all(), scored.errors
    long_id = tokenizer.convert_tokens_to_ids("z" * 2000)
    for out in scored.outputs:
        jsonschema.validate(json.loads(out.text), SCHEMA)
        assert long_id not in out.token_ids


def test_a_tokenizer_the_grammar_engine_cannot_use_is_refused_in_one_line(tmp_path):
    """A Unigram vocabulary (ids by position: its long piece cannot be left out) with a piece over 1024 bytes: the
    engine's panic becomes one line naming the tokenizer and the engine's message."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = [("<pad>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [
        (c, -2.0) for c in 'abcdefgnorstu {}":,0123456789'
    ]
    backend = Tokenizer(models.Unigram(pieces + [("y" * 2000, -1.0)], unk_id=3, byte_fallback=False))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    model_dir = save_causal(tmp_path / "m", tokenizer)
    with pytest.raises(UnfitModelError) as refused:
        load(model_dir, max_new_tokens=8, json_schema=json.dumps(SCHEMA))
    line = str(refused.value)
    assert "\n" not in line and "task generate: generate.json_schema" in line and str(model_dir) in line
    assert "assertion failed" in line  # llguidance's own message
    assert load(model_dir, max_new_tokens=8).score(["ab"])[0].completion_tokens > 0  # unconstrained, it generates


def test_max_new_tokens_over_the_context_is_refused_on_the_drivers_copy_of_the_config(causal_dir, tmp_path):
    def spec(most, **kw):
        return ModelSpec("generate", str(causal_dir), generate=GenerateOptions(max_new_tokens=most), **kw)

    check_model_fits(spec(CONTEXT - 1), causal_dir)
    for refused, context in ((spec(CONTEXT), CONTEXT), (spec(60, max_seq_length=50), 50)):
        with pytest.raises(
            UnfitModelError,
            match=rf"task generate: generate.max_new_tokens \d+ leaves no room for a prompt "
            rf"in the context of {context} tokens",
        ):
            check_model_fits(refused, causal_dir)
    # GPT-2's name for its positions, and a tokenizer's own limit below them
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_positions": 1024}))
    (gpt2 / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 100}))
    with pytest.raises(UnfitModelError, match="context of 100 tokens"):
        check_model_fits(ModelSpec("generate", str(gpt2), generate=GenerateOptions(max_new_tokens=100)), gpt2)
    with pytest.raises(UnfitModelError, match="no room"):  # the executors' load keeps the same rule
        load(causal_dir, max_new_tokens=CONTEXT)


def test_json_schema_output_parses_and_validates_on_every_row(causal_dir, seq2seq_dir):
    prompts = reviews(10, seed=6)
    for model_dir, temperature in ((causal_dir, 0.0), (causal_dir, 1.0), (seq2seq_dir, 0.0)):
        head = load(model_dir, max_new_tokens=80, json_schema=json.dumps(SCHEMA), temperature=temperature)
        scored = score_prompts(prompts, head, BatchPolicy(100_000, 256), keys=[str(i) for i in range(len(prompts))])
        assert scored.ok.all(), scored.errors
        for out in scored.outputs:
            jsonschema.validate(json.loads(out.text), SCHEMA)
            assert out.finish_reason == "stop"
        assert len({o.text for o in scored.outputs}) >= 2 or temperature == 0.0
    with pytest.raises(ValueError, match="json_schema"):
        load(causal_dir, json_schema=json.dumps({"type": "object", "properties": {"x": {"type": "no-such-type"}}}))


def test_a_prompt_too_long_for_the_context_is_dead_lettered_or_cut_on_the_left(causal_dir):
    max_new = 8
    long_prompt = " ".join(reviews(30, seed=7))  # far over CONTEXT - max_new tokens
    prompts = ["good food", long_prompt, None, "slow service"]
    head = load(causal_dir, max_new_tokens=max_new, chat_template="never")
    assert len(head.tokenizer(long_prompt)["input_ids"]) > CONTEXT
    scored = score_prompts(prompts, head, BatchPolicy(1024, 256))
    assert scored.reasons == [None, "prompt_too_long", "null_input", None]
    assert f"exceeds the model's context of {CONTEXT} tokens" in scored.errors[1]
    short = score_prompts(["good food", "slow service"], head, BatchPolicy(1024, 256))
    assert [scored.outputs[i].token_ids for i in (0, 3)] == [o.token_ids for o in short.outputs]

    cut = score_prompts(
        prompts,
        load(causal_dir, max_new_tokens=max_new, chat_template="never", truncate="left"),
        BatchPolicy(1024, 256),
    )
    assert cut.reasons == [None, None, "null_input", None]
    ids = head.tokenizer(long_prompt)["input_ids"]
    kept = [ids[0]] + ids[len(ids) - (CONTEXT - max_new - 1) :]  # the BOS, then the prompt's last tokens
    assert cut.outputs[1].prompt_tokens == CONTEXT - max_new
    expected, _ = reference_new_tokens(head.model, kept, max_new)
    assert list(cut.outputs[1].token_ids) == expected


def test_a_row_whose_generation_raises_fails_alone(tmp_path):
    """A tokenizer with a token the model has no embedding for: the prompt that uses it raises inside the forward."""
    tokenizer = train_tokenizer("bos", extra=("<orphan>",))
    model_dir = save_causal(tmp_path / "m", tokenizer, vocab_size=len(tokenizer) - 1)
    head = load(model_dir, max_new_tokens=6, chat_template="never")
    prompts = ["good food", "the <orphan> hotel", "slow service", "clean room"]
    scored = score_prompts(prompts, head, BatchPolicy(100_000, 256))
    assert scored.reasons == [None, "generation_error", None, None]
    assert "index" in scored.errors[1].lower()
    alone = score_prompts([p for i, p in enumerate(prompts) if i != 1], head, BatchPolicy(100_000, 256))
    assert [scored.outputs[i].token_ids for i in (0, 2, 3)] == [o.token_ids for o in alone.outputs]


def test_a_prompt_of_no_tokens_is_refused_alone(tmp_path):
    """A tokenizer that adds no special tokens (GPT-2's way) makes no token of an empty prompt: nothing to continue."""
    model_dir = save_causal(tmp_path / "m", train_tokenizer("none"))
    head = load(model_dir, max_new_tokens=4, chat_template="never")
    scored = score_prompts(["good food", "", "slow"], head, BatchPolicy(1024, 256))
    assert scored.reasons == [None, "empty_prompt", None]
    assert [o.completion_tokens for o in scored.outputs[[0, 2]]] == [4, 4]


def test_columns_follow_the_output_schema(causal_dir):
    head = load(causal_dir, max_new_tokens=4)
    scored = score_prompts(["good food", None, "slow"], head, BatchPolicy(1024, 256))
    columns = named_columns("generate", head.columns(scored.outputs, scored.ok))
    assert list(columns) == ["generated_text", "finish_reason", "prompt_tokens", "completion_tokens", "choice_logprobs"]
    assert [c.type for c in columns.values()] == get_task("generate").output_arrow_types
    assert columns["generated_text"].to_pylist()[1] is None and columns["completion_tokens"].to_pylist() == [4, None, 4]
    assert columns["choice_logprobs"].null_count == 3
    chooser = load(causal_dir, choices=("yes", "no"))
    picked = score_prompts(["good food"], chooser, BatchPolicy(1024, 256))
    logprobs = chooser.columns(picked.outputs, picked.ok)[4]
    assert logprobs.type == pa.list_(pa.field("element", pa.float64(), nullable=False))
    assert len(logprobs.to_pylist()[0]) == 2
    assert head.score(["lakescore preflight"]).shape == (1,)


def test_token_logprobs_are_the_models_own_log_probabilities_of_each_new_token(causal_dir):
    """One value per generated token (EOS included), the log-probability of the picked token under the model's
    unprocessed distribution: greedy picks the arg-max, so each is that step's largest log-softmax; sampled with a
    temperature and top-k, still the model's, not the sampler's. Checked against one forward pass over the prompt and
    the new tokens, without batching, padding or the cache."""
    prompts = reviews(12, seed=21)
    policy = BatchPolicy(4 * 40, 256)  # several rows a batch, left-padded
    greedy = load(causal_dir, max_new_tokens=8, chat_template="never", logprobs=True)
    sampled = load(causal_dir, max_new_tokens=8, chat_template="never", logprobs=True, temperature=0.5, top_k=3, seed=1)
    model, tokenizer = greedy.model, greedy.tokenizer
    tempered_apart = 0
    for head in (greedy, sampled):
        scored = score_prompts(prompts + [None], head, policy, keys=[str(i) for i in range(len(prompts) + 1)])
        assert scored.ok[:-1].all(), scored.errors
        for prompt, out in zip(prompts, scored.outputs):
            values = np.array(out.token_logprobs)
            assert len(values) == out.completion_tokens == len(out.token_ids) and (values <= 0).all()
            prompt_ids = tokenizer(prompt)["input_ids"]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt_ids + list(out.token_ids)])).logits[
                    0, len(prompt_ids) - 1 : -1
                ]
            steps = torch.log_softmax(logits.float(), -1)
            picked = steps.gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1).numpy()
            np.testing.assert_allclose(values, picked, atol=1e-4)
            if head is greedy:
                np.testing.assert_allclose(values, steps.max(-1).values.numpy(), atol=1e-4)
            else:
                tempered = torch.log_softmax(logits.float() / 0.5, -1).gather(1, torch.tensor(out.token_ids)[:, None])
                tempered_apart += int(np.abs(tempered.squeeze(1).numpy() - values).max() > 1e-2)
        columns = named_columns("generate", head.columns(scored.outputs, scored.ok), head.options)
        assert list(columns)[-1] == "token_logprobs" and columns["token_logprobs"].to_pylist()[-1] is None
        assert columns["token_logprobs"].type == pa.list_(pa.field("element", pa.float32(), nullable=False))
    assert tempered_apart >= 6  # the sampler's distribution is another one: the values are not read from it
    assert len(load(causal_dir, max_new_tokens=4).columns(scored.outputs, scored.ok)) == 5  # not asked: no column
    with pytest.raises(ValueError, match="choice_logprobs already"):
        GenerateOptions(choices=("yes", "no"), logprobs=True)


def test_the_preallocated_cache_holds_what_transformers_dynamic_cache_holds():
    """Written in place (and grown past its planned size, and with rows dropped), a layer returns the keys and values
    that transformers' own concatenating cache returns."""
    from transformers import DynamicCache, LlamaConfig

    from lakescore.udfs.heads.decoding import _preallocated_cache

    config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1)
    ours, theirs = _preallocated_cache(config, capacity=4), DynamicCache(config=config)
    generator = torch.Generator().manual_seed(0)
    for step, tokens in enumerate((3, 1, 1, 1)):
        if step == 2:
            for cache in (ours, theirs):
                cache.reorder_cache(torch.tensor([2, 0]))
        rows = 3 if step < 2 else 2
        keys, values = (torch.randn(rows, 1, tokens, 8, generator=generator) for _ in range(2))
        got, expected = ours.update(keys, values, 0), theirs.update(keys, values, 0)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert ours.get_seq_length() == theirs.get_seq_length()
    assert ours.layers[0].capacity == 6  # grown by the last step


def test_a_prompt_the_chat_template_rejects_is_refused_and_its_batch_generates(tmp_path):
    """The runner's prepare step: one prompt whose chat template raises is ``prepare_error``; its neighbours are
    generated as they would be without it, and keep their own keys."""
    from lakescore.udfs.batching import AdaptiveBudget
    from lakescore.udfs.runners import PromptRunner

    tokenizer = train_tokenizer("bos")
    tokenizer.chat_template = (
        "{% for m in messages %}{% if '#' in m['content'] %}{{ raise_exception('no # here') }}{% endif %}"
        "{{ m['content'] }}\n{% endfor %}"
    )
    head = load(save_causal(tmp_path / "m", tokenizer), max_new_tokens=4)
    runner = PromptRunner(head, ["prompt"], key_col="id")
    batch = pa.record_batch({"prompt": ["good food", "bad # room", None, "slow"], "id": [1, 2, 3, 4]})
    prepared = runner.prepare(batch)
    scored = runner.score(prepared, AdaptiveBudget(BatchPolicy(1024, 256)))
    assert scored.reasons == [None, "prepare_error", "null_input", None]
    assert "no # here" in scored.errors[1]
    assert runner.raw_inputs(prepared, scored)[1] == "bad # room"
    assert prepared.keys == ["1", "2", "3", "4"]
    alone = score_prompts(["good food", "slow"], head, BatchPolicy(1024, 256))
    assert [scored.outputs[i].token_ids for i in (0, 3)] == [o.token_ids for o in alone.outputs]


def test_a_json_text_cut_or_not_json_is_dead_lettered_never_published(causal_dir):
    """Issue 65: a ``json_schema`` row cut at ``max_new_tokens`` is ``json_incomplete`` and one a ``stop`` string cut
    short is ``json_invalid``, each with its text kept whole in the error; the rows that completed are published."""
    prompts = reviews(4, seed=6)
    cut = score_prompts(
        prompts, load(causal_dir, max_new_tokens=3, json_schema=json.dumps(SCHEMA)), BatchPolicy(100_000, 256)
    )
    free = score_prompts(
        prompts, load(causal_dir, max_new_tokens=80, json_schema=json.dumps(SCHEMA)), BatchPolicy(100_000, 256)
    )
    assert cut.reasons == ["json_incomplete"] * 4 and free.ok.all()
    for error, whole in zip(cut.errors, free.outputs):  # greedy: the cut text is the start of the whole one
        head, _, text = error.partition("; the cut text: ")
        assert head == "the text reached max_new_tokens (3 tokens) before its JSON was complete"
        assert text and whole.text.startswith(text)
    stopped = score_prompts(
        prompts,
        load(causal_dir, max_new_tokens=80, json_schema=json.dumps(SCHEMA), stop=(",",)),
        BatchPolicy(100_000, 256),
    )
    assert set(stopped.reasons) == {"json_invalid"}
    assert all(e.startswith("the text is not JSON valid against generate.json_schema: ") for e in stopped.errors)
