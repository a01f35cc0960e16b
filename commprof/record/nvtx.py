"""NVTX ranges in the ``commprof`` domain, so Nsight Systems shows the same
regions commprof records. Harmless without a GPU or without the ``nvtx``
package.

NVTX calls do nothing unless a tool is attached, and a tool attaches by
naming its injection library in ``NVTX_INJECTION64_PATH`` (what ``nsys
profile`` and Nsight Compute set for the processes they launch). Without
one, commprof skips the calls altogether: in a hook that runs between the
backward's kernels each Python call into the ``nvtx`` package costs
microseconds (cold caches), ~10 µs per DDP bucket measured here.
``COMMPROF_NVTX=1`` emits them regardless (a tool attached another way)."""
from __future__ import annotations

import os
from typing import Dict

#: environment variables through which an NVTX tool injects itself
INJECTION_VARS = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH")


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


def tool_attached() -> bool:
    """Is an NVTX tool listening (or are ranges forced with COMMPROF_NVTX=1)?"""
    return os.environ.get("COMMPROF_NVTX") == "1" or any(os.environ.get(v) for v in INJECTION_VARS)


def make(enabled: bool):
    if not enabled or not tool_attached():
        return _Off()
    try:
        return Nvtx()
    except Exception:
        return _Off()
