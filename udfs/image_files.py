"""Image files named by a path column, read by Python on the executors where a Spark Connect server refuses
lakescore's Hadoop file reader (:mod:`lakescore.jobs.platform.files.hadoop_files`, which reads every path everywhere
else):
the bytes of each row's file, ``None`` where it is missing, and without reading it, its length and modification time.

A path is taken literally (no percent-decoding): a local path, a ``file:`` URI or ``dbfs:/...`` (through Databricks'
``/dbfs`` mount). Any other URI (``s3a://``, ...) fails the task: only the JVM's Hadoop filesystem, with its settings
and credentials, reads those. A file that does not exist is a row's ``missing_file``, never a failed task; any other
error reading it fails the task with its own message.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Sequence

__all__ = ["local_path", "read_file", "read_files", "read_in_slices", "file_status"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def local_path(path: str) -> str | None:
    """``path`` as a path on this host (a local path, ``file:`` URI or ``dbfs:/`` path), or ``None`` for other URIs."""
    scheme = _SCHEME.match(path)
    if scheme is None or len(scheme.group(1)) == 1:  # no scheme, or a Windows drive letter
        return path
    name, rest = scheme.group(1).lower(), path[scheme.end() :]
    if name == "file":
        return re.sub(r"^//(localhost)?(?=/)", "", rest)
    if name == "dbfs":
        return "/dbfs/" + rest.lstrip("/")
    return None


def _local(path: str) -> str:
    local = local_path(path)
    if local is None:
        raise OSError(
            f"cannot read {path!r}: without lakescore's Hadoop file reader only local, file: and dbfs:/ paths "
            "are read (the Spark Connect server refused its jar)"
        )
    return local


def file_status(path: str | None) -> tuple[int, int] | None:
    """``(length in bytes, modification time in milliseconds since the epoch)`` of the file at ``path``, as Hadoop's
    local filesystem gives them, without reading it; ``None`` for a null path, a missing file or a directory."""
    if path is None:
        return None
    try:
        found = os.stat(_local(path))
    except FileNotFoundError:
        return None
    return (found.st_size, found.st_mtime_ns // 1_000_000) if stat.S_ISREG(found.st_mode) else None


def read_file(path: str) -> bytes | None:
    """The bytes of the file at ``path`` (see the module docstring), ``None`` when it does not exist."""
    try:
        with open(_local(path), "rb") as handle:
            return handle.read()
    except (FileNotFoundError, IsADirectoryError):
        return None


def read_files(paths: Sequence[str | None]) -> list[bytes | None]:
    """:func:`read_file` of each path, ``None`` for a null path."""
    return [None if path is None else read_file(path) for path in paths]


def read_in_slices(paths: Sequence[str | None], max_bytes: int) -> Iterator[list[bytes | None]]:
    """:func:`read_files` of ``paths``, in order, as consecutive slices of at most ``max_bytes`` (a bigger file is a
    slice alone), so that at most one slice of files is held at a time."""
    slice_: list[bytes | None] = []
    size = 0
    for path in paths:
        data = None if path is None else read_file(path)
        if slice_ and data and size + len(data) > max_bytes:
            yield slice_
            slice_, size = [], 0
        slice_.append(data)
        size += len(data or b"")
    if slice_:
        yield slice_
