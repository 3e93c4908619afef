"""The ``transcribe`` head: a recording -> its text, as ``transformers.pipeline("automatic-speech-recognition")``
returns it for the same decoded audio, for Whisper (encoder-decoder) and CTC models (wav2vec2-style).

A recording is read in the pipeline's windows (``transcribe.chunk_length_s``, default 30 s, overlapping by the
pipeline's default stride of a sixth of that on each side; :func:`~lakescore.udfs.audio.windows`), and the windows
of many recordings are batched together by what the model reads (a Whisper window is its encoder's positions, a CTC
window its frames). Each window's output is then what the pipeline computes for it alone:

* Whisper: ``generate`` with the pipeline's generation settings (its defaults under the model's generation config),
  the windows merged by the tokenizer's ``_decode_asr``, as the pipeline's postprocessing does (the text keeps
  Whisper's leading space; ``return_timestamps`` gives the segments);
* CTC: the argmax of each frame, the window's frames trimmed to its own length first (a padded batch's extra frames
  never reach the text) and then to its stride, the windows' tokens joined and decoded as the pipeline decodes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lakescore.schemas.reasons import RowFailure
from lakescore.udfs.audio import (
    SEGMENT_TYPE,
    AudioHeader,
    Decoded,
    Transcript,
    Window,
    decode_audio,
    preflight_audio,
    read_audio_header,
    transcript_columns,
    windows,
)
from lakescore.udfs.models.backends import ModelKind, load_torch_model
from lakescore.udfs.models.model_source import (
    ModelSpec,
    UnfitModelError,
    refuse_pickle_weights,
    require_directory,
)
from lakescore.udfs.options.transcribe import TranscribeOptions

__all__ = [
    "Transcriber",
    "WhisperTranscriber",
    "CtcTranscriber",
    "load_transcriber",
    "SEQ2SEQ",
    "CTC",
    "SEGMENT_TYPE",
]

SEQ2SEQ = ModelKind("AutoModelForSpeechSeq2Seq", "sequences")
CTC = ModelKind("AutoModelForCTC", "logits")


class Transcriber:
    """What both architectures share: the model's processor settings, the windows a recording is read in, and the
    output columns. A subclass adds :meth:`features` (a batch of windows as the model takes them), :meth:`forward`
    (one output per window) and :meth:`assemble` (a recording's window outputs -> text and segments)."""

    def __init__(self, model: Any, tokenizer: Any, feature_extractor: Any, options: TranscribeOptions) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.options = options
        self.sampling_rate = int(feature_extractor.sampling_rate)
        align = self.align_to
        rate = self.sampling_rate
        chunk_s, stride_s = options.window_s(self.model_window_s)
        # the pipeline's arithmetic (preprocess): lengths in samples, rounded to whole model outputs
        self.chunk = int(round(chunk_s * rate / align) * align)
        self.stride = int(round(stride_s * rate / align) * align) if chunk_s else 0
        self.chunk_length_s = chunk_s

    @property
    def model_window_s(self) -> float:
        """The seconds of audio the model reads at once by design (the default window)."""
        return 30.0

    @property
    def align_to(self) -> int:
        """Samples per model output (a CTC frame), 1 where the model has no such ratio."""
        return int(getattr(self.model.config, "inputs_to_logits_ratio", 1))

    @property
    def device(self) -> Any:
        return self.model.device

    def read_header(self, data: bytes | memoryview | None) -> AudioHeader | RowFailure:
        """A row's header alone (no sample decoded), or why it cannot be transcribed."""
        return read_audio_header(data, self.options.max_duration_s)

    def decode(self, data: bytes | memoryview | None) -> Decoded | RowFailure:
        """A row's bytes as this model hears them (mono at its sampling rate), or why not."""
        return decode_audio(data, self.sampling_rate, self.options.max_duration_s)

    def windows(self, samples: int) -> list[Window]:
        return list(windows(samples, self.chunk, self.stride, self.stride))

    def window_cost(self, window: Window) -> int:
        """What one window costs against the batch budget, in the model's positions."""
        raise NotImplementedError

    def batch_key(self, window: Window) -> int:
        """Windows that may share a batch have one key (every window, unless a subclass says otherwise)."""
        return 0

    def features(self, pieces: Sequence[np.ndarray]) -> dict[str, Any]:
        raise NotImplementedError

    def forward(self, features: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError

    def assemble(self, outputs: Sequence[Any], windows: Sequence[Window]) -> tuple[str, list | None]:
        raise NotImplementedError

    def transcribe(self, decoded: Decoded) -> Transcript:
        """One recording alone, window by window (the preflight's and the tests' way)."""
        cut = self.windows(len(decoded.samples))
        outputs = [self.forward(self.features([decoded.samples[w.start : w.end]]))[0] for w in cut]
        text, segments = self.assemble(outputs, cut)
        return Transcript(text, segments, decoded.duration_s, decoded.sample_rate)

    def score(self, values: Sequence[bytes]) -> np.ndarray:
        """A few encoded recordings transcribed (the executors' preflight); ``ValueError`` for one that does not
        decode."""
        out = np.empty(len(values), dtype=object)
        for i, data in enumerate(values):
            decoded = self.decode(data)
            if isinstance(decoded, RowFailure):
                raise ValueError(f"{decoded.reason}: {decoded.error}")
            out[i] = self.transcribe(decoded)
        return out

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple[pa.Array, ...]:
        """``text``, ``duration_s``, ``sample_rate`` and (with ``return_timestamps``) ``segments``; null where not
        ``ok``."""
        return transcript_columns(outputs, ok, self.options.return_timestamps)


class WhisperTranscriber(Transcriber):
    """Whisper: 30-second log-mel windows, ``generate`` over a batch of them."""

    def __init__(self, model: Any, tokenizer: Any, feature_extractor: Any, options: TranscribeOptions) -> None:
        super().__init__(model, tokenizer, feature_extractor, options)
        self.timestamps = options.return_timestamps or bool(getattr(model.generation_config, "return_timestamps", 0))
        self.generate_kwargs = pipeline_generate_kwargs(model, tokenizer, options, self.timestamps)
        # Whisper's generate with no language set runs the encoder twice over each window: once to detect the
        # language, once to transcribe. Handed the encoder's outputs, it runs it for neither: the same numbers, once.
        # A no-speech threshold's check reruns the model on the features themselves: such a model gets those.
        self.encode_once = getattr(model.generation_config, "no_speech_threshold", None) is None
        # beam search's own cache, but for the cross-attention that every beam of a window shares
        # (lakescore.udfs.heads.whisper_cache): where generate makes one cache per call and runs once per window (no
        # timestamps: with them a window may be decoded again from its last timestamp, into the same cache)
        config = model.generation_config
        beams = self.generate_kwargs.get("num_beams", config.num_beams) or 1
        self.shares_cross_attention = (
            beams > 1 and not self.timestamps and config.cache_implementation is None and config.use_cache is not False
        )

    @property
    def model_window_s(self) -> float:
        return float(self.feature_extractor.chunk_length)

    def window_cost(self, window: Window) -> int:
        # every window is padded to the feature extractor's 30 s: the encoder reads all its positions
        return int(self.model.config.max_source_positions)

    def features(self, pieces: Sequence[np.ndarray]) -> dict[str, Any]:
        import torch

        parts = [
            self.feature_extractor(
                piece, sampling_rate=self.sampling_rate, return_tensors="pt", return_attention_mask=True
            )
            for piece in pieces
        ]
        return {name: torch.cat([p[name] for p in parts]) for name in ("input_features", "attention_mask")}

    def forward(self, features: dict[str, Any]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            windows = features["input_features"].to(self.device, self.model.dtype)
            inputs = (
                {"encoder_outputs": self.model.get_encoder()(windows)}
                if self.encode_once
                else {"input_features": windows}
            )
            if self.shares_cross_attention:
                from lakescore.udfs.heads.whisper_cache import beam_search_cache

                inputs["past_key_values"] = beam_search_cache(self.model.config, len(windows))
            tokens = self.model.generate(
                **inputs, attention_mask=features["attention_mask"].to(self.device), **self.generate_kwargs
            )
        if isinstance(tokens, dict) and "sequences" in tokens:
            tokens = tokens["sequences"]
        tokens = tokens.cpu()
        out = np.empty(len(tokens), dtype=object)
        for i in range(len(tokens)):
            out[i] = _own_tokens(tokens[i], self.model.generation_config.pad_token_id)
        return out

    def assemble(self, outputs: Sequence[Any], windows: Sequence[Window]) -> tuple[str, list | None]:
        rate = self.sampling_rate
        pieces = [
            {
                "tokens": tokens[None, :],
                **({"stride": (w.length / rate, w.left / rate, w.right / rate)} if self.chunk else {}),
            }
            for tokens, w in zip(outputs, windows)
        ]
        precision = self.feature_extractor.chunk_length / self.model.config.max_source_positions
        text, optional = self.tokenizer._decode_asr(
            pieces, return_timestamps=self.timestamps, return_language=None, time_precision=precision
        )
        return text, _segments(optional.get("chunks")) if self.options.return_timestamps else None


def _own_tokens(tokens: Any, pad: int | None) -> Any:
    """A generated row without the padding a batch adds after its end: ``generate`` pads a finished row with the pad
    token (Whisper's is its end-of-text token) until the batch's longest row ends; its own end-of-text is kept."""
    if pad is None:
        return tokens
    end = len(tokens)
    while end > 1 and int(tokens[end - 1]) == pad and int(tokens[end - 2]) == pad:
        end -= 1
    return tokens[:end]


def pipeline_generate_kwargs(model: Any, tokenizer: Any, options: TranscribeOptions, timestamps: bool) -> dict:
    """The ``generate`` settings the ASR pipeline calls Whisper with: the language and task asked, timestamps, and the
    pipeline's own defaults (its ``_default_generation_config``, the tokenizer's pad token) for what neither these
    nor the model's generation config set."""
    from transformers.pipelines.automatic_speech_recognition import AutomaticSpeechRecognitionPipeline

    asked: dict[str, Any] = {}
    if options.language is not None:
        asked["language"] = options.language
    if options.language is not None or options.whisper_task != "transcribe":
        asked["task"] = options.whisper_task
    if options.max_window_tokens is not None:
        asked["max_new_tokens"] = options.max_window_tokens
    if timestamps:
        asked["return_timestamps"] = True
    defaults = AutomaticSpeechRecognitionPipeline._default_generation_config.to_diff_dict()
    defaults.pop("transformers_version", None)
    if tokenizer.pad_token_id is not None:
        defaults["pad_token_id"] = tokenizer.pad_token_id
    set_params = {**model.generation_config.to_diff_dict(), **asked}
    added = {
        key: value
        for key, value in defaults.items()
        if key not in set_params and not (key == "max_new_tokens" and "max_length" in set_params)
    }
    return {**asked, **added}


def _segments(chunks: list[dict] | None) -> list[tuple[float | None, float | None, str]]:
    # the pipeline gives no times, (None, None), to text that follows a segment's closing timestamp with no opening one
    out = []
    for chunk in chunks or ():
        start, end = chunk["timestamp"]
        out.append((None if start is None else float(start), None if end is None else float(end), chunk["text"]))
    return out


class CtcTranscriber(Transcriber):
    """A CTC model: each window's frames' argmax, trimmed to the window's own frames and its stride."""

    def __init__(self, model: Any, tokenizer: Any, feature_extractor: Any, options: TranscribeOptions) -> None:
        super().__init__(model, tokenizer, feature_extractor, options)
        self.masked = bool(getattr(feature_extractor, "return_attention_mask", False))

    def window_cost(self, window: Window) -> int:
        return max(1, -(-window.length // self.align_to))

    def batch_key(self, window: Window) -> int:
        """Windows that may share a batch have one key: any length where the model reads an attention mask, else
        only equal lengths (a model without one would read the padding as sound)."""
        return 0 if self.masked else window.length

    def features(self, pieces: Sequence[np.ndarray]) -> dict[str, Any]:
        import torch

        parts = [
            self.feature_extractor(
                piece, sampling_rate=self.sampling_rate, return_tensors="np", return_attention_mask=True
            )
            for piece in pieces
        ]
        width = max(p["input_values"].shape[1] for p in parts)
        values = np.zeros((len(parts), width), dtype=np.float32)
        mask = np.zeros((len(parts), width), dtype=np.int64)
        for i, p in enumerate(parts):
            n = p["input_values"].shape[1]
            values[i, :n] = p["input_values"][0]
            mask[i, :n] = 1
        lengths = torch.as_tensor([len(piece) for piece in pieces])
        return {"input_values": torch.from_numpy(values), "attention_mask": torch.from_numpy(mask), "lengths": lengths}

    def forward(self, features: dict[str, Any]) -> np.ndarray:
        import torch

        inputs = {"input_values": features["input_values"].to(self.device, self.model.dtype)}
        if self.masked:
            inputs["attention_mask"] = features["attention_mask"].to(self.device)
        with torch.inference_mode():
            tokens = self.model(**inputs).logits.argmax(dim=-1).cpu()
        frames = self.model._get_feat_extract_output_lengths(features["lengths"])
        out = np.empty(len(tokens), dtype=object)
        for i in range(len(tokens)):
            out[i] = tokens[i, : int(frames[i])].numpy()  # the row's own frames: never a padded one
        return out

    def assemble(self, outputs: Sequence[Any], windows: Sequence[Window]) -> tuple[str, list | None]:
        from transformers.pipelines.automatic_speech_recognition import rescale_stride

        kept = []
        for tokens, w in zip(outputs, windows):
            total, left, right = rescale_stride([(w.length, w.left, w.right)], 1 / self.align_to)[0]
            kept.append(tokens[left : total - right] if self.chunk else tokens)
        items = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        text = self.tokenizer.decode(items, skip_special_tokens=False)
        if not self.options.return_timestamps:
            return text, None
        offsets = self.tokenizer.decode(items, skip_special_tokens=False, output_char_offsets=True)["char_offsets"]
        words = self.tokenizer._get_word_offsets(offsets, self.tokenizer.replace_word_delimiter_char)
        align, rate = self.align_to, self.sampling_rate  # frames -> seconds as the pipeline computes them
        return text, [(w["start_offset"] * align / rate, w["end_offset"] * align / rate, w["word"]) for w in words]


def load_transcriber(spec: ModelSpec, model_dir: Path) -> Transcriber:
    """The speech model in ``model_dir`` with its tokenizer and feature extractor, as the ASR pipeline loads them:
    Whisper (``AutoModelForSpeechSeq2Seq``, ``model_type`` ``whisper``) or a CTC model (``AutoModelForCTC``).

    Raises :class:`~lakescore.udfs.models.model_source.UnfitModelError` for another architecture."""
    import json

    from transformers import AutoFeatureExtractor, AutoTokenizer

    require_directory(model_dir, spec.task)
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    architectures = " ".join(config.get("architectures") or ())
    options = spec.transcribe or TranscribeOptions()
    head: type[Transcriber]
    if config.get("model_type") == "whisper":
        kind, head = SEQ2SEQ, WhisperTranscriber
    elif "ForCTC" in architectures:
        kind, head = CTC, CtcTranscriber
    else:
        raise UnfitModelError(
            f"task {spec.task}: {model_dir} is a {config.get('model_type') or 'model'} "
            f"({architectures or 'no class'}); "
            "transcribe reads Whisper models and CTC models (wav2vec2-style, ...ForCTC)"
        )
    if head is CtcTranscriber and (options.language is not None or options.whisper_task != "transcribe"):
        raise UnfitModelError(
            f"task {spec.task}: transcribe.language and transcribe.whisper_task are Whisper's; "
            f"{model_dir} is a CTC model"
        )
    model = load_torch_model(spec, model_dir, kind)
    tokenizer = AutoTokenizer.from_pretrained(
        str(model_dir), local_files_only=True, trust_remote_code=spec.trust_remote_code
    )
    extractor = AutoFeatureExtractor.from_pretrained(
        str(model_dir), local_files_only=True, trust_remote_code=spec.trust_remote_code
    )
    return head(model, tokenizer, extractor, options)


def preflight_sample(rows: int = 1) -> list[bytes]:
    """``rows`` copies of a second of audio, what an executor's preflight transcribes."""
    return [preflight_audio()] * rows
