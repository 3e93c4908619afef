"""Tiny seeded speech models and synthetic recordings for tests, built offline: a Whisper (encoder-decoder, its
byte-level BPE tokenizer trained here with Whisper's special and timestamp tokens; weights set by hand so that its text
follows the audio) and a random-weight wav2vec2 CTC model (a character vocabulary), and recordings synthesised as tones
and noise in any format libsndfile writes."""

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
"""Tokens a tiny Whisper window generates at most (its generation config's ``max_length``; Whisper's ``generate``
counts them after the prompt): a window the recording fills ends there, one it leaves padded where the padding
starts."""


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
    """A tiny seeded Whisper in ``target`` (80 mel bins, windows of ``window_s``) whose text follows what it hears
    (:func:`_listen`): model, tokenizer, feature extractor and generation config, as
    ``pipeline("automatic-speech-recognition")`` loads them. ``num_beams`` set in
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
    feature_extractor = WhisperFeatureExtractor(feature_size=80, chunk_length=window_s)
    printable = [i for token, i in bpe["vocab"].items() if _printable(tokenizer.convert_tokens_to_string([token]))]
    timestamp_ids = tokenizer.convert_tokens_to_ids(timestamps)
    with torch.no_grad():
        _listen(model, feature_extractor, printable, timestamp_ids, ids, eot, window_s, max_length, seed)
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
    feature_extractor.save_pretrained(target)
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


# The hand-set Whisper's residual stream: its first dimensions carry time and control, every one after them what was
# heard. Time is three phases (cos a, cos(a - 2pi/3), cos(a + 2pi/3)), which sum to 0 at every angle, and each control
# a (+x, -x) pair: both are read by weights that sum to 0, so a LayerNorm's mean never reaches them.
_TIME = [0, 1, 2]
_SILENCE = 3
"""Encoder: how far the frame is the feature extractor's padding (the window past the recording's end)."""
_HEARD_ENCODER = 4
_GATE = [3, 4]
"""Decoder: open at the window's last step, whose token is then the timestamp closing its segment."""
_MARK = [5, 6]
"""Decoder: set only by ``<|notimestamps|>``'s embedding; the self-attention finds it and shuts the gate."""
_END = [7, 8]
"""Decoder: how much of the step's stretch was padding; ``<|endoftext|>`` reads it."""
_HEARD_DECODER = 9
_ENCODER_TIME = 100.0
_DECODER_TIME = 10.0
"""Time codes far above what is added to them before the norm that reads them, so that it divides every frame and
every step by about as much."""
_HEARD = 10 * _DECODER_TIME
"""What a step heard, far above the time code at the output's norm: the text's logits then depend on what it heard,
not on how loud it was."""
_TIMESTAMP_LOGIT, _GATE_LOGIT, _END_LOGIT, _TEXT_LOGIT_STD = 100.0, 200.0, 100.0, 6.0
_GRID = 0.02
"""Seconds between Whisper's timestamp tokens (and between its encoder's frames)."""


def _phases(angle):
    import torch

    return torch.cos(angle[..., None] + torch.tensor([0.0, -2 * np.pi / 3, 2 * np.pi / 3], dtype=angle.dtype))


