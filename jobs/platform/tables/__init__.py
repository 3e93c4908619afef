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
    OutputColumnsError,
    TableError,
    WriteConflictError,
    cause_chain,
    failure_reason,
    is_commit_conflict,
    storage_refusal,
    unreadable_input,
)
from lakescore.jobs.platform.tables.history import (
    DeltaCommit,
    HistoryEntry,
    delta_detail,
    delta_history,
    last_commit,
    last_commit_stamp,
    latest_version_and_id,
    own_commit,
    run_metadata,
    staging_metadata,
    table_id,
)
from lakescore.jobs.platform.tables.reads import (
    check_output_target,
    check_writable_path,
    is_delta,
    load_file_lists,
    read_files,
    read_input,
    read_pinned,
    table_names,
)
from lakescore.jobs.platform.tables.refs import (
    TableRef,
    column,
)
from lakescore.jobs.platform.tables.writes import (
    DELETION_VECTORS,
    MERGE_OP,
    STATS_COLUMNS,
    WRITE_MODES,
    MergeCommit,
    delete_path,
    drop_delta,
    merge_delta,
    write_delta,
)
from lakescore.jobs.references import is_path, local_ref

__all__ = [
    "TableError",
    "OutputColumnsError",
    "cause_chain",
    "unreadable_input",
    "storage_refusal",
    "failure_reason",
    "check_writable_path",
    "column",
    "is_path",
    "local_ref",
    "TableRef",
    "read_input",
    "read_pinned",
    "read_files",
    "check_output_target",
    "DeltaCommit",
    "WriteConflictError",
    "is_commit_conflict",
    "WRITE_MODES",
    "write_delta",
    "DELETION_VECTORS",
    "STATS_COLUMNS",
    "MERGE_OP",
    "MergeCommit",
    "merge_delta",
    "HistoryEntry",
    "delta_history",
    "last_commit",
    "own_commit",
    "last_commit_stamp",
    "latest_version_and_id",
    "delta_detail",
    "table_id",
    "load_file_lists",
    "is_delta",
    "delete_path",
    "drop_delta",
    "table_names",
    "run_metadata",
    "staging_metadata",
]
