"""Accelerators for the sessions lakescore builds on this host's own masters (``local[…]``, ``local-cluster[…]``), and
only those: :mod:`~lakescore.jobs.platform.local.accelerations` decides and applies them; the class archive and the
custom Python daemon live beside it. Kept light: executors run ``python -m …local.python_daemon``, which imports this."""
