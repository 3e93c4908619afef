"""The configuration reference of ``docs/configuration.md``, written from the config schema.

``make docs`` (``python -m lakescore.jobs.config.reference docs/configuration.md``) rewrites the part of the page
between :data:`START` and :data:`END`; the rest of the page is written by hand. A unit test keeps the committed
page equal to what :func:`updated` makes of it, so a new option without a regenerated reference fails.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from lakescore.jobs.config.options import Option, config_options
from lakescore.jobs.config.schema import JobConfig

__all__ = ["START", "END", "reference", "updated", "main"]

# as the committed page has it
START = "<!-- generated: start (make docs; edit the schema in jobs/config/, not this block) -->"
END = "<!-- generated: end -->"


def reference() -> str:
    """The generated block: a table per section, each key with its flag, type, default and description."""
    sections: dict[str, list[Option]] = {}
    for option in config_options():
        sections.setdefault(option.section, []).append(option)
    sweep = ", ".join(f"`{o.flag}`" for o in config_options() if o.sweep)
    lines: list[str] = ["", f"`lakescore sweep` takes these flags of the table below: {sweep}."]
    for section, options in sections.items():
        lines += ["", f"### `{section}`" if section else "### Top level", ""]
        if section:
            lines += [_inline(_section_doc(section)), ""]
        lines += ["| key | flag | type | default | description |", "|---|---|---|---|---|"]
        lines += [
            f"| `{o.key}` | {f'`{o.flag}`' if o.flag else ''} | {o.type_text} | {_default_text(o.default)} "
            f"| {_inline(o.description)} |"
            for o in options
        ]
    return "\n".join([START, *lines, "", END])


def updated(page: str) -> str:
    """``page`` with the block between its markers replaced by :func:`reference`."""
    head, start, rest = page.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the page has no {START!r} ... {END!r} block to fill")
    return head + reference() + tail


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the reference block of the page named in ``argv`` (default: ``docs/configuration.md``)."""
    path = Path((argv if argv is not None else sys.argv[1:] or ["docs/configuration.md"])[0])
    path.write_text(updated(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the configuration reference into {path}")
    return 0


def _section_doc(dotted: str) -> str:
    section: Any = JobConfig
    for part in dotted.split("."):
        section = section.model_fields[part].annotation
        optional = [a for a in typing.get_args(section) if a is not type(None)]
        if typing.get_origin(section) in (typing.Union, types.UnionType) and len(optional) == 1:
            section = optional[0]  # an optional section (``generate.endpoint``): its class
    return section.__doc__ or ""


def _inline(text: str) -> str:
    """``text`` on one Markdown table line: reStructuredText's double backticks as Markdown's, pipes escaped."""
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def _default_text(value: Any) -> str:
    if value is PydanticUndefined:  # a key its section needs once the section is given (generate.endpoint.url)
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (tuple, list)):
        return f"`[{', '.join(map(str, value))}]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


if __name__ == "__main__":
    sys.exit(main())
