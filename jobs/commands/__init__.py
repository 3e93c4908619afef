"""Side commands beside scoring: ``demo``, ``sweep`` and ``history``."""
