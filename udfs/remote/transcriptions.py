"""The audio transcriptions API's wire format (``/v1/audio/transcriptions``, OpenAI's): the multipart form one recording
becomes (:func:`transcription_form`: the file as it was read, the model, the language where one is set, and for
timestamps ``response_format`` ``verbose_json``, whose timestamps are per segment by default), what a whole answer is
(:func:`parse_transcription`), and one recording's exchange through the client (:func:`post_transcription`). What an
answer means beyond its shape is :mod:`~lakescore.udfs.remote.answers`'; the transport (retries, limits, the breaker)
is the client's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lakescore.schemas.traffic import Traffic
from lakescore.udfs.audio import AudioHeader
from lakescore.udfs.remote.answers import Malformed
from lakescore.udfs.remote.client import EndpointClient

__all__ = [
    "TRANSCRIPTIONS",
    "Transcription",
    "file_part",
    "transcription_form",
    "parse_transcription",
    "post_transcription",
]

TRANSCRIPTIONS = "/audio/transcriptions"
"""The route under the server's ``/v1``."""

_MEDIA_TYPES = {"WAV": "audio/wav", "FLAC": "audio/flac", "OGG": "audio/ogg", "MP3": "audio/mpeg", "AIFF": "audio/aiff"}
"""libsndfile's container names and the media type a file of each is sent as (OpenAI's API and vLLM read the format
from the file's name, so the name carries its extension too)."""


@dataclass(frozen=True)
class Transcription:
    """One recording's answer: its text, its segments (``(start s, end s, text)``; ``None`` when the answer holds none)
    and the tokens ``usage`` reports for a token-priced model (``None``: it reported none, or seconds)."""

    text: str
    segments: list[tuple[float, float | None, str]] | None
    tokens_in: int | None = None
    tokens_out: int | None = None

    @property
    def tokens(self) -> int | None:
        """What the host's tokens-per-minute limit settles with."""
        if self.tokens_in is None or self.tokens_out is None:
            return None
        return self.tokens_in + self.tokens_out


def file_part(data: bytes, header: AudioHeader) -> tuple[str, bytes, str]:
    """The form's ``file`` part: the bytes as read, named ``recording.<ext>`` of its container, with its media type."""
    media = _MEDIA_TYPES.get(header.format, "application/octet-stream")
    return f"recording.{header.format.lower() or 'bin'}", data, media


def transcription_form(model: str, language: str | None, timestamps: bool) -> dict[str, str]:
    """The form's fields besides the file: ``model``, ``language`` where set, and ``response_format`` ``json``, or
    ``verbose_json`` where timestamps are asked (its segments; no ``timestamp_granularities[]``, whose default is the
    segment, and which some servers refuse as a field they do not know)."""
    form = {"model": model, "response_format": "verbose_json" if timestamps else "json"}
    if language is not None:
        form["language"] = language
    return form


def parse_transcription(body: Mapping[str, Any]) -> Transcription:
    """A ``/v1/audio/transcriptions`` answer's text and segments, only when it is a whole answer: a string ``text``,
    and where it holds ``segments`` each with a numeric ``start`` and ``end`` and a string ``text``;
    :class:`Malformed` naming what it lacks otherwise."""
    text = body.get("text") if isinstance(body, Mapping) else None
    if not isinstance(text, str):
        raise Malformed(f"the response holds no text: {json.dumps(body)[:300]}")
    segments = None
    raw = body.get("segments")
    if raw is not None:
        if not isinstance(raw, list):
            raise Malformed(f"the response's segments are not a list: {json.dumps(raw)[:200]}")
        segments = []
        for segment in raw:
            start = segment.get("start") if isinstance(segment, Mapping) else None
            end = segment.get("end") if isinstance(segment, Mapping) else None
            said = segment.get("text") if isinstance(segment, Mapping) else None
            if not isinstance(start, (int, float)) or not (end is None or _number(end)) or not isinstance(said, str):
                raise Malformed(f"a segment without start, end and text: {json.dumps(segment)[:200]}")
            segments.append((float(start), None if end is None else float(end), said))
    usage = body.get("usage")
    tokens_in = tokens_out = None
    if isinstance(usage, Mapping) and usage.get("type") == "tokens":  # a token-priced model's usage (gpt-4o-transcribe)
        tokens_in, tokens_out = usage.get("input_tokens"), usage.get("output_tokens")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in (tokens_in, tokens_out)):
            raise Malformed(f"the response's usage is impossible: {json.dumps(usage)[:200]}")
    return Transcription(text, segments, tokens_in, tokens_out)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float))


def post_transcription(
    client: EndpointClient, data: bytes, header: AudioHeader, language: str | None, timestamps: bool
) -> Transcription:
    """One recording's request (the file as read, ``header`` its header): its :class:`Transcription` as the server
    sent it (errors as the client's ``post``). An answered request counts the recording's audio (``audio_ms``, what a
    price per audio minute charges) and the tokens a token-priced model's ``usage`` reports."""
    form = transcription_form(client.model, language, timestamps)
    answer = client.post(form, 0, parse_transcription, path=TRANSCRIPTIONS, files={"file": file_part(data, header)})
    client.stats.add(
        Traffic(
            audio_ms=round(header.duration_s * 1000), tokens_in=answer.tokens_in or 0, tokens_out=answer.tokens_out or 0
        )
    )
    return answer
