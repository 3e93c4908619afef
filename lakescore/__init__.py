"""lakescore: batch model scoring of warehouse tables on Apache Spark.

The installed package is ``lakescore``; the repository's ``jobs/``, ``udfs/`` and ``schemas/``
folders are its subpackages ``lakescore.jobs`` (orchestration, CLI, platform adapters),
``lakescore.udfs`` (the model runtime, no Spark driver code) and ``lakescore.schemas``
(input contracts, output schemas, validation suites).
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("lakescore")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
