"""Generate over images: the in-process head against transformers' own ``model.generate`` run by hand with the
processor, for two architectures that handle images differently (LLaVA: a fixed run of image tokens from a CLIP
tower; Idefics3, SmolVLM's: pixel-shuffled tokens between marker tokens, tiles by image size), built tiny with random
weights here (:mod:`tests.tiny_vlms`), and scored through the real runner and batching core."""

import functools
import json

import jsonschema
import pyarrow as pa
import pytest
import transformers

from lakescore.udfs.batching import AdaptiveBudget, BatchPolicy, plan_batches
from lakescore.udfs.heads.image_prompts import chat_messages, load_image_prompt_generator, require_vision_language
from lakescore.udfs.models.model_source import ModelSpec, UnfitModelError
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.runners import ImagePromptRunner
from tests.tiny_generators import CHAT_TEMPLATE, save_causal, train_tokenizer
from tests.tiny_vision import encoded, picture
from tests.tiny_vlms import tiny_idefics3, tiny_llava

PROMPTS = ["Describe the film.", "a", "is the food good or bad?", "price", "what would the staff say about it?", "ok"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["llava", "idefics3"])
def vlm_dir(request, tmp_path_factory):
    build = {"llava": tiny_llava, "idefics3": lambda d: tiny_idefics3(d, splitting=True)}[request.param]
    return build(tmp_path_factory.mktemp(request.param))


def load(model_dir, **options):
    return load_image_prompt_generator(
        ModelSpec("generate", str(model_dir), generate=GenerateOptions(**options)), model_dir
    )


def batch_of(images, prompts, keys=None):
    return pa.RecordBatch.from_pydict(
        {
            "image": pa.array(images, pa.binary()),
            "prompt": prompts,
            "id": keys or [f"k{i}" for i in range(len(prompts))],
        }
    )


def pictures():
    """Pictures of several sizes: the Idefics3 processor cuts the bigger ones into more tiles (more image tokens)."""
    return [picture(24 + 13 * i, 20 + 9 * (i % 3), i) for i in range(len(PROMPTS))]


@functools.lru_cache(maxsize=2)
def by_hand(model_dir):
    """The processor and the model as transformers loads them, without lakescore."""
    return (
        transformers.AutoProcessor.from_pretrained(model_dir),
        transformers.AutoModelForImageTextToText.from_pretrained(model_dir).eval(),
    )


def reference(model_dir, image, prompt, **generate):
    """transformers' greedy ``generate`` on one row, its inputs from the processor's own chat template call."""
    processor, model = by_hand(model_dir)
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": prompt}]}]
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    out = model.generate(**inputs, do_sample=False, **generate)
    return out[0, inputs["input_ids"].shape[1] :].tolist(), int(inputs["input_ids"].shape[1])


def test_greedy_equals_transformers_generate_per_row_through_batches(vlm_dir):
    head = load(vlm_dir, max_new_tokens=8)
    images = pictures()
    runner = ImagePromptRunner(head, ["image", "prompt"], key_col="id")
    prepared = runner.prepare(batch_of([encoded(im, "PNG") for im in images], PROMPTS))
    policy = BatchPolicy(3 * 70, 64)
    assert len(plan_batches(runner.row_costs(prepared), policy)) >= 2  # batches of several rows, left-padded
    scored = runner.score(prepared, AdaptiveBudget(policy))
    assert scored.ok.all(), scored.errors
    for image, prompt, out in zip(images, PROMPTS, scored.outputs):
        expected, prompt_tokens = reference(vlm_dir, image, prompt, max_new_tokens=8)
        assert list(out.token_ids) == expected
        assert out.prompt_tokens == prompt_tokens  # the image's tokens as the processor expands them, then the prompt's


