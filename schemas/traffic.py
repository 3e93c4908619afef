"""What a head over an endpoint sent: one value type for the counters, shared by the HTTP client that counts them
(:mod:`lakescore.udfs.remote.client`), the remote heads that report them, the scoring function's worker metrics
(:data:`lakescore.schemas.output.WORKER_METRICS` takes its fields from here) and the driver's accounting. The counters
are spelled here once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["Traffic"]


@dataclass(frozen=True)
class Traffic:
    """Requests to a server and what they carried: the tokens the server's ``usage`` reported (``tokens_in``: prompt
    tokens read, ``tokens_in_cached``: those of them the server read from its prompt cache, ``tokens_in_cache_write``:
    those of them it wrote to its prompt cache (Anthropic's ``cache_creation_input_tokens``), each 0 where it reports
    none, ``tokens_out``: tokens generated), the requests it received, the retries among them, the answers that
    were 429, the answers published without ``usage`` (``unmetered``: their tokens are unknown, so a cost from
    ``usage`` is incomplete), and the milliseconds of audio the answered requests carried (``audio_ms``: a
    transcription endpoint's, what a price per audio minute charges). All 0 for a head that sends nothing."""

    tokens_in: int = 0
    tokens_in_cached: int = 0
    tokens_in_cache_write: int = 0
    tokens_out: int = 0
    requests: int = 0
    retries: int = 0
    rate_limited: int = 0
    unmetered: int = 0
    audio_ms: int = 0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The counters, in order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, counts: Mapping[str, Any]) -> Traffic:
        """The counters ``counts`` holds by name (a JSON object, a row), each missing or null one 0; other keys
        ignored."""
        return cls(**{name: int(counts.get(name) or 0) for name in cls.names()})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(*(a + b for a, b in zip(self.as_dict().values(), other.as_dict().values())))

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(*(a - b for a, b in zip(self.as_dict().values(), other.as_dict().values())))
