"""Model sources, the per-process model cache, batching, task heads and the scoring UDF.

Never imports from ``jobs``: everything here runs inside executor Python workers.
"""
