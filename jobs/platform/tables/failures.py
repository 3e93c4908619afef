"""Why a table operation failed, in words an operator reads: the error types and the classification of Spark's and the
filesystem's failures (unreadable input, storage refusals, write conflicts)."""

from __future__ import annotations

import re

from pyspark.errors import AnalysisException
from pyspark.sql.types import StructType

from lakescore.jobs.platform.spark import adapter as spark_adapter


class TableError(ValueError):
    """An input or output reference cannot be read or written as asked."""


class OutputColumnsError(TableError):
    """An existing output's columns differ from those the run writes; ``existing`` holds its schema."""

    def __init__(self, message: str, existing: StructType) -> None:
        super().__init__(message)
        self.existing = existing


_UNREADABLE_FILE = re.compile(
    r"\[(?:FAILED_READ_FILE[A-Z_.]*|CANNOT_READ_FILE_FOOTER)\][^\n]*?"
    r"(?:reading file|footer for file:?)\s+(\S+?)\.?(?:\s|$)"
)


def cause_chain(exc: BaseException) -> list[str]:
    """What ``exc`` and everything behind it said, outermost first, one line each: Python's chain (``__cause__``,
    else ``__context__``) and, for an error raised in the JVM, its Java causes
    (:func:`~lakescore.jobs.platform.spark.adapter.java_causes`), or where only the error's text came back (Spark
    Connect, a JVM that is gone) that text's first line and the ``Caused by:`` lines of its text and of the stack
    trace it carries (Spark Connect's ``getStackTrace()``, the server's). The last is the root cause."""
    chain: list[str] = []
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        java = [cause.strip().splitlines()[0] for cause in spark_adapter.java_causes(link) if cause.strip()]
        chain += java or _text_causes(link)  # a Java message's first line: later ones hold plans or a task's trace
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return chain


def _text_causes(exc: BaseException) -> list[str]:
    try:
        text = str(exc)
        stack = exc.getStackTrace() if callable(getattr(exc, "getStackTrace", None)) else None
    except Exception:  # noqa: BLE001 (a py4j error whose JVM is gone cannot even print itself)
        return [type(exc).__name__]
    lines = [line.strip() for line in f"{text}\n{stack or ''}".splitlines() if line.strip()]
    if not lines:
        return [type(exc).__name__]
    caused = [line[len("Caused by:") :].strip() for line in lines[1:] if line.startswith("Caused by:")]
    return [lines[0], *dict.fromkeys(caused)]  # a trace shown in the text and carried beside it: each cause once


def unreadable_input(exc: BaseException) -> str | None:
    """One line naming the input file Spark could not read (corrupt, truncated, not Parquet, no permission),
    with the reader's own reason (the root cause); ``None`` when ``exc`` is not such a failure."""
    chain = cause_chain(exc)
    found = _UNREADABLE_FILE.search("\n".join(chain))
    if found is None:
        return None
    return f"cannot read input file {found.group(1)}: {chain[-1][:300]}"


_STORAGE_REFUSALS = (
    (re.compile(r"no space left on device", re.I), "no space left on device"),
    (re.compile(r"disk quota exceeded|diskspace quota of \S+ is exceeded", re.I), "disk quota exceeded"),
    (re.compile(r"read-only file system", re.I), "read-only file system"),
)
"""A filesystem's refusals of a write that an operator fixes outside lakescore, as the one line names them."""


_WRITTEN_PATH = re.compile(r"(?:writing rows to|Cannot create|Mkdirs failed to create)\s+(\S+?)\.?(?:\s|$)")


_URI = re.compile(r"\b[a-z][a-z0-9+.-]*:/[^\s'\"(),]+")


def storage_refusal(text: str) -> str | None:
    """The filesystem's refusal ``text`` reports, as :data:`_STORAGE_REFUSALS` names it; ``None`` for anything else.

    >>> storage_refusal("java.io.IOException: No space left on device")
    'no space left on device'
    """
    return next((name for pattern, name in _STORAGE_REFUSALS if pattern.search(text)), None)


def failure_reason(exc: BaseException, step: str | None = None) -> str | None:
    """One line saying what failed and its root cause, for an error Spark raised: an input file it cannot read
    (:func:`unreadable_input`); a write the filesystem refused (:func:`storage_refusal`), e.g. ``no space left on
    device writing file:/data/out`` (a Python ``OSError`` too; ``during <step>``, the run's ``step`` it stopped,
    where no path is named); any other
    as its outermost message and its root cause. ``None`` for other errors: lakescore's own say it in their message."""
    from_spark = type(exc).__module__.split(".", 1)[0] in ("py4j", "pyspark")
    if not from_spark and not isinstance(exc, OSError):
        return None
    unreadable = unreadable_input(exc) if from_spark else None
    if unreadable is not None:
        return unreadable
    chain = cause_chain(exc)
    root = chain[-1]
    refused = next((r for r in map(storage_refusal, reversed(chain)) if r), None)
    if refused is not None:
        where = _written_path(exc, chain)
        return f"{refused} writing {where}" if where else f"{refused} during {step}" if step else refused
    if not from_spark:
        return None
    outermost = _JAVA_CLASS.sub("", chain[0], count=1)
    return outermost if len(chain) == 1 or root in chain[0] else f"{outermost}; root cause: {root}"


_JAVA_CLASS = re.compile(r"^(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*: ")
"""The class name a Java exception's ``toString()`` starts with (``org.apache.spark.SparkException: ``)."""


def _written_path(exc: BaseException, chain: list[str]) -> str | None:
    """The path a failed write names: Spark's, the first URI in the chain, or a Python ``OSError``'s file name."""
    text = "\n".join(chain)
    found = _WRITTEN_PATH.search(text) or _URI.search(text)
    if found is not None:
        return found.group(1) if found.re is _WRITTEN_PATH else found.group(0)
    return getattr(exc, "filename", None)


class WriteConflictError(RuntimeError):
    """Another writer committed to the same table at the same time; this run's commit was refused."""


_CONFLICT_MARKERS = ("DELTA_CONCURRENT", "ConcurrentModification", "DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED")


def is_commit_conflict(exc: BaseException) -> bool:
    """True when ``exc`` is Delta refusing a commit because another writer committed first.

    Every one of Delta's conflict exceptions counts, not only the ``Concurrent*`` ones: two runs
    creating the same new table lose with ``ProtocolChangedException`` / ``MetadataChangedException``
    (``DELTA_PROTOCOL_CHANGED`` / ``DELTA_METADATA_CHANGED``), whose names say nothing of concurrency.
    """
    kind = type(exc)
    if kind.__module__.startswith("delta.exceptions") or "Concurrent" in kind.__name__:
        return True
    text = str(exc)
    return any(marker in text for marker in _CONFLICT_MARKERS)


def is_not_found(exc: AnalysisException) -> bool:
    condition = exc.getCondition() if hasattr(exc, "getCondition") else exc.getErrorClass()
    return (condition or "").startswith(("TABLE_OR_VIEW_NOT_FOUND", "SCHEMA_NOT_FOUND")) or "not found" in str(
        exc
    ).lower()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
