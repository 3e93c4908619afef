"""The design card's ``setup.py``: a shim. Metadata, dependencies and packaging live in ``pyproject.toml``."""

from setuptools import setup

setup()
