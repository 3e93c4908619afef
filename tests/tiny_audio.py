"""Tiny seeded speech models and synthetic recordings for tests, built offline: a Whisper (encoder-decoder, its
byte-level BPE tokenizer trained here with Whisper's special and timestamp tokens) and a wav2vec2 CTC model (a
character vocabulary), both random-weight, and recordings synthesised as tones and noise in any format libsndfile
writes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

LANGUAGES = ("en", "de", "fr")
WHISPER_WINDOW_S = 6
"""The tiny Whisper's window (its feature extractor's ``chunk_length``; every real Whisper's is 30 s): a fifth of the
encoder's work per window, the same merging of windows."""
WHISPER_MAX_LENGTH = 12
"""Tokens a tiny Whisper window generates at most (its generation config's ``max_length``): random weights never
stop on their own."""


def recording(seconds: float, rate: int = 16_000, seed: int = 0, channels: int = 1) -> np.ndarray:
    """``seconds`` of a seeded mix of gliding tones and noise, float32 in [-1, 1], shaped ``(samples,)`` or
    ``(samples, channels)``."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate), dtype=np.float64) / rate
    glide = 200 + 150 * np.sin(2 * np.pi * t / max(seconds, 1.0) * (1 + seed % 3))
    wave = 0.4 * np.sin(2 * np.pi * np.cumsum(glide) / rate) + 0.05 * rng.standard_normal(len(t))
    wave = wave.astype(np.float32)
    if channels == 1:
        return wave
    return np.stack([wave * (1 - 0.2 * c) for c in range(channels)], axis=1)


def encoded(samples: np.ndarray, rate: int = 16_000, fmt: str = "WAV") -> bytes:
    """``samples`` written as a file of ``fmt`` (``WAV``, ``FLAC``, ``OGG``, ``MP3``)."""
    import soundfile

    subtype = {"WAV": "PCM_16", "FLAC": "PCM_16", "OGG": "VORBIS", "MP3": "MPEG_LAYER_III"}[fmt]
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def _byte_bpe(words: list[str], vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    backend.train_from_iterator(words, trainer)
    return backend


def save_whisper(
    target: Path,
    seed: int = 0,
    num_beams: int | None = None,
    window_s: int = WHISPER_WINDOW_S,
    max_length: int = WHISPER_MAX_LENGTH,
    **shape: int,
) -> Path:
    """A tiny random-weight Whisper in ``target`` (80 mel bins, windows of ``window_s``): model, tokenizer, feature
    extractor and generation config, as ``pipeline("automatic-speech-recognition")`` loads them. ``num_beams`` set in
    its generation config makes a server's plain ``generate`` (``transformers serve``) search as the pipeline does
    (the pipeline adds its 5 beams only where the model's config sets none); ``shape``: ``WhisperConfig`` sizes in
    place of the tiny ones (a benchmark's larger model)."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )
    from transformers.generation import GenerationConfig

    from tests.tiny_generators import reviews

    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    bpe = json.loads(_byte_bpe(reviews(200, seed=3), 300).to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in bpe["merges"]]
    specials = [
        "<|startoftranscript|>",
        *[f"<|{code}|>" for code in LANGUAGES],
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nocaptions|>",
        "<|notimestamps|>",
    ]
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    tokenizer = WhisperTokenizer(vocab=bpe["vocab"], merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.add_tokens(timestamps)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in specials}
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(seed)
    config = WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=80,
        **{
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32,
            "d_model": 16,
            **shape,
        },
        max_source_positions=window_s * 50,
        max_target_positions=64,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    model = WhisperForConditionalGeneration(config).eval()
    with (
        torch.no_grad()
    ):  # only printable text tokens keep their embeddings (tied to the output), so random weights write
        # text: the others' logits are near 0 (timestamp tokens come mostly where Whisper's timestamp rules force them;
        # not exactly 0, which would tie them, and beam search breaks ties by position in the batch)
        printable = [i for token, i in bpe["vocab"].items() if _printable(tokenizer.convert_tokens_to_string([token]))]
        keep = torch.zeros(len(tokenizer), dtype=torch.bool)
        keep[printable] = True
        keep[eot] = False
        model.model.decoder.embed_tokens.weight[~keep] *= 0.05
    model.generation_config = GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        max_length=max_length,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        is_multilingual=True,
        lang_to_id={f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGUAGES},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        forced_decoder_ids=None,
        begin_suppress_tokens=[eot],
        suppress_tokens=[],
        prev_sot_token_id=ids["<|startofprev|>"],
        **({"num_beams": num_beams} if num_beams is not None else {}),
    )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    WhisperFeatureExtractor(feature_size=80, chunk_length=window_s).save_pretrained(target)
    return target


CTC_CHARACTERS = "abcdefghijklmnopqrstuvwxyz'"


def save_wav2vec2(target: Path, seed: int = 0) -> Path:
    """A tiny random-weight wav2vec2 CTC model in ``target`` with its character tokenizer and feature extractor (an
    attention mask, per-recording normalisation: the shape of wav2vec2-large's)."""
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC

    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4}
    vocab.update({c: 5 + i for i, c in enumerate(CTC_CHARACTERS)})
    (target / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = Wav2Vec2CTCTokenizer(str(target / "vocab.json"), word_delimiter_token="|")
    torch.manual_seed(seed)
    config = Wav2Vec2Config(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8, 8, 8, 8, 8, 8),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        pad_token_id=0,
        ctc_loss_reduction="mean",
    )
    model = Wav2Vec2ForCTC(config).eval()
    with torch.no_grad():  # spread the logits so that the argmax path emits characters, not only blanks
        model.lm_head.weight.mul_(40)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16_000, padding_value=0.0, do_normalize=True, return_attention_mask=True
    ).save_pretrained(target)
    return target


def _printable(text: str) -> bool:
    return text.isascii() and text.isprintable()
