"""The short-run tuning of the sessions lakescore builds on this host's own masters (``local[…]``,
``local-cluster[…]``), and only those: :mod:`~lakescore.jobs.platform.spark.local.own_host` decides and applies it; the
class archive and the custom Python daemon live beside it. Kept light: executors run ``python -m …local.python_daemon``,
which imports this."""
