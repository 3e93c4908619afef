"""A batch created but not recorded, found again where the provider's batches carry no ``metadata`` (Anthropic's
Message Batches), as pure functions.

Before a file's batch is created the driver records an **intent** in the ledger (:class:`Intent`: the file's part
digest, its line count, its first line ids, the time). A rerun, or a retried submit task, lists the provider's
batches created since (:class:`Listed`) and matches them (:func:`match_intents`) by what the contract shows: created at
or after the intent (less :data:`CLOCK_SKEW_S`, the driver's clock against the provider's), the same request count,
and once the batch has ended its results' ``custom_id``\\ s (one of the file's first ids among them: the file's; none:
another's). A batch that is one intent's only candidate, and a candidate of no other, is adopted: polled and collected
as if it had been recorded, never created again. An intent with several candidates it cannot tell apart is
**ambiguous**: its file is sent again (the other batch, if it was this run's, is paid for and left unread), and the run
says so in one line; adopting one of them at random would be no cheaper, as the lines of a wrong one come back absent
and go again, only later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Intent", "Listed", "Found", "match_intents", "intents_by_part", "CLOCK_SKEW_S", "SAMPLE_IDS"]

CLOCK_SKEW_S = 60.0
"""How far the provider's clock may be behind the driver's: a batch created this long before an intent still counts."""
SAMPLE_IDS = 8
"""The first line ids of a file its intent keeps (an ended batch's results missing all of them cannot be told)."""


@dataclass(frozen=True)
class Intent:
    """A file about to be submitted: its ``part`` digest, its ``lines``, its first line ids (at most
    :data:`SAMPLE_IDS`), and when (seconds since the epoch, the driver's clock)."""

    part: str
    lines: int
    first_ids: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class Listed:
    """One of the provider's batches as its list shows it: id, creation time (seconds since the epoch), request count,
    whether it has ended, and where its results are once it has."""

    batch_id: str
    created_at: float
    lines: int
    ended: bool
    results: str | None = None


@dataclass(frozen=True)
class Found:
    """What :func:`match_intents` made of the intents: ``adopted`` part -> batch id; ``ambiguous`` part -> the batch
    ids it could be."""

    adopted: dict[str, str] = field(default_factory=dict)
    ambiguous: dict[str, list[str]] = field(default_factory=dict)


def match_intents(
    intents: Iterable[Intent],
    listed: Sequence[Listed],
    result_ids: Callable[[Listed], Iterable[str]],
    exclude: frozenset[str] = frozenset(),
) -> Found:
    """Each intent's batch among ``listed`` (module docstring); ``result_ids(batch)``: an ended batch's results'
    ``custom_id``\\ s, read only for a batch that is a candidate by time and count; ``exclude``: batches recorded
    already.

    >>> intent = Intent("p1", 3, ("a", "b", "c"), 100.0)
    >>> later = [Listed("b1", 130.0, 3, True, "url"), Listed("b0", 20.0, 3, True, "url")]
    >>> match_intents([intent], later, lambda b: ["c"] if b.batch_id == "b1" else ["x"]).adopted
    {'p1': 'b1'}
    >>> two = [Listed("b2", 140.0, 3, False), Listed("b3", 150.0, 3, False)]
    >>> match_intents([intent], two, lambda b: []).ambiguous
    {'p1': ['b2', 'b3']}
    """
    read: dict[str, frozenset[str]] = {}

    def ids_of(batch: Listed) -> frozenset[str]:
        if batch.batch_id not in read:
            read[batch.batch_id] = frozenset(result_ids(batch)) if batch.ended else frozenset()
        return read[batch.batch_id]

    found = Found()
    open_: dict[str, list[Listed]] = {}
    claimed: set[str] = set()
    for intent in sorted(intents, key=lambda i: i.part):
        candidates = []
        for batch in listed:
            if batch.batch_id in exclude or batch.lines != intent.lines or batch.created_at < intent.at - CLOCK_SKEW_S:
                continue
            ids = ids_of(batch)
            if ids and not ids & set(intent.first_ids):
                continue  # its results name other lines: another file's
            candidates.append(batch)
        # an ended batch whose results name this file's lines is this file's (the earliest, if it went twice)
        sure = sorted((b for b in candidates if ids_of(b)), key=lambda b: b.created_at)
        if sure and sure[0].batch_id not in claimed:
            found.adopted[intent.part] = sure[0].batch_id
            claimed.add(sure[0].batch_id)
        elif candidates:
            open_[intent.part] = candidates
    for part, candidates in open_.items():
        left = [b for b in candidates if b.batch_id not in claimed]
        shared = [b for b in left if any(b in others for p, others in open_.items() if p != part)]
        if len(left) == 1 and not shared:
            found.adopted[part] = left[0].batch_id
            claimed.add(left[0].batch_id)
        elif left:
            found.ambiguous[part] = sorted(b.batch_id for b in left)
    return found


def intents_by_part(intents: Iterable[Intent]) -> Mapping[str, Intent]:
    """The latest intent of each part (an earlier one's batch, if any, was given up when the file was sent again)."""
    latest: dict[str, Intent] = {}
    for intent in intents:
        if intent.part not in latest or intent.at > latest[intent.part].at:
            latest[intent.part] = intent
    return latest
