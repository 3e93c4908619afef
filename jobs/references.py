"""References to tables: a path told from a table name, and table names parsed once, validated with one-line errors
and quoted for Spark by one function. Plain Python (no Spark), so the config derives names from them.

A reference containing ``/``, ``\\`` or ``:`` outside backtick-quoted name parts is a path; a bare name is a path when
a local file or directory of that name exists (:func:`is_path`), else a table name.

A table reference is ``table``, ``schema.table`` or ``catalog.schema.table`` (Unity Catalog's
three levels; locally ``spark_catalog.db.table``). Each part is either bare (any characters
but ``.``, a backtick, control characters, and no space at either end) or backtick-quoted, with
a backtick inside written twice, as Spark SQL writes it::

    sales.reviews                    -> ('sales', 'reviews')
    main.`sales-eu`.`review scores`  -> ('main', 'sales-eu', 'review scores')
    main.sales-eu.review_scores      -> ('main', 'sales-eu', 'review_scores')   (bare parts may hold '-')
    db.`we``ird.name`                -> ('db', 'we`ird.name')

Everything handed to Spark goes through :func:`quote_identifier` (:attr:`TableName.quoted`),
so reserved words, leading digits, spaces, dashes, unicode and backticks all reach the
catalog intact. Names derived from a table (the errors table ``<output>_errors``, staging
tables) are built from the parsed parts (:meth:`TableName.with_suffix`), never by pasting
text. Whether a catalog accepts a legal name is the catalog's business, except Spark's own
session catalog (``spark_catalog``: the Hive metastore), whose rule is known and checked before
any compute (:func:`require_catalog_accepts`).

>>> parse_table_name("main.`sales-eu`.`we``ird`").quoted
'`main`.`sales-eu`.`we``ird`'
>>> str(parse_table_name("it.reviews").with_suffix("_errors"))
'it.reviews_errors'
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import overload

from lakescore.udfs.options.base import ConfigError

__all__ = [
    "TableNameError",
    "TableName",
    "quote_identifier",
    "parse_table_name",
    "has_path_separator",
    "require_catalog_accepts",
    "is_path",
    "local_ref",
]

MAX_PARTS = 3
MAX_PART_LENGTH = 255
"""Unity Catalog's limit for one name part (the Hive metastore's is lower, and its own)."""

SESSION_CATALOG = "spark_catalog"
_SESSION_CATALOG_NAME = re.compile(r"[A-Za-z0-9_]+")
"""What Spark's session catalog (Hive metastore) accepts in a schema or table name (``SessionCatalog.validateName``)."""
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class TableNameError(ConfigError):
    """A table reference is not a legal name (or not one its catalog accepts); found before any compute."""


def quote_identifier(part: str) -> str:
    """``part`` as one backtick-quoted Spark SQL identifier (a backtick inside is doubled). The only quoting
    function."""
    return "`" + part.replace("`", "``") + "`"


@dataclass(frozen=True)
class TableName:
    """A parsed table reference: 1 to 3 unquoted parts, catalog first."""

    parts: tuple[str, ...]

    @property
    def name(self) -> str:
        """The table's own name (the last part)."""
        return self.parts[-1]

    @property
    def namespace(self) -> tuple[str, ...]:
        """The catalog and schema parts given (may be empty)."""
        return self.parts[:-1]

    @property
    def quoted(self) -> str:
        """Every part quoted: what Spark receives (``spark.table``, ``saveAsTable``, SQL)."""
        return ".".join(quote_identifier(p) for p in self.parts)

    @property
    def quoted_namespace(self) -> str:
        """The catalog and schema parts quoted (``spark.catalog.databaseExists``); empty when none were given."""
        return ".".join(quote_identifier(p) for p in self.namespace)

    def with_suffix(self, suffix: str) -> TableName:
        """The table beside this one (same catalog and schema) whose name ends in ``suffix``."""
        return TableName(self.namespace + (self.name + suffix,))

    def __str__(self) -> str:
        """For people and config: plain parts bare, the others quoted; :func:`parse_table_name` reads it back."""
        return ".".join(p if _PLAIN.fullmatch(p) else quote_identifier(p) for p in self.parts)