def _listen(model, feature_extractor, printable, timestamp_ids, ids, eot, window_s, max_length, seed) -> None:
    """Sets a random Whisper's weights by hand so that it writes what it hears. Decoder step ``t`` attends to the
    ``t``-th stretch of its window (cross-attention keyed by time: the encoder's sinusoids and the decoder's positions
    replaced by time codes) and writes the text token nearest what the encoder heard there (random projections of the
    log-mel, less a typical window's mean), so every recording, and every window of a long one, has its own text; a
    stretch of padding writes ``<|endoftext|>``. With timestamps the first token is ``<|0.00|>`` (the pipeline forces
    a timestamp there and the step reads the window's start) and the last step opens a gate through which the
    timestamp of where it reads wins, closing the segment; no segment closes inside a window (``generate`` would then
    decode the rest of it again). ``<|notimestamps|>`` in the prompt shuts the gate. The tokens before a step and the
    language change nothing."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=generator)

    config = model.config
    width, frames, positions = config.d_model, config.max_source_positions, config.max_target_positions
    read = torch.tensor([[2 / 3, -1 / 3, -1 / 3], [0.0, 3**-0.5, -(3**-0.5)]])  # (cos a, sin a) of the phases
    encoder, decoder = model.model.encoder, model.model.decoder
    heard_e, heard_d = slice(_HEARD_ENCODER, None), slice(_HEARD_DECODER, None)
    first = decoder.layers[0]
    cross = first.encoder_attn

    # Encoder: random convolutions hear, one channel hears the padding (the mean log-mel of the bins under 2.5 kHz at
    # the feature extractor's floor rather than a sound's level), the time code takes its own dimensions and no layer
    # writes into those.
    for conv, fan_in in ((encoder.conv1, 3 * config.num_mel_bins), (encoder.conv2, 3 * width)):
        conv.weight.copy_(randn(*conv.weight.shape) * fan_in**-0.5)
        conv.bias.zero_()
    encoder.conv1.weight[:_HEARD_ENCODER] = 0
    encoder.conv2.weight[:_HEARD_ENCODER] = 0
    encoder.conv2.weight[:, :_HEARD_ENCODER] = 0
    encoder.conv1.weight[_SILENCE, :48, 1] = -10 / 48
    encoder.conv2.weight[_SILENCE, _SILENCE, 1] = 1.0
    encoder.embed_positions.weight.zero_()
    encoder.embed_positions.weight[:, _TIME] = _ENCODER_TIME * _phases(np.pi * (torch.arange(frames) + 0.5) / frames)
    for layer in encoder.layers:
        for out in (layer.self_attn.out_proj, layer.fc2):
            out.weight[:_HEARD_ENCODER] = 0
            out.bias[:_HEARD_ENCODER] = 0
    norm_e = _ENCODER_TIME * (1.5 / width) ** 0.5
    encoder.layer_norm.weight.fill_(norm_e)  # what was heard back at its own scale after the norm
    encoder.layer_norm.weight[_TIME] = 1.0
    encoder.layer_norm.bias.zero_()

    # A typical window (all sound) and one half padding, as the encoder hears them.
    def features(seconds):
        return feature_extractor(recording(seconds, seed=seed), sampling_rate=16_000, return_tensors="pt")

    full, half = features(window_s), features(window_s / 2)
    heard = encoder(full["input_features"]).last_hidden_state[0, :, heard_e]
    mean, spread = heard.mean(0), (heard - heard.mean(0)).std()
    padding = encoder(half["input_features"]).last_hidden_state[0, -frames // 4 :, _SILENCE].mean()

    # Decoder positions: the stretch of the window each step reads, on the timestamps' grid, and the gate. The step at
    # position t writes token t + 1. generate writes max_length tokens after its prompt: <|startoftranscript|> and the
    # language it detects, then <|notimestamps|> or the timestamp it forces (which the step before the first stretch
    # writes: 0.00); so with timestamps the text is tokens 3 to max_length, and token max_length + 1, the step past the
    # last stretch, closes the segment at the window's end. (A language or task asked adds a token to the prompt: the
    # text starts a stretch later and the closing timestamp comes one token before the last.)
    steps = max_length - 2
    grid = round(window_s / _GRID)
    half_stretch = max(1, round(grid / (2 * steps)))
    stretch = (torch.arange(positions) - 2).clamp(0, steps)
    start = torch.round(stretch * grid / steps)
    token = torch.arange(positions) + 1
    gate = torch.where(token == max_length + 1, 0.5, -1.0)
    decoder.embed_positions.weight.zero_()
    decoder.embed_positions.weight[:, _TIME] = _DECODER_TIME * _phases(np.pi * (start + half_stretch) / grid)
    decoder.embed_positions.weight[:, _GATE] = torch.stack([gate, -gate], 1)

    # Tokens (the output is tied to them): text tokens point somewhere in what can be heard, a timestamp at the
    # stretch starting at its time (its logit peaks where a step reads, exactly on the grid) and through the gate;
    # <|endoftext|> at the padding; the rest near 0.
    embeddings = decoder.embed_tokens.weight
    heard_tokens = randn(embeddings.shape[0], width - _HEARD_DECODER) * 0.02
    heard_tokens -= heard_tokens.mean(1, keepdim=True)
    weight = torch.full((embeddings.shape[0],), 0.05)
    weight[printable] = 1.0
    embeddings.zero_()
    embeddings[:, heard_d] = heard_tokens * weight[:, None]
    stamps = torch.tensor(timestamp_ids)
    embeddings[stamps] = 0
    small = 0.01  # a timestamp read back as a step's input barely moves its time code
    inside = torch.arange(len(stamps)) <= grid
    embeddings[stamps[inside][:, None], _TIME] = small * _phases(np.pi * (torch.arange(grid + 1) + half_stretch) / grid)
    embeddings[stamps[:, None], _GATE] = torch.tensor([small, -small])
    embeddings[eot] = 0
    embeddings[eot, _END] = torch.tensor([1.0, -1.0])
    marker = ids["<|notimestamps|>"]
    embeddings[marker, _MARK] = torch.tensor([1.0, -1.0])

    for layer in decoder.layers:
        for attention in (layer.self_attn, layer.encoder_attn):
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
                projection.weight.zero_()
                if projection.bias is not None:
                    projection.bias.zero_()
        layer.fc2.weight.zero_()
        layer.fc2.bias.zero_()
    heads = config.decoder_attention_heads
    head = width // heads

    # Self-attention: every step finds <|notimestamps|> where the prompt has it (a score of 30 against 0) and shuts
    # the gate (by 2).
    norm_m = ((1.5 * _DECODER_TIME**2 + 2 + 2) / width) ** 0.5  # the norm's divisor at the marker
    attention = first.self_attn
    attention.q_proj.bias[0] = 30 * head**0.5 * norm_m / 2
    attention.k_proj.weight[0, _MARK] = torch.tensor([1.0, -1.0])
    attention.v_proj.weight[0, _MARK] = torch.tensor([norm_m, -norm_m])
    attention.out_proj.weight[_GATE, 0] = torch.tensor([-1.0, 1.0])

    # Cross-attention: step t attends to the frames of its stretch (spread over about a quarter of it) in every head;
    # value 0 carries the padding to the end signal, the others what was heard, less the typical window's mean.
    norm_d = ((1.5 * _DECODER_TIME**2 + 2) / width) ** 0.5  # the norm's divisor before the cross-attention
    sharpness = (4 * steps / np.pi) ** 2
    for h in range(heads):
        rows = slice(h * head, h * head + 2)
        cross.q_proj.weight[rows, _TIME] = read * (sharpness * head**0.5 * norm_d / _DECODER_TIME)
        cross.k_proj.weight[rows, _TIME] = read / (width / 1.5) ** 0.5
    values = randn(width - 1, width - _HEARD_ENCODER) / (spread * (width - _HEARD_ENCODER) ** 0.5)
    cross.v_proj.weight[1:, heard_e] = values
    cross.v_proj.bias[1:] = -values @ mean
    cross.v_proj.weight[0, _SILENCE] = 1.0
    out = randn(width - _HEARD_DECODER, width - 1) / width**0.5
    cross.out_proj.weight[heard_d, 1:] = out - out.mean(0, keepdim=True)

    # The output's scales, measured on the typical window: what was heard at _HEARD, then the logits as set above.
    final = decoder.layer_norm
    final.weight.fill_(1.0)
    final.bias.zero_()
    prompt = [ids["<|startoftranscript|>"], ids[f"<|{LANGUAGES[0]}|>"], ids["<|transcribe|>"], marker]
    tokens = torch.tensor([prompt + printable[: max_length - len(prompt)]])
    seen = []
    hook = final.register_forward_pre_hook(lambda _, args: seen.append(args[0][0, 3:]))
    model(input_features=full["input_features"], decoder_input_ids=tokens)
    cross.out_proj.weight[heard_d] *= _HEARD / seen[-1][:, heard_d].norm(dim=1).median()
    cross.out_proj.weight[_END, 0] = torch.tensor([1.0, -1.0]) * 3 * _HEARD / padding  # silence: 3x what is heard
    logits = model(input_features=full["input_features"], decoder_input_ids=tokens).logits[0, 3:, printable]
    hook.remove()
    norm_f = seen[-1].std(1, correction=0).median()
    final.weight[_TIME] = _TIMESTAMP_LOGIT * norm_f / (1.5 * small * _DECODER_TIME)
    final.weight[_GATE] = _GATE_LOGIT * norm_f / (2 * small)
    final.weight[_END] = _END_LOGIT / (2 * width) ** 0.5  # where the padding fills the norm alone
    final.weight[heard_d] = _TEXT_LOGIT_STD / logits.std(1).mean()
