"""The executors' settings, each a section of the config schema (:mod:`lakescore.jobs.config`) declared once on this
side of the driver/executor line:

- :mod:`~lakescore.udfs.options.base`: what every section is built from (the base section, the value types,
  :class:`~lakescore.udfs.options.base.ConfigError`);
- :mod:`~lakescore.udfs.options.model`: ``model.*`` (:class:`~lakescore.udfs.options.model.ModelOptions`);
- :mod:`~lakescore.udfs.options.generate`: ``generate.*``; :mod:`~lakescore.udfs.options.embed`: ``embed.*``;
- :mod:`~lakescore.udfs.options.remote`: ``generate.endpoint``/``server`` and ``embed.endpoint``/``server``.

Plain pydantic: nothing here imports a head, the HTTP client or an engine (tests/unit/test_import_rules.py).
"""
