"""commprof: where distributed deep-learning training spends its time."""
from __future__ import annotations

__version__ = "0.1.0"

from .session import metric, set_run_info  # noqa: E402

__all__ = ["__version__", "metric", "set_run_info"]
