"""Tiny seeded language models for tests, built offline: a byte-level BPE tokenizer trained in a second on synthetic
reviews, and a Llama-shaped decoder from a config, saved with ``save_pretrained``."""

import random

import torch

WORDS = (
    "the a good bad movie book film plot actor price great awful fast slow service food room hotel staff clean "
    "dirty would buy again never love hate it was is very not quite really"
).split()
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CONTEXT = 160
"""The decoder's positions: a prompt over CONTEXT - max_new_tokens tokens does not fit."""


def reviews(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) + rng.choice([".", "!", "?", ""])
        for _ in range(n)
    ]


def train_tokenizer(post: str, extra: tuple[str, ...] = ()):
    """A byte-level BPE (every byte a token, so any JSON can be spelt) with <pad>, <s>, </s>; ``post``: ``bos``
    puts <s> before a text (a decoder's), ``eos`` puts </s> after it (T5's), ``none`` adds nothing (GPT-2's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(reviews(400, seed=0) + ['{"label": "good", "stars": 3, "ok": true}'] * 20, trainer)
    bos, eos = backend.token_to_id("<s>"), backend.token_to_id("</s>")
    if post == "bos":
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    elif post == "eos":
        backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if extra:
        tokenizer.add_special_tokens({"additional_special_tokens": list(extra)})
    return tokenizer


def save_causal(target, tokenizer, vocab_size=None, hidden_size=64, heads=4, context=CONTEXT):
    """A seeded 2-layer Llama; ``hidden_size / heads`` is its head_dim (vLLM's CPU attention takes 32, 64 or 128)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=2,
        max_position_embeddings=context,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
