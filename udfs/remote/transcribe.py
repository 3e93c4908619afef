"""The ``transcribe`` head over an OpenAI-compatible ``/v1/audio/transcriptions`` endpoint (``transcribe.endpoint``):
a hosted speech API, vLLM serving Whisper, ``transformers serve``.

It takes the place of :class:`~lakescore.udfs.heads.transcribe.Transcriber` behind the audio runner
(:class:`~lakescore.udfs.heads.protocol.SendsRecordings`): no weights here, each recording's header read here (its
length and sample rate are the output's ``duration_s`` and ``sample_rate``; a null, unreadable, empty or too long
recording is refused before any request, with the reasons of an in-process run) and the file sent whole, as read, one
request per recording, ``concurrency`` in flight (:mod:`lakescore.udfs.remote.transcriptions`). A long recording is
windowed by the server as it windows (vLLM cuts Whisper's 30-second windows itself; ``transformers serve`` reads one
window, the first); lakescore's own windows (``transcribe.chunk_length_s``) are the in-process head's.

A recording the server fails is ``endpoint_error`` with the server's message (retried first where the status says
so, as every endpoint's); :class:`~lakescore.udfs.remote.answers.EndpointDown` stops the run. With
``transcribe.return_timestamps`` each request asks ``response_format`` ``verbose_json`` with segments, and a server
whose answer holds none is refused by the executors' preflight (:meth:`EndpointTranscriber.score`), in one line,
before any row is sent. Each answered request counts its recording's audio (``audio_ms``), which
``transcribe.endpoint.price.per_audio_minute`` prices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lakescore.schemas.reasons import NULL_INPUT, RowFailure
from lakescore.udfs.audio import AudioHeader, Transcript, read_audio_header, transcript_columns
from lakescore.udfs.batching import Scored
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.options.transcribe import TranscribeOptions
from lakescore.udfs.remote.answers import EndpointDown, EndpointError, EndpointRefused, Unhonoured, what_happened
from lakescore.udfs.remote.client import EndpointClient
from lakescore.udfs.remote.head import RemoteHead, open_client
from lakescore.udfs.remote.transcriptions import post_transcription

__all__ = ["EndpointTranscriber", "load_remote_transcriber"]


class EndpointTranscriber(RemoteHead):
    """Recordings transcribed by ``client``'s endpoint under ``options`` (see the module docstring)."""

    def __init__(self, client: EndpointClient, options: TranscribeOptions, revision: str | None = None) -> None:
        self.options = options
        super().__init__(client, revision)

    def read_header(self, data: bytes | memoryview | None) -> AudioHeader | RowFailure:
        """A row's header (what the output's ``duration_s`` and ``sample_rate`` come from), or why it is not sent."""
        return read_audio_header(data, self.options.max_duration_s)

    def send_recordings(self, values: Sequence[Any], headers: Mapping[int, AudioHeader]) -> Scored:
        """Each row of ``headers`` sent as one request: its :class:`~lakescore.udfs.audio.Transcript`, or
        ``endpoint_error`` with the server's message; the other rows ``null_input`` (the runner gives them their own
        reasons)."""
        reasons: list[str | None] = [None if i in headers else NULL_INPUT for i in range(len(values))]
        return self.send(values, lambda i: self._transcribe(values[i], headers[i]), list(headers), reasons)

    def _transcribe(self, data: Any, header: AudioHeader) -> Transcript:
        timestamps = self.options.return_timestamps
        answer = post_transcription(self.client, bytes(data), header, self.options.language, timestamps)
        if timestamps and answer.segments is None:
            raise Unhonoured(
                "transcribe.return_timestamps",
                "its answer to response_format verbose_json holds no segments (the server ignores response_format)",
            )
        return Transcript(answer.text, answer.segments if timestamps else None, header.duration_s, header.sample_rate)

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> tuple:
        """The in-process head's columns (:func:`~lakescore.udfs.audio.transcript_columns`)."""
        return transcript_columns(outputs, ok, self.options.return_timestamps)

    def score(self, values: Sequence[bytes]) -> np.ndarray:
        """The executors' preflight: each recording sent with every setting of the run; :class:`EndpointRefused` in
        one line when the server refuses it, does not serve the model, or answers without the segments asked."""
        out = np.empty(len(values), dtype=object)
        for i, data in enumerate(values):
            header = self.read_header(data)
            if isinstance(header, RowFailure):
                raise ValueError(f"{header.reason}: {header.error}")
            try:
                out[i] = self._transcribe(data, header)
            except EndpointDown as exc:
                raise EndpointRefused(str(exc)) from None
            except Unhonoured as exc:
                raise EndpointRefused(
                    f"{self.where} does not honour {exc.setting}: {exc.message}; drop transcribe.return_timestamps, "
                    "or use a server that returns segments (OpenAI's whisper-1, vLLM)"
                ) from None
            except EndpointError as exc:
                raise EndpointRefused(
                    self.not_served(exc) or f"{self.where} {what_happened(exc, self.client.settings.max_retries)}"
                ) from None
        return out


def load_remote_transcriber(spec: ModelSpec, model_dir: Path | None) -> EndpointTranscriber:
    """The head for ``spec.transcribe.endpoint`` (``model_dir`` ``None``: no files here). ``ValueError`` for model
    settings a server cannot honour; :class:`EndpointRefused` for a key named but not set."""
    options = spec.transcribe
    if options is None or options.endpoint is None:
        raise ValueError(f"task {spec.task!r}: a remote transcriber needs transcribe.endpoint")
    if spec.reduced_precision:
        raise ValueError(
            f"{spec.reduced_precision} (model.dtype / model.quantize) is how a model runs here; a served "
            "model runs at the server's precision: drop it"
        )
    client, _ = open_client(options.endpoint, None, None)
    try:
        return EndpointTranscriber(client, options, options.endpoint.revision)
    except BaseException:
        client.close()
        raise
