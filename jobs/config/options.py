"""What the schema declares, setting by setting: for messages, the CLI's flags, the Python API's keywords and the
reference in ``docs/configuration.md``."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from lakescore.jobs.config.hints import bounds_text, choices_of, is_section, type_text, unwrapped
from lakescore.jobs.config.schema import JobConfig


@dataclass(frozen=True)
class Option:
    """One setting as the schema declares it: what the CLI, the Python API and the reference need to know."""

    key: str
    """The dotted key, e.g. ``model.device``."""
    type: Any
    """The value's type without ``Optional`` and validators (``Literal[...]`` for a choice)."""
    default: Any
    description: str
    """The field's documentation on one line."""
    bounds: str = ""
    """The numeric bounds as text (``>= 1``, ``between 0 and 1``); ``""`` when unbounded."""
    flag: str | None = None
    """The ``lakescore score`` flag that sets it, if any."""
    metavar: str | None = None
    sweep: bool = False
    """Whether ``lakescore sweep`` takes its flag too."""
    repeat: bool = False
    """Whether its flag adds one item of a list each time it is given (``--stop``), rather than taking the list."""
    job_only: bool = False
    """Whether only the scoring job applies it (``transform`` / ``pandas_udf`` refuse it)."""

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]

    @property
    def section(self) -> str:
        """The section the option sits in (``""`` at the top level)."""
        return self.key.rpartition(".")[0]

    @property
    def choices(self) -> tuple:
        """The allowed values of a choice; ``()`` for any other setting."""
        return choices_of(self.type)

    @property
    def type_text(self) -> str:
        """What the option takes, in words: ``one of `auto`, `cpu`, `cuda```, ``integer >= 1``, ``list of strings``."""
        return type_text(self.type, self.bounds)


def config_options() -> list[Option]:
    """Every setting of the schema, in declaration order, a section's settings in place of the section."""

    def walk(section: type[BaseModel], prefix: str) -> list[Option]:
        found = []
        for name, info in section.model_fields.items():
            hint, metadata = unwrapped(info.annotation)
            if is_section(hint):
                found += walk(hint, f"{prefix}{name}.")
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            found.append(
                Option(
                    prefix + name,
                    hint,
                    info.get_default(call_default_factory=True),
                    " ".join((info.description or "").split()),
                    bounds_text([*info.metadata, *metadata]),
                    **extra,
                )
            )
        return found

    return walk(JobConfig, "")


def declared(loc: tuple) -> tuple[Any, list]:
    """The type and constraints the schema declares for the value at ``loc`` (a validation error's location)."""
    hint: Any = JobConfig
    metadata: list = []
    for part in loc:
        if is_section(hint):
            info = hint.model_fields.get(part)
            if info is None:
                return None, []
            hint, metadata = info.annotation, list(info.metadata)
        elif typing.get_origin(hint) in (dict, tuple):  # a mapping's value, a list's item
            hint, metadata = typing.get_args(hint)[-1 if typing.get_origin(hint) is dict else 0], []
        hint, more = unwrapped(hint)
        metadata += more
    return hint, metadata
