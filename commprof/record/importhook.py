"""Run callbacks right after a module finishes importing (a sys.meta_path
finder that wraps the real loader). Used so instruments patch torch the
moment the user's script imports it, without importing torch ourselves."""
from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable, Dict, List

_hooks: Dict[str, List[Callable]] = {}
_lock = threading.RLock()


def _run(name: str, module) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for cb in callbacks:
        cb(module)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Leave no trace of the wrapper on the module itself.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run(self._name, module)

    def __getattr__(self, item):
        return getattr(self._loader, item)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_finder = _Finder()


def when_imported(name: str, callback: Callable) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now if it is)."""
    with _lock:
        if name in sys.modules:
            module = sys.modules[name]
        else:
            _hooks.setdefault(name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    callback(module)


def remove_finder() -> None:
    with _lock:
        _hooks.clear()
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
