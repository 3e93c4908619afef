"""Side commands beside scoring: ``demo`` and ``sweep``."""
