"""commprof: where distributed deep-learning training spends its time.

Wings (see ARCHITECTURE.md): :mod:`commprof.record` (in the training
processes) -> :mod:`commprof.trace` (the one schema and its files) ->
:mod:`commprof.analyzers` (tables) -> :mod:`commprof.render` (text, HTML);
:mod:`commprof.convert` imports and exports other tools' formats;
:mod:`commprof.api` is the notebook API and :mod:`commprof.cli` the command.

Everything here is imported lazily, so ``import commprof.trace`` loads the
trace package alone and the start-up bootstrap in every recorded process
stays light."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "metric", "set_run_info", "load", "compare", "diff", "Trace", "Comparison"]


def __getattr__(name):
    if name in ("metric", "set_run_info"):
        from .record import session

        return getattr(session, name)
    if name in ("load", "compare", "diff", "Trace", "Comparison"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'commprof' has no attribute {name!r}")
