"""The ``transcribe`` task's settings (the config schema's ``transcribe`` section): how a recording is read (its
longest duration, the windows a long one is cut in) and what a Whisper model is asked for (language, task,
timestamps), or the OpenAI-compatible ``/v1/audio/transcriptions`` endpoint that transcribes in place of a model loaded
here. Declared on the executors' side, as the ``generate`` and ``embed`` sections are: the transcription heads
(:mod:`lakescore.udfs.heads.transcribe`, :mod:`lakescore.udfs.remote.transcribe`) take :class:`TranscribeOptions` as
it is."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from lakescore.udfs.options.base import ConfigError, Section, cli
from lakescore.udfs.options.remote import TranscribeEndpointOptions

__all__ = ["TranscribeOptions", "WHISPER_TASKS", "DEFAULT_MAX_DURATION_S"]

_IN_PROCESS = ("chunk_length_s", "stride_length_s", "max_window_tokens")
"""The settings of lakescore's own windows and generation, which an endpoint's request has no field for."""

WHISPER_TASKS = ("transcribe", "translate")
DEFAULT_MAX_DURATION_S = 4 * 3600.0
"""The longest recording transcribed by default: four hours, a long meeting."""


class TranscribeOptions(Section):
    """The ``transcribe`` task's own settings."""

    language: str | None = Field(None, json_schema_extra=cli("--language"))
    """Whisper: the spoken language (``en``, ``english``, ``<|en|>``); default: the model detects it per window. CTC
    models have no such setting."""
    whisper_task: Literal[WHISPER_TASKS] = "transcribe"
    """Whisper: ``transcribe`` (text in the spoken language) or ``translate`` (English text)."""
    return_timestamps: bool = Field(False, json_schema_extra=cli("--timestamps"))
    """Write ``segments``: each piece of the text with its ``start`` and ``end`` in seconds from the recording's start
    (Whisper's timestamp tokens; a CTC model's words by their frames), as the pipeline's ``chunks`` with
    ``return_timestamps`` (``True`` for Whisper, ``"word"`` for CTC)."""
    chunk_length_s: float | None = Field(None, ge=0)
    """Seconds of audio one window holds: a longer recording is read in overlapping windows, as
    ``pipeline(..., chunk_length_s=...)`` reads it, and the windows' texts are merged. Default: a Whisper model's own
    window (its feature extractor's ``chunk_length``, 30 s for every Whisper), 30 s for a CTC model. 0: each recording
    in one pass (Whisper then reads only its first window; ``max_duration_s`` still applies)."""
    stride_length_s: float | None = Field(None, ge=0)
    """Seconds each window shares with each neighbour; default a sixth of the window, the pipeline's."""
    max_duration_s: float = Field(DEFAULT_MAX_DURATION_S, gt=0)
    """The longest recording transcribed: a longer one is dead-lettered ``audio_too_long`` with its duration (read
    from the file's header, before decoding), never cut."""
    max_window_tokens: int | None = Field(None, ge=1)
    """Whisper: tokens one window may generate at most (``generate``'s ``max_new_tokens``); default the pipeline's,
    under the model's generation config."""
    endpoint: TranscribeEndpointOptions | None = None
    """Transcribe through an OpenAI-compatible ``/v1/audio/transcriptions`` endpoint instead of a model loaded here
    (``--model`` is not needed): each recording sent whole, one request each, and windowed by the server as it
    windows; see ``docs/transcription.md``."""

    @model_validator(mode="after")
    def _windows(self) -> TranscribeOptions:
        if self.chunk_length_s and self.stride_length_s is not None and 2 * self.stride_length_s >= self.chunk_length_s:
            raise ConfigError(
                f"transcribe.stride_length_s {self.stride_length_s:g} must be below half of transcribe.chunk_length_s "
                f"{self.chunk_length_s:g}: each window keeps its middle"
            )
        if self.endpoint is not None:
            # the server cuts, merges and decodes: these say how lakescore's own model does, which no request carries
            local = [name for name in _IN_PROCESS if name in self.model_fields_set]
            if local:
                raise ConfigError(
                    f"transcribe.{local[0]} with transcribe.endpoint: the server windows and generates as it does, "
                    "one request per recording; drop it, or transcribe in-process (drop transcribe.endpoint)"
                )
            if self.whisper_task != "transcribe":
                raise ConfigError(
                    "transcribe.whisper_task translate with transcribe.endpoint: the endpoint's route is "
                    "/v1/audio/transcriptions; translate in-process (drop transcribe.endpoint)"
                )
        return self

    def window_s(self, model_window_s: float) -> tuple[float, float]:
        """The seconds of a window and of each of its strides, for a model whose own window is ``model_window_s``."""
        chunk = model_window_s if self.chunk_length_s is None else self.chunk_length_s
        return chunk, chunk / 6 if self.stride_length_s is None else self.stride_length_s

    @property
    def remote(self) -> bool:
        """Whether an endpoint transcribes, rather than a model loaded in the worker."""
        return self.endpoint is not None

    @property
    def server(self) -> None:
        """No served engine: lakescore starts none for transcription (an endpoint may be a vLLM a team runs)."""
        return None

    @property
    def deterministic(self) -> bool:
        """A recording's text depends only on the recording (greedy or beam search, never sampled)."""
        return True

    def identity(self) -> dict[str, Any]:
        """What a spec digest covers: every setting, since each changes the text, and an endpoint by what names the
        model that answers (not where it is or what it costs); an in-process run's facts are what they were before
        the endpoint existed."""
        facts = self.model_dump(exclude={"endpoint"})
        if self.endpoint is not None:
            facts["endpoint"] = self.endpoint.identity()
        return facts
