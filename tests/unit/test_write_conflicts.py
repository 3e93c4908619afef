"""Which exceptions count as a lost Delta commit race (and become ``WriteConflictError``, one clear line)."""

import pytest

from lakescore.jobs.platform.tables import is_commit_conflict


def _delta_exception(name: str, message: str) -> Exception:
    """A stand-in for delta-spark's converted exception (the real one needs a JVM to construct)."""
    kind = type(name, (Exception,), {"__module__": "delta.exceptions.captured"})
    return kind(message)


@pytest.mark.parametrize(
    "exc",
    [
        # Two runs creating the same new table: the loser's exception names no concurrency.
        _delta_exception(
            "ProtocolChangedException",
            "[DELTA_PROTOCOL_CHANGED] The protocol version of the Delta table has been changed by a concurrent update.",
        ),
        _delta_exception(
            "MetadataChangedException",
            "[DELTA_METADATA_CHANGED] MetadataChangedException: The "
            "metadata of the Delta table has been changed by a concurrent update.",
        ),
        _delta_exception("ConcurrentDeleteDeleteException", "[DELTA_CONCURRENT_DELETE_DELETE] ..."),
        RuntimeError(
            "An error occurred while calling o123.save. : io.delta.exceptions.ProtocolChangedException: "
            "[DELTA_PROTOCOL_CHANGED] The protocol version ..."
        ),
        RuntimeError("[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] ConcurrentAppendException: Files were added ..."),
    ],
)
def test_every_delta_commit_conflict_is_a_conflict(exc):
    assert is_commit_conflict(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("[DELTA_MISSING_DELTA_TABLE] not a Delta table"),
        OSError("No space left on device"),
        ValueError("x"),
    ],
)
def test_other_failures_are_not_conflicts(exc):
    assert not is_commit_conflict(exc)
