"""A run's report as files: the JSON a scheduler reads and the HTML page beside it (:mod:`lakescore.jobs.report.html`).

Apart from :mod:`lakescore.jobs.report` (the report itself), so that the page's module builds on the report's and not
the other way round.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from lakescore.jobs.report.html import write_html
from lakescore.jobs.report.model import RunReport, html_path_for

__all__ = ["write_report", "report_location"]

log = logging.getLogger(__name__)


def write_report(report: RunReport, path: os.PathLike | str, html: bool = True) -> Path:
    """Write ``report`` as JSON to ``path`` atomically (a reader never sees half a report), and with
    ``html`` the HTML page beside it (:func:`html_path_for`), recorded in ``report.html_report``.

    A page that cannot be drawn is logged as a warning and leaves ``html_report`` unset: the
    JSON report is what schedulers depend on.
    """
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    if html:
        _write_html(report, target)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=f".{target.name}.", delete=False) as handle:
        json.dump(report.as_dict(), handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")
    os.replace(handle.name, target)
    return target


def report_location(report: RunReport, json_path: os.PathLike | str) -> str:
    """The summary's last line: where to look (the HTML page when there is one, and the JSON)."""
    json_file = Path(json_path).expanduser().resolve()
    if report.html_report:
        return f"  report: {report.html_report} (JSON: {json_file.name} beside it)"
    return f"  report: {json_file}"


def _write_html(report: RunReport, json_path: Path) -> None:
    try:
        report.html_report = str(html_path_for(json_path).resolve())
        write_html(report.as_dict(), json_path)
    except Exception:  # the page is a view of the JSON; never lose the JSON for it
        report.html_report = None
        log.warning("could not write the HTML report beside %s", json_path, exc_info=True)