def test_a_row_costs_its_image_tokens_prompt_and_new_tokens(vlm_dir):
    """The token budget (and ``lakescore plan``) counts what the processor makes of the image."""
    head = load(vlm_dir, max_new_tokens=5)
    images = pictures()[:3]
    runner = ImagePromptRunner(head, ["image", "prompt"])
    costs = runner.row_costs(runner.prepare(batch_of([encoded(im, "PNG") for im in images], PROMPTS[:3])))
    expected = [reference_length(vlm_dir, im, p) + 5 for im, p in zip(images, PROMPTS[:3])]
    assert costs.tolist() == expected
    if "idefics3" in str(vlm_dir):  # its processor tiles a bigger image: more image tokens
        assert len({c - len(p) for c, p in zip(costs.tolist(), PROMPTS[:3])}) > 1


def reference_length(model_dir, image, prompt):
    processor = by_hand(model_dir)[0]
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": prompt}]}]
    return len(
        processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ][0]
    )


def test_bad_empty_and_huge_images_fail_alone_with_their_reason(vlm_dir):
    head = load(vlm_dir, max_new_tokens=4)
    good = encoded(picture(32, 32, 1), "PNG")
    truncated = encoded(picture(64, 64, 2), "PNG")[:200]
    huge = encoded(picture(200, 200, 3), "PNG")
    values = [good, b"not an image", b"", huge, None, truncated, good]
    prompts = ["a", "b", "c", "d", "e", "f", None]
    runner = ImagePromptRunner(head, ["image", "prompt"], max_image_pixels=100 * 100)
    prepared = runner.prepare(batch_of(values, prompts))
    scored = runner.score(prepared, AdaptiveBudget(BatchPolicy(4096, 64)))
    assert scored.reasons == [
        None,
        "invalid_image",
        "null_input",
        "image_too_large",
        "null_input",
        "invalid_image",
        "null_input",
    ]
    assert "200x200 = 40000 pixels, above the limit of 10000" in scored.errors[3]
    raw = runner.raw_inputs(prepared, scored)
    assert raw[0] is None and raw[2] == "0 bytes" and raw[3].startswith("PNG RGB 200x200")
    assert scored.outputs[0].completion_tokens >= 1


def test_sampling_and_choices_behave_as_for_text(vlm_dir):
    image = encoded(picture(30, 30, 4), "PNG")
    sampled = load(vlm_dir, max_new_tokens=6, temperature=1.0, seed=3)
    runner = ImagePromptRunner(sampled, ["image", "prompt"], key_col="id")
    alone = runner.score(runner.prepare(batch_of([image], ["x"], ["row-7"])), AdaptiveBudget(BatchPolicy(4096, 64)))
    mixed = runner.score(
        runner.prepare(batch_of([image, image, image], ["longer prompt here", "x", "y"], ["a", "row-7", "b"])),
        AdaptiveBudget(BatchPolicy(4096, 64)),
    )
    assert alone.outputs[0].token_ids == mixed.outputs[1].token_ids  # a row's draws follow its key, not its batch
    choosing = load(vlm_dir, choices=["good", "bad"])
    runner = ImagePromptRunner(choosing, ["image", "prompt"])
    scored = runner.score(
        runner.prepare(batch_of([image, image], ["is it good?", "is it bad?"])), AdaptiveBudget(BatchPolicy(4096, 64))
    )
    assert [o.finish_reason for o in scored.outputs] == ["choice", "choice"]
    assert all(o.text in ("good", "bad") and len(o.choice_logprobs) == 2 for o in scored.outputs)
    schema = {
        "type": "object",
        "properties": {"label": {"type": "string"}, "stars": {"type": "integer"}},
        "required": ["label", "stars"],
    }
    shaped = load(vlm_dir, max_new_tokens=40, json_schema=json.dumps(schema))
    runner = ImagePromptRunner(shaped, ["image", "prompt"])
    scored = runner.score(
        runner.prepare(batch_of([image, image], ["the label?", "stars?"])), AdaptiveBudget(BatchPolicy(4096, 64))
    )
    assert set(scored.reasons) <= {None, "json_incomplete"} and scored.ok.any(), scored.errors
    for out, ok, error in zip(scored.outputs, scored.ok, scored.errors):
        if ok:  # complete JSON; a row cut by max_new_tokens is dead-lettered with its cut text, as for text
            assert out.finish_reason == "stop"
            jsonschema.validate(json.loads(out.text), schema)
        else:
            assert error.startswith(
                "the text reached max_new_tokens (40 tokens) before its JSON was complete; the cut text: {"
            )


