"""Audio bytes -> one mono float32 waveform at the model's sampling rate, per row, and the windows a long recording
is transcribed in.

Decoding is libsndfile's (``soundfile``: WAV, FLAC, OGG/Vorbis, Opus, MP3, AIFF, ...), resampling soxr's (its default
high quality). Several channels are averaged, as ``transformers.pipeline("automatic-speech-recognition")`` downmixes.
A row fails alone, never its batch:

* ``null_input``: a null or empty (0-byte) value;
* ``invalid_audio``: bytes libsndfile cannot identify or decode (garbage, a truncated file, a corrupt header);
* ``empty_audio``: a file that decodes to no samples;
* ``audio_too_long``: a recording longer than the limit (``transcribe.max_duration_s``), read from the header
  before decoding, dead-lettered with its duration rather than cut;
* ``unsupported_sample_rate``: a header's sample rate outside what lakescore resamples
  (:data:`MIN_SAMPLE_RATE` to :data:`MAX_SAMPLE_RATE` Hz).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lakescore.schemas.reasons import (
    AUDIO_TOO_LONG,
    EMPTY_AUDIO,
    INVALID_AUDIO,
    NULL_INPUT,
    UNSUPPORTED_SAMPLE_RATE,
    RowFailure,
)

__all__ = [
    "MIN_SAMPLE_RATE",
    "MAX_SAMPLE_RATE",
    "AudioHeader",
    "Decoded",
    "Window",
    "Transcript",
    "SEGMENT_TYPE",
    "transcript_columns",
    "read_audio_header",
    "decode_audio",
    "describe_audio",
    "windows",
    "preflight_audio",
]

# Why soundfile + soxr rather than PyAV or torchaudio: the soundfile wheel carries libsndfile (WAV, FLAC, OGG, MP3)
# and soxr's carries libsoxr, two small native libraries with no FFmpeg build to match and no torch ABI to follow;
# both decode and resample far faster than a transcription window costs to run.
MIN_SAMPLE_RATE = 1_000
"""The lowest sample rate a recording may have: below it a header is taken as corrupt, not as speech."""
MAX_SAMPLE_RATE = 768_000
"""The highest sample rate a recording may have (the highest studio rate)."""


@dataclass(frozen=True)
class AudioHeader:
    """What a recording's header says, read without decoding its samples: its own sample rate, its frames and its
    container (libsndfile's name: ``WAV``, ``FLAC``, ``OGG``, ``MP3``, ...)."""

    sample_rate: int
    frames: int
    format: str = ""

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate


@dataclass(frozen=True)
class Decoded:
    """A decoded recording: mono float32 ``samples`` at the model's rate, the file's own ``sample_rate`` and its
    duration in seconds."""

    samples: np.ndarray
    sample_rate: int
    duration_s: float


@dataclass(frozen=True)
class Window:
    """One window of a recording as the model sees it: ``samples[start:end]``, and the samples at its left and right
    edges that overlap its neighbours (the pipeline's ``stride``: ``(end - start, left, right)``)."""

    start: int
    end: int
    left: int
    right: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Transcript:
    """One recording's outputs: its text, its segments (``(start s or None, end s or None, text)``; ``None`` unless
    timestamps were asked), its duration and its file's own sample rate."""

    text: str
    segments: Sequence[tuple[float | None, float | None, str]] | None
    duration_s: float
    sample_rate: int


SEGMENT_TYPE = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())])


def transcript_columns(outputs: np.ndarray, ok: np.ndarray, timestamps: bool) -> tuple[pa.Array, ...]:
    """The ``transcribe`` task's columns of a batch's :class:`Transcript` outputs: ``text``, ``duration_s``,
    ``sample_rate`` and, with ``timestamps``, ``segments``; null where not ``ok``. Every transcription head writes
    them here."""
    rows: list[Transcript | None] = [outputs[i] if ok[i] else None for i in range(len(ok))]
    arrays = [
        pa.array([r.text if r else None for r in rows], pa.string()),
        pa.array([r.duration_s if r else None for r in rows], pa.float64()),
        pa.array([r.sample_rate if r else None for r in rows], pa.int32()),
    ]
    if timestamps:
        segments = [
            [{"start": s, "end": e, "text": t} for s, e, t in r.segments] if r and r.segments is not None else None
            for r in rows
        ]
        arrays.append(pa.array(segments, pa.list_(SEGMENT_TYPE)))
    return tuple(arrays)


