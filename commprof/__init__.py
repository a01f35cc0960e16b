"""commprof: where distributed deep-learning training spends its time."""
from __future__ import annotations

__version__ = "0.1.0"

from .session import metric, set_run_info  # noqa: E402

__all__ = ["__version__", "metric", "set_run_info", "load", "compare", "diff"]


def __getattr__(name):
    # The notebook API needs pandas/pyarrow: import it only when asked for, so
    # the start-up bootstrap in every recorded process stays light.
    if name in ("load", "compare", "diff", "Trace", "Comparison"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
