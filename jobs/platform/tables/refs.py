"""A table reference read once (:class:`TableRef`: a path or a parsed table name) and columns by their exact names."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession

from lakescore.jobs.platform.spark import adapter as spark_adapter
from lakescore.jobs.references import TableName, is_path, local_ref, parse_table_name, quote_identifier

log = logging.getLogger(__name__)


def column(name: str):
    """A column by its exact name, even one with dots or backticks in it."""
    from pyspark.sql import functions as F

    return F.col(quote_identifier(name))


@dataclass(frozen=True)
class TableRef:
    """A reference read once: a filesystem path, or a parsed metastore table name. Every function of this module takes
    a string or a ``TableRef`` and parses a string once, at its top (:meth:`parse`).

    >>> TableRef.parse("/data/x").sql, TableRef.parse("db.`we``ird`").sql
    ('delta.`/data/x`', '`db`.`we``ird`')
    """

    text: str
    """The reference as given, made unambiguous (:func:`local_ref`): what messages quote."""
    name: TableName | None = None
    """The parsed table name; ``None`` for a path."""

    @classmethod
    def parse(cls, ref: str | TableRef, what: str = "table") -> TableRef:
        """``ref`` as a path (:func:`is_path`) or a table name (``what`` names it in a bad name's one-line error)."""
        if isinstance(ref, TableRef):
            return ref
        text = local_ref(ref)
        return cls(text, None if is_path(text) else parse_table_name(text, what))

    @property
    def is_path(self) -> bool:
        """True for a filesystem path, false for a metastore table."""
        return self.name is None

    @property
    def table(self) -> TableName:
        """The parsed name of a metastore table; ``ValueError`` for a path, which has none."""
        if self.name is None:
            raise ValueError(f"{self.text!r} is a path, not a table name")
        return self.name

    @property
    def sql(self) -> str:
        """The reference as Delta SQL names it: ``delta.`<path>``` or the quoted table name."""
        return f"delta.{quote_identifier(self.text)}" if self.name is None else self.name.quoted

    def __str__(self) -> str:
        return self.text

    def exists(self, spark: SparkSession) -> bool:
        """Whether the path holds a file or directory, or the catalog holds the table."""
        return (
            spark_adapter.path_exists(spark, self.text)
            if self.name is None
            else spark.catalog.tableExists(self.name.quoted)
        )

    def delta_api(self, spark: SparkSession):
        """Delta's ``DeltaTable`` for a path in a classic session, else ``None`` (a table, or Spark Connect: run SQL).

        The choice of how to run history, detail and MERGE: SQL's ``delta.`<path>``` is first looked up as a table
        in the metastore, which starts the metastore client that a run on paths needs for nothing else.
        """
        return spark_adapter.delta_path_table(spark, self.text) if self.name is None else None

    def load(self, reader):
        """A DataFrame from ``reader`` (a format set for a path) over this reference."""
        return reader.load(self.text) if self.name is None else reader.table(self.name.quoted)

    def save(self, writer) -> None:
        """Run ``writer`` (a ``DataFrameWriter``) into this reference."""
        if self.name is None:
            writer.save(self.text)
        else:
            writer.saveAsTable(self.name.quoted)


def tried_as(ref: TableRef) -> str:
    """What a bare name was looked up as, for not-found messages."""
    return f"no table {ref.table.quoted}, and no file ./{ref.text}"
