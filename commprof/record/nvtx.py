"""NVTX ranges in the ``commprof`` domain, so Nsight Systems shows the same
regions commprof records. Harmless (and nearly free) without a GPU or
without the ``nvtx`` package."""
from __future__ import annotations

from typing import Dict


class _Off:
    enabled = False

    def push(self, name: str) -> None:
        pass

    def pop(self) -> None:
        pass

    def start(self, name: str):
        return None

    def end(self, rid) -> None:
        pass


class Nvtx(_Off):
    enabled = True

    def __init__(self):
        import nvtx  # noqa: F401  (ImportError handled by make())

        self._domain = nvtx.get_domain("commprof")
        self._attrs: Dict[str, object] = {}

    def _attr(self, name: str):
        attr = self._attrs.get(name)
        if attr is None:
            attr = self._attrs[name] = self._domain.get_event_attributes(message=name)
        return attr

    def push(self, name: str) -> None:
        self._domain.push_range(self._attr(name))

    def pop(self) -> None:
        self._domain.pop_range()

    def start(self, name: str):
        return self._domain.start_range(self._attr(name))

    def end(self, rid) -> None:
        if rid is not None:
            self._domain.end_range(rid)


def make(enabled: bool):
    if not enabled:
        return _Off()
    try:
        return Nvtx()
    except Exception:
        return _Off()
