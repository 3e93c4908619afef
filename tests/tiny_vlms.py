"""Tiny seeded vision-language models for tests, built offline: a LLaVA (CLIP vision tower, one image as a fixed run
of image tokens) and an Idefics3 (SmolVLM's architecture: the image's patches shuffled into fewer tokens between its
own marker tokens), each saved with its processor (image processor, tokenizer, chat template) so that
``AutoProcessor`` and ``AutoModelForImageTextToText`` load them from the folder. The text models take ``head_dim``
32."""

import torch
import transformers

from tests.tiny_generators import train_tokenizer

TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    initializer_range=0.2,
)
"""The language model of each: Llama, ``head_dim`` 64 / 2 = 32."""
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A chat template with image parts, as a VLM's processor carries one: ``<image>`` where the image goes."""


def _tokenizer(*extra: str):
    tokenizer = train_tokenizer("bos", ("<image>", *extra))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _text_config(tokenizer, **overrides):
    return dict(
        TEXT,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )


def tiny_llava(target):
    """A LLaVA: a 2-layer CLIP vision tower over 32 x 32 images in patches of 8 (16 image tokens), a Llama."""
    tokenizer = _tokenizer()
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    vision = dict(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=32,
    )
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**vision),
        text_config=transformers.LlamaConfig(**_text_config(tokenizer)),
        image_token_index=image_token,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    transformers.LlavaForConditionalGeneration(config).eval().save_pretrained(target)
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    transformers.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(target)
    return target


def tiny_idefics3(target, *, splitting: bool = False):
    """An Idefics3 (SmolVLM's architecture): a 2-layer SigLIP-style tower over 32 x 32 images in patches of 8, pixel
    shuffle by 2 (4 image tokens a picture), a Llama; ``splitting``: a bigger image is also cut into 32 x 32 tiles,
    so the image tokens depend on its size."""
    tokenizer = _tokenizer("<fake_token_around_image>", "<global-img>", "<end_of_utterance>")
    vision = dict(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    config = transformers.Idefics3Config(
        vision_config=vision,
        text_config=_text_config(tokenizer),
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    torch.manual_seed(1)
    transformers.Idefics3ForConditionalGeneration(config).eval().save_pretrained(target)
    images = transformers.Idefics3ImageProcessor(
        do_image_splitting=splitting,
        size={"longest_edge": 64 if splitting else 32},
        max_image_size={"longest_edge": 32},
    )
    transformers.Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=CHAT_TEMPLATE
    ).save_pretrained(target)
    return target
