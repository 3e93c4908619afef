"""The executors' side: the task registry, the settings the config schema takes as its sections, the batching core,
runners and the scoring UDFs here; the task heads in :mod:`lakescore.udfs.heads`, model sources, caching and backends
in :mod:`lakescore.udfs.models`.

Never imports from ``jobs``: everything here runs inside executor Python workers.
"""
