"""The path column's file reader ships compiled: the committed jar is what ``make jar`` builds from the current Java
sources, holds the class lakescore registers, and is package data of the wheel."""

from __future__ import annotations

import fnmatch
import hashlib
import zipfile
from pathlib import Path

import tomllib

from lakescore.jobs.platform.files.hadoop_files import JAR, JAVA_CLASS

REPO = Path(__file__).resolve().parents[2]


def _manifest(jar: Path) -> dict[str, str]:
    """The jar's main manifest attributes (a line starting with a space continues the one before)."""
    text = zipfile.ZipFile(jar).read("META-INF/MANIFEST.MF").decode("utf-8")
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(" ") and lines:
            lines[-1] += line[1:]
        elif line:
            lines.append(line)
    return dict(line.split(": ", 1) for line in lines)


def test_the_committed_jar_is_built_from_the_current_sources():
    sources = sorted(
        (REPO / "jobs" / "platform" / "files" / "java" / "lakescore").glob("*.java")
    )  # the Makefile's JAVA_SRC
    assert sources
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()
    assert _manifest(JAR).get("Source-SHA256") == digest, (
        "the Java sources changed since the jar was built: run make jar"
    )
    assert JAVA_CLASS.replace(".", "/") + ".class" in zipfile.ZipFile(JAR).namelist()


def test_the_jar_is_package_data_of_the_wheel():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    package = "lakescore.jobs.platform.files"
    relative = JAR.relative_to(REPO / setuptools["package-dir"]["lakescore.jobs"] / "platform" / "files").as_posix()
    assert package in setuptools["packages"]
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in setuptools["package-data"][package]), relative
