"""Copy columns of a Delta table's latest version to plain Parquet, read through Delta itself.

``python -m bench.delta_export --table DELTA_PATH --columns a,b --to PARQUET_DIR``

For tables :func:`bench.equivalence.delta_files` cannot read from the log alone: an incremental
output has deletion vectors (``write.deletion_vectors``), whose deleted rows are still in its Parquet
files. The session is the one ``lakescore score`` builds (Delta jars from ``spark.jars_dir``), so the
rows read are the rows any Delta reader sees.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

__all__ = ["read_delta", "main"]


def read_delta(table: Path, columns: Sequence[str]) -> pd.DataFrame:
    """``columns`` of the Delta table at ``table`` (latest version), via a Spark process of its own (~10 s)."""
    with tempfile.TemporaryDirectory(prefix="bench-delta-export-") as tmp:
        target = Path(tmp) / "rows"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.delta_export",
                "--table",
                str(table),
                "--columns",
                ",".join(columns),
                "--to",
                str(target),
            ],
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        return pq.read_table(str(target)).to_pandas()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.delta_export")
    parser.add_argument("--table", required=True)
    parser.add_argument("--columns", required=True, help="comma-separated")
    parser.add_argument("--to", required=True, help="a Parquet directory to create")
    args = parser.parse_args(argv)

    from lakescore.jobs.config import config_from_mapping
    from lakescore.jobs.platform.spark.session import get_or_create_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="bench-delta-export-") as scratch:
        cfg = config_from_mapping(
            {
                "spark": {
                    "app_name": "bench-delta-export",
                    "warehouse_dir": f"{scratch}/warehouse",
                    "metastore_dir": f"{scratch}/metastore_db",
                    "worker_preload": False,
                }
            }
        )
        spark, _ = get_or_create_session(cfg.spark, [args.table])
        try:
            spark.read.format("delta").load(args.table).select(*args.columns.split(",")).write.parquet(args.to)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