def parse_table_name(text: str, what: str = "table") -> TableName:
    """Parse ``text`` as a table reference (see the module docstring); ``what`` names it in errors.

    Raises :class:`TableNameError` with one line saying what is wrong: an empty part, an
    unterminated or stray backtick, a control character, space at either end of a bare part,
    a part over 255 characters, or more than three parts.
    """
    parts: list[str] = []
    for start, part, quoted, problem in _scan(text):
        where = f"{what} {text!r} is not a table name"
        if problem:
            raise TableNameError(f"{where}: {problem}")
        if not part:
            raise TableNameError(f"{where}: empty name part at character {start + 1}")
        if not quoted and "`" in part:
            raise TableNameError(
                f"{where}: a backtick inside an unquoted part; quote the part "
                "(`like this`, a backtick inside written twice)"
            )
        if not quoted and part != part.strip():
            raise TableNameError(
                f"{where}: space at the start or end of {part!r}; quote the part with backticks if the space is meant"
            )
        if _CONTROL.search(part):
            raise TableNameError(f"{where}: control character in {part!r}")
        if len(part) > MAX_PART_LENGTH:
            raise TableNameError(f"{where}: a part is over {MAX_PART_LENGTH} characters")
        parts.append(part)
    if len(parts) > MAX_PARTS:
        raise TableNameError(f"{what} {text!r} has {len(parts)} name parts; a table is [catalog.][schema.]table")
    return TableName(tuple(parts))


def has_path_separator(text: str) -> bool:
    """Whether ``/``, ``\\`` or ``:`` appear outside backtick-quoted name parts: then ``text`` is a path.

    ``/data/x``, ``s3a://b/x`` and ``/tmp/a`b/x`` are paths; ``db.`a/b``` is a table whose name holds a slash.
    """
    return any(not quoted and any(c in part for c in "/\\:") for _, part, quoted, _ in _scan(text))


def _scan(text: str) -> Iterator[tuple[int, str, bool, str | None]]:
    """Each name part of ``text``: ``(start, unquoted text, was quoted, problem or None)``; lenient, so paths scan
    too."""
    i = 0
    while True:
        start = i
        if text.startswith("`", i):
            part, i, problem = _quoted_part(text, i)
            yield start, part, True, problem
        else:
            end = text.find(".", i)
            i = len(text) if end < 0 else end
            yield start, text[start:i], False, None
        if i >= len(text):
            return
        i += 1  # the dot


def _quoted_part(text: str, i: int) -> tuple[str, int, str | None]:
    """The backtick-quoted part starting at ``text[i]``, the index after it (a dot or the end), and any problem."""
    out, j = [], i + 1
    while j < len(text):
        if text.startswith("``", j):
            out.append("`")
            j += 2
        elif text[j] == "`":
            if j + 1 < len(text) and text[j + 1] != ".":
                end = text.find(".", j)
                return (
                    "".join(out),
                    len(text) if end < 0 else end,
                    f"text after the closing backtick at character {j + 1}",
                )
            return "".join(out), j + 1, None
        else:
            out.append(text[j])
            j += 1
    return "".join(out), len(text), f"unterminated backtick at character {i + 1}"


def require_catalog_accepts(spark, table: TableName, what: str) -> None:
    """Raise :class:`TableNameError` before any compute when ``table`` would be written to Spark's session
    catalog (``spark_catalog``, the Hive metastore) under a name it refuses (only letters, digits and ``_``).

    The catalog is the name's first part when it has three, else the session's current catalog.
    Unity Catalog and other catalogs take any legal name and are not second-guessed here.
    """
    catalog = table.parts[0] if len(table.parts) == MAX_PARTS else spark.catalog.currentCatalog()
    if catalog.lower() != SESSION_CATALOG:
        return
    names = table.parts[1:] if len(table.parts) == MAX_PARTS else table.parts
    refused = [p for p in names if not _SESSION_CATALOG_NAME.fullmatch(p)]
    if refused:
        raise TableNameError(
            f"{what} {str(table)!r} cannot be created in Spark's session catalog ({SESSION_CATALOG}, a Hive "
            f"metastore): {refused[0]!r} has characters other than letters, digits and _ (Unity Catalog accepts it)"
        )


def is_path(ref: str) -> bool:
    """True when ``ref`` names a filesystem path rather than a metastore table.

    A reference with ``/``, ``\\`` or ``:`` outside backtick-quoted parts always is one (``db.`a/b``` is
    a table); a bare name is one when it exists locally (relative to the working directory).

    >>> is_path("s3a://bucket/x"), is_path("sales.no_such_local_file"), is_path("db.`a/b`")
    (True, False, False)
    """
    return has_path_separator(ref) or os.path.exists(ref)


@overload
def local_ref(ref: str) -> str: ...
@overload
def local_ref(ref: None) -> None: ...
@overload
def local_ref(ref: str | None) -> str | None: ...
def local_ref(ref: str | None) -> str | None:
    """``ref`` spelled unambiguously: the absolute path of a bare name that exists locally, else ``ref`` as given.

    Absolute, because Spark resolves a relative path against the JVM's working directory,
    which is not this process's once it has changed directory. References derived from
    the result (``<output>_errors``, the staging directory) follow the same reading:
    beside a local output, not in the metastore.

    >>> local_ref("sales.no_such_local_file"), local_ref("/data/x"), local_ref(None)
    ('sales.no_such_local_file', '/data/x', None)
    """
    if ref and not has_path_separator(ref) and os.path.exists(ref):
        return os.path.abspath(ref)
    return ref
