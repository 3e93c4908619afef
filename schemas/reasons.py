"""Every reason a row can be dead-lettered with: the one place they are spelled.

The errors table's ``reason`` column holds one of :data:`REASONS`; the code writes these constants, never the text
(``tests/unit/test_reasons.py`` checks that, and that README's reasons table lists exactly these).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "RowFailure",
    "REASONS",
    "NULL_ID",
    "DUPLICATE_ID",
    "NULL_INPUT",
    "INVALID_TEXT",
    "PREPARE_ERROR",
    "SCORING_ERROR",
    "BAD_FEATURE_VALUE",
    "TOO_MANY_CHUNKS",
    "CHUNK_TOO_SMALL",
    "INVALID_IMAGE",
    "IMAGE_TOO_LARGE",
    "MISSING_FILE",
    "INVALID_AUDIO",
    "EMPTY_AUDIO",
    "AUDIO_TOO_LONG",
    "UNSUPPORTED_SAMPLE_RATE",
    "PROMPT_TOO_LONG",
    "EMPTY_PROMPT",
    "GENERATION_ERROR",
    "JSON_INCOMPLETE",
    "JSON_INVALID",
    "ENDPOINT_ERROR",
    "ENDPOINT_UNFINISHED",
]

NULL_ID = "null_id"
DUPLICATE_ID = "duplicate_id"
NULL_INPUT = "null_input"
INVALID_TEXT = "invalid_text"
PREPARE_ERROR = "prepare_error"
SCORING_ERROR = "scoring_error"
BAD_FEATURE_VALUE = "bad_feature_value"
TOO_MANY_CHUNKS = "too_many_chunks"
CHUNK_TOO_SMALL = "chunk_too_small"
INVALID_IMAGE = "invalid_image"
IMAGE_TOO_LARGE = "image_too_large"
MISSING_FILE = "missing_file"
INVALID_AUDIO = "invalid_audio"
EMPTY_AUDIO = "empty_audio"
AUDIO_TOO_LONG = "audio_too_long"
UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
PROMPT_TOO_LONG = "prompt_too_long"
EMPTY_PROMPT = "empty_prompt"
GENERATION_ERROR = "generation_error"
JSON_INCOMPLETE = "json_incomplete"
JSON_INVALID = "json_invalid"
ENDPOINT_ERROR = "endpoint_error"
ENDPOINT_UNFINISHED = "endpoint_unfinished"

REASONS: tuple[str, ...] = (
    NULL_ID,
    DUPLICATE_ID,
    NULL_INPUT,
    INVALID_TEXT,
    PREPARE_ERROR,
    SCORING_ERROR,
    BAD_FEATURE_VALUE,
    TOO_MANY_CHUNKS,
    CHUNK_TOO_SMALL,
    INVALID_IMAGE,
    IMAGE_TOO_LARGE,
    MISSING_FILE,
    INVALID_AUDIO,
    EMPTY_AUDIO,
    AUDIO_TOO_LONG,
    UNSUPPORTED_SAMPLE_RATE,
    PROMPT_TOO_LONG,
    EMPTY_PROMPT,
    GENERATION_ERROR,
    JSON_INCOMPLETE,
    JSON_INVALID,
    ENDPOINT_ERROR,
    ENDPOINT_UNFINISHED,
)
"""Every reason, in the order README's table lists them."""


@dataclass(frozen=True)
class RowFailure:
    """Why one row was not scored, whatever its input (a text, an image, a recording): ``reason``, one of
    :data:`REASONS`; ``error``, the text the errors table shows; ``raw``, the row's input as that table shows it
    (``None`` until the runner that holds the row fills it in)."""

    reason: str
    error: str
    raw: str | None = None

    @classmethod
    def of(cls, reason: str, exc: BaseException, raw: str | None = None) -> RowFailure:
        """The failure an exception caused: its type and text, cut at 2,000 characters."""
        return cls(reason, f"{type(exc).__name__}: {exc}"[:2000], raw)