def test_the_chat_puts_the_image_part_then_the_prompt_in_one_user_message():
    assert chat_messages("Caption it.", "Be brief.") == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Caption it."}]},
    ]
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}  # what a remote head sends
    assert chat_messages("Caption it.", image_part=part)[0]["content"][0] == part


def test_a_language_model_that_reads_no_images_is_refused_in_one_line(tmp_path):
    tokenizer = train_tokenizer("bos")
    tokenizer.chat_template = CHAT_TEMPLATE
    model_dir = save_causal(tmp_path / "llama", tokenizer)
    with pytest.raises(UnfitModelError) as refused:
        load(model_dir)
    message = str(refused.value)
    assert "\n" not in message and "not a vision-language model" in message and "llama" in message
    require_vision_language({"model_type": "llava"}, tmp_path)  # a vision-language model passes


def test_image_col_makes_generate_read_images_with_a_prompt_it_requires():
    from lakescore.jobs.config import ConfigError, load_config
    from lakescore.jobs.steps.read import model_spec

    flags = {
        "task": "generate",
        "input": "shop.products",
        "output": "shop.captions",
        "id_col": "sku",
        "model.source": "/models/vlm",
        "image_col": "photo",
        "scoring.max_image_pixels": 10_000,
    }
    cfg = load_config(flags={**flags, "generate.prompt_template": "Caption the {category}."})
    cfg.require_for_scoring()
    assert cfg.input_kind.prompted and cfg.prompt_template == "Caption the {category}."
    assert (
        model_spec(cfg).input_kind == "image"
        and model_spec(load_config(flags={**flags, "image_col": None, "scoring.max_image_pixels": None})).input_kind
        is None
    )
    with pytest.raises(ConfigError, match="generate.prompt_template"):
        load_config(flags=flags).require_for_scoring()
    endpoint = {
        "generate.prompt_template": "x",
        "generate.endpoint.url": "http://localhost:1/v1",
        "generate.endpoint.model": "m",
    }
    with pytest.raises(
        ConfigError, match="image_col with generate.endpoint.api completions: .* set generate.endpoint.api: chat"
    ):
        load_config(flags={**flags, **endpoint})
    with pytest.raises(ConfigError, match="image_col with generate.server.api completions"):
        load_config(flags={**flags, "generate.prompt_template": "x", "generate.server.engine": "vllm"})
    load_config(
        flags={**flags, **endpoint, "generate.endpoint.api": "chat"}
    ).require_for_scoring()  # images go as chat parts
    with pytest.raises(ConfigError, match="scoring.max_image_pixels applies"):  # text prompts read no images
        load_config(flags={**flags, "image_col": None, "text_col": "body"})


def test_a_session_built_for_an_image_run_reads_its_tables_in_small_batches():
    # Spark's vectorized reader reserves a whole batch of the image column at once: 4,096 rows of pictures written as
    # one row group killed a local driver's 1 GiB heap (bench/SITTINGS.md, W10 at 1,500 images)
    from lakescore.jobs.config import load_config
    from lakescore.jobs.steps.read import IMAGE_READER_BATCH_ROWS, session_defaults

    base = {"input": "shop.products", "output": "shop.out", "id_col": "sku", "model.source": "/m"}
    for flags in (
        {"task": "generate", "image_col": "photo", "generate.prompt_template": "Caption it."},
        {"task": "image_classify", "image_col": "photo"},
    ):
        defaults = session_defaults(load_config(flags={**base, **flags}))
        assert defaults["spark.sql.parquet.columnarReaderBatchSize"] == str(IMAGE_READER_BATCH_ROWS)
        assert defaults["spark.sql.orc.columnarReaderBatchSize"] == str(IMAGE_READER_BATCH_ROWS)
    assert (
        session_defaults(load_config(flags={**base, "task": "embed", "text_col": "body"})) == {}
    )  # texts: Spark's own
