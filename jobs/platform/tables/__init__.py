"""Reading inputs and writing Delta outputs by reference: a metastore table name or a path. One module per concern:
:mod:`.failures`, :mod:`.refs`, :mod:`.reads`, :mod:`.writes` and :mod:`.history`; every name is importable from here.

A reference containing ``/``, ``\\`` or ``:`` outside backtick-quoted name parts is a path (``/data/x``,
``./x``, ``s3a://bucket/x``, ``dbfs:/x``). A bare name (``reviews``, ``reviews.parquet``, ``db.table``)
is a path when a local file or directory of that name exists in the working directory, and a table
identifier (``table``, ``db.table`` or ``catalog.db.table``, parts quoted with backticks where needed:
:mod:`lakescore.jobs.references`) otherwise, handed to Spark quoted: the local path wins, so
``--input reviews.parquet`` reads the file beside you rather than the table `reviews`.`parquet`.

Each reference is read once into a :class:`TableRef` (path or parsed name). One function per operation follows,
each working in classic and Spark Connect sessions: :func:`read_input` / :func:`read_pinned` / :func:`read_files`,
:func:`write_delta`
(overwrite, replaceWhere or append), :func:`merge_delta`, :func:`delta_history` (every Delta fact about commits comes
from its one row parser) and :func:`delta_detail`. Delta's SQL runs everywhere; for a path in a classic session the
same operation runs through Delta's ``DeltaTable`` API instead (:meth:`TableRef.delta_api`), which skips the
metastore lookup SQL makes for ``delta.`<path>```. Filesystem calls go through
:mod:`lakescore.jobs.platform.spark.adapter`.
"""

from __future__ import annotations

from lakescore.jobs.platform.tables.failures import (
    TableError, OutputColumnsError, cause_chain, unreadable_input, storage_refusal, failure_reason,
    WriteConflictError, is_commit_conflict,
)
from lakescore.jobs.platform.tables.refs import (
    column, TableRef,
)
from lakescore.jobs.platform.tables.history import (
    DeltaCommit, HistoryEntry, delta_history, last_commit, own_commit, last_commit_stamp, delta_detail,
    table_id, run_metadata, staging_metadata,
)
from lakescore.jobs.platform.tables.reads import (
    check_writable_path, read_input, read_pinned, read_files, check_output_target, load_file_lists, is_delta,
    table_names,
)
from lakescore.jobs.platform.tables.writes import (
    WRITE_MODES, write_delta, DELETION_VECTORS, STATS_COLUMNS, MERGE_OP, MergeCommit, merge_delta, delete_path,
    drop_delta,
)
from lakescore.jobs.references import is_path, local_ref

__all__ = [
    "TableError", "OutputColumnsError", "cause_chain", "unreadable_input", "storage_refusal", "failure_reason",
    "check_writable_path", "column", "is_path", "local_ref", "TableRef", "read_input", "read_pinned",
    "read_files", "check_output_target", "DeltaCommit", "WriteConflictError", "is_commit_conflict",
    "WRITE_MODES", "write_delta", "DELETION_VECTORS", "STATS_COLUMNS", "MERGE_OP", "MergeCommit", "merge_delta", "HistoryEntry",
    "delta_history", "last_commit", "own_commit", "last_commit_stamp", "delta_detail", "table_id",
    "load_file_lists", "is_delta", "delete_path", "drop_delta", "table_names", "run_metadata",
    "staging_metadata",
]