def read_audio_header(data: bytes | memoryview | None, max_duration_s: float | None) -> AudioHeader | RowFailure:
    """The header of the recording ``data`` holds, or why it cannot be transcribed (``null_input``, ``invalid_audio``,
    ``empty_audio``, ``unsupported_sample_rate``, ``audio_too_long``): only the header is read, no sample decoded."""
    import soundfile

    if data is None or not len(data):
        return RowFailure(NULL_INPUT, "no audio bytes" if data is not None else "null audio")
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as sound:
            header = AudioHeader(int(sound.samplerate), int(sound.frames), str(sound.format))
    except Exception as exc:  # libsndfile raises for unreadable bytes; the row is refused, not the batch
        return RowFailure(INVALID_AUDIO, _plain(exc))
    refused = _refused(header, max_duration_s)
    if refused is None and not header.frames:
        refused = RowFailure(EMPTY_AUDIO, "the file holds no samples")
    return refused or header


def _refused(header: AudioHeader, max_duration_s: float | None) -> RowFailure | None:
    if not MIN_SAMPLE_RATE <= header.sample_rate <= MAX_SAMPLE_RATE:
        return RowFailure(
            UNSUPPORTED_SAMPLE_RATE,
            f"sample rate {header.sample_rate} Hz, outside {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz",
        )
    if max_duration_s is not None and header.duration_s > max_duration_s:
        return RowFailure(
            AUDIO_TOO_LONG, f"{header.duration_s:.1f} s long, above transcribe.max_duration_s {max_duration_s:g} s"
        )
    return None


def decode_audio(data: bytes | memoryview | None, rate: int, max_duration_s: float | None) -> Decoded | RowFailure:
    """The recording ``data`` holds, mono at ``rate`` Hz (see the module docstring), or why not."""
    import soundfile

    if data is None or not len(data):
        return RowFailure(NULL_INPUT, "no audio bytes" if data is not None else "null audio")
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as sound:
            source_rate, frames = int(sound.samplerate), int(sound.frames)
            refused = _refused(AudioHeader(source_rate, frames), max_duration_s)
            if refused is not None:
                return refused
            samples = sound.read(dtype="float32", always_2d=True)
    except Exception as exc:  # libsndfile raises for unreadable bytes; the row is refused, not the batch
        return RowFailure(INVALID_AUDIO, _plain(exc))
    if not len(samples):
        return RowFailure(EMPTY_AUDIO, "the file holds no samples")
    mono = samples[:, 0] if samples.shape[1] == 1 else samples.mean(axis=1, dtype=np.float32)
    if source_rate != rate:
        import soxr

        mono = soxr.resample(mono, source_rate, rate)
    return Decoded(np.ascontiguousarray(mono, dtype=np.float32), source_rate, len(samples) / source_rate)


def _plain(exc: Exception) -> str:
    # libsndfile's text names the BytesIO object it read: keep what it says after that
    text = str(exc)
    if ">: " in text:
        text = text.split(">: ", 1)[1]
    return f"{type(exc).__name__}: {text}"[:2000]


def describe_audio(data: bytes | memoryview | None) -> str | None:
    """A row's recording as the errors table shows it: its byte count and SHA-256 (never the bytes); ``None`` for a
    null value."""
    if data is None:
        return None
    return f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}" if len(data) else "0 bytes"


def windows(samples: int, chunk: int, stride_left: int, stride_right: int) -> Iterator[Window]:
    """The windows a recording of ``samples`` is read in, as ``transformers.pipeline``'s ``chunk_iter`` cuts them:
    ``chunk`` samples each, consecutive ones overlapping by ``stride_left + stride_right``; the first has no left
    stride, the last no right stride, and a last window no longer than its left stride is dropped. ``chunk`` 0: the
    whole recording as one window."""
    if not chunk or samples <= 0:
        yield Window(0, samples, 0, 0)
        return
    step = chunk - stride_left - stride_right
    for start in range(0, samples, step):
        end = min(start + chunk, samples)
        last = start + chunk >= samples
        left = 0 if start == 0 else stride_left
        if end - start > left:
            yield Window(start, end, left, 0 if last else stride_right)
        if last:
            return


def preflight_audio(rate: int = 16_000) -> bytes:
    """A second of a quiet tone as a WAV file: what an executor's preflight transcribes."""
    import soundfile

    tone = 0.1 * np.sin(np.arange(rate, dtype=np.float32) * (2 * np.pi * 220 / rate))
    buffer = io.BytesIO()
    soundfile.write(buffer, tone, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()
