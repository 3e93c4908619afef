"""The installed package's version, in a module of its own: the report reads it without importing the API."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("lakescore")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
