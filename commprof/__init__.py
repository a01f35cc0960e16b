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


def _analyzers_from_a_checkout() -> None:
    """Run from a source checkout without installing (``PYTHONPATH=checkout
    python -m commprof ...``): setup.cfg installs the top-level analyzers/
    as ``commprof.analyzers``; make that one mapping here, to this
    checkout's folder. A stat call when installed (the analyzers are then
    inside the package); nothing more when an editable install of this
    checkout maps them."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(os.path.dirname(here), "analyzers")
    mine = os.path.join(src, "__init__.py")
    if os.path.isdir(os.path.join(here, "analyzers")) or not os.path.isfile(mine):
        return
    import importlib.util
    import sys

    name = __name__ + ".analyzers"
    for finder in list(sys.meta_path):
        try:
            spec = finder.find_spec(name, __path__)  # type: ignore[attr-defined]
            if spec is not None and spec.origin and os.path.samefile(spec.origin, mine):
                return  # an editable install of this checkout maps it already
        except Exception:  # a finder that fails here must not break the import
            continue

    class _Finder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != name:
                return None
            return importlib.util.spec_from_file_location(fullname, mine,
                                                          submodule_search_locations=[src])

    # first: an editable install of another checkout would map it there
    sys.meta_path.insert(0, _Finder)


_analyzers_from_a_checkout()


def __getattr__(name):
    if name in ("metric", "set_run_info"):
        from .record import session

        return getattr(session, name)
    if name in ("load", "compare", "diff", "Trace", "Comparison"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'commprof' has no attribute {name!r}")
