"""A run's report: its facts (:mod:`~lakescore.jobs.report.model`), its sentences (:mod:`~lakescore.jobs.report.text`),
its files (:mod:`~lakescore.jobs.report.files`: JSON, and the self-contained HTML page of
:mod:`~lakescore.jobs.report.html` with :mod:`~lakescore.jobs.report.charts`' charts)."""
