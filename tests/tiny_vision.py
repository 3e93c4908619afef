"""Tiny seeded vision models and generated pictures for tests, built offline: a ViT classifier and a CLIP (both towers)
from configs, saved with ``save_pretrained`` beside their image processors."""

import io

import numpy as np
import torch
import transformers
from PIL import Image

LABELS = {0: "cat", 1: "dog", 2: "fish"}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
VISION = dict(image_size=32, patch_size=8, **TINY)


def encoded(image, fmt: str, **options) -> bytes:
    """``image`` saved in format ``fmt``, as bytes."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def picture(width: int, height: int, seed: int):
    """A smooth RGB picture with a seeded random tint: it compresses like a photo and differs per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    tint = rng.uniform(0.2, 1.0, size=3)
    pixels = np.stack(
        [
            (x * 255 // max(1, width - 1)) * tint[0],
            (y * 255 // max(1, height - 1)) * tint[1],
            ((x + y) % 64) * 4 * tint[2],
        ],
        axis=-1,
    )
    noise = rng.integers(0, 24, size=pixels.shape)
    return Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8))


def vit_classifier(target, **config):
    """A seeded 3-label ViT classifier (32 x 32 pixels, patches of 8) and its processor, saved in ``target``."""
    torch.manual_seed(0)
    vit = transformers.ViTConfig(
        **VISION, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, **config
    )
    transformers.ViTForImageClassification(vit).eval().save_pretrained(target)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(target)
    return target


def tiny_clip(target):
    """A tiny CLIP: byte-level BPE tokenizer over the 256 byte symbols (plus two merges), both towers 2 layers."""
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols] + ["he", "ll"])}
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    tokenizer = transformers.CLIPTokenizer(vocab=vocab, merges=[("h", "e"), ("l", "l")], model_max_length=77)
    text = dict(
        vocab_size=len(vocab),
        max_position_embeddings=77,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
        **TINY,
    )
    torch.manual_seed(2)
    model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=VISION, projection_dim=16))
    model.eval().save_pretrained(target)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    transformers.CLIPProcessor(image_processor=processor, tokenizer=tokenizer).save_pretrained(target)
    return target
