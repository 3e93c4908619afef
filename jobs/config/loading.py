"""Loading a config: the YAML file, then ``--set`` overrides, then flags, validated whole before any work."""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from lakescore.jobs.config.hints import choices_of, is_section, unwrapped
from lakescore.jobs.config.messages import message
from lakescore.jobs.config.options import declared
from lakescore.jobs.config.schema import SHORTHANDS, JobConfig, shorthand
from lakescore.udfs.options.base import ConfigError


def load_config(
    path: os.PathLike | str | None = None,
    overrides: Sequence[str] = (),
    flags: Mapping[str, Any] | None = None,
) -> JobConfig:
    """Build a validated :class:`JobConfig`.

    Precedence, lowest first: the schema's defaults, the YAML file at ``path``,
    ``overrides`` (``dotted.key=value`` strings: a string key takes the text after ``=`` as it is, any other key's
    value is parsed as YAML), then ``flags`` (dotted keys to values; ``None`` values are ignored).

    Raises :class:`ConfigError` for an unreadable file, an unknown key (with the
    closest known key suggested), a value of the wrong type, or a bad value.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        tree = _read_yaml(Path(path))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects dotted.key=value, got {item!r}")
        key = key.strip()
        if not raw.strip():  # an unset shell variable: refused rather than read as null, which switches features off
            raise ConfigError(
                f"--set {key}= gives no value (an unset variable?): give one, or leave the --set out for the default"
            )
        _assign(tree, key, raw if _takes_text(key) else _parse_scalar(raw))
    for key, value in (flags or {}).items():
        if value is not None:
            _assign(tree, key, value)
    return config_from_mapping(tree)


def config_from_mapping(tree: Mapping[str, Any]) -> JobConfig:
    """A validated :class:`JobConfig` from the same tree a YAML file holds (sections as nested mappings).

    Raises :class:`ConfigError` exactly as :func:`load_config` does.
    """
    if not isinstance(tree, Mapping):
        raise ConfigError(f"config must be a mapping, got {type(tree).__name__}")
    try:
        return JobConfig.model_validate(dict(tree))
    except ValidationError as exc:  # the first problem, in one line; an unknown key before a bad value
        errors = exc.errors(include_url=False)
        raise ConfigError(message(next((e for e in errors if e["type"] == "extra_forbidden"), errors[0]))) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as dup:
        raise ConfigError(
            f"config file {path} gives key {dup.key!r} twice (lines {dup.first} and {dup.second}): keep one"
        ) from None
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


class _DuplicateKey(Exception):
    """A mapping of the config file that gives ``key`` on lines ``first`` and ``second`` (1-based)."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(key, first, second)
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that gives a key twice (PyYAML keeps the last silently, so a typo'd
    copy would change the run). A merge key (``<<``) may still be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: the base constructor names it
                pass
        return super().construct_mapping(node, deep)


def _takes_text(dotted: str) -> bool:
    """Whether the schema declares the key ``dotted`` a string (or a choice among strings), so that ``--set`` hands
    it the text as typed: parsed as YAML, ``Review: {body}`` would be a mapping and ``\\n`` two characters."""
    parts = _split_key(dotted)
    if len(parts) == 1 and parts[0] in SHORTHANDS:  # --set model=/path sets the shorthand's key
        parts.append(SHORTHANDS[parts[0]])
    hint, _ = declared(tuple(parts))
    choices = choices_of(hint)
    return hint is str or (bool(choices) and all(isinstance(choice, str) for choice in choices))


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except (yaml.YAMLError, ValueError):  # ValueError: YAML timestamps that are not dates (2026-13-01)
        return raw


def _assign(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = _split_key(dotted)
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if i == 0:
            child = node[part] = shorthand(part, child)  # `model: /path` in the file, then --set model.device=...
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _split_key(dotted: str) -> list[str]:
    """``dotted`` cut along the config's sections; below a mapping field the rest is one key.

    ``spark.conf.spark.hadoop.fs.s3a.endpoint`` -> ``["spark", "conf", "spark.hadoop.fs.s3a.endpoint"]``.
    """
    parts = dotted.split(".")
    section: type[BaseModel] = JobConfig
    for i, part in enumerate(parts[:-1]):
        info = section.model_fields.get(part)
        if info is None:
            break  # validation names the unknown key
        hint, _ = unwrapped(info.annotation)
        if typing.get_origin(hint) is dict:
            return parts[: i + 1] + [".".join(parts[i + 1 :])]
        if not is_section(hint):
            break
        section = hint
    return parts
