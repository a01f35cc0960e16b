"""What every instrument shares: reversible patches and self-disabling hooks.

An instrument patches one API. ``install()`` applies its patches and hook
registrations; ``uninstall()`` puts every original back. A failure inside
one of its hooks is logged once and switches the instrument off
(``active = False``): the wrapped call then goes straight to the original,
so the training's results and exit code never depend on commprof.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, List, Optional, Tuple

from ..log import log_once

_MISSING = object()


class Instrument:
    #: Registry name (``--disable NAME``).
    name = "base"
    #: Module whose import triggers installation.
    trigger = "torch"

    def __init__(self, recorder):
        self.rec = recorder
        self.active = False
        self.installed = False
        self._patches: List[Tuple[Any, str, Any]] = []
        self._handles: List[Any] = []
        self._fault = self.name in getattr(recorder.config, "fault_inject", ())

    # -- lifecycle ---------------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.active = True
        try:
            self._install()
        except Exception as exc:
            self.fail(exc)
            self.uninstall()

    def uninstall(self) -> None:
        for obj, attr, original in reversed(self._patches):
            if original is _MISSING:
                try:
                    delattr(obj, attr)
                except AttributeError:
                    pass
            else:
                setattr(obj, attr, original)
        self._patches.clear()
        for handle in reversed(self._handles):
            try:
                handle.remove()
            except Exception:
                pass
        self._handles.clear()
        self._uninstall()
        self.installed = False
        self.active = False

    def _install(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _uninstall(self) -> None:
        pass

    # -- helpers -----------------------------------------------------------
    def patch(self, obj: Any, attr: str, make_wrapper: Callable[[Any], Any]) -> None:
        original = obj.__dict__.get(attr, _MISSING) if hasattr(obj, "__dict__") else getattr(obj, attr)
        current = getattr(obj, attr)
        wrapper = make_wrapper(current)
        try:
            wrapper.__wrapped__ = current
            wrapper.__commprof__ = self.name
        except (AttributeError, TypeError):
            pass
        self._patches.append((obj, attr, original))
        setattr(obj, attr, wrapper)

    def handle(self, h: Any) -> None:
        self._handles.append(h)

    def fail(self, exc: BaseException) -> None:
        """Log once and switch off. Called from inside hooks."""
        self.active = False
        log_once(f"fail:{self.name}",
                 f"instrument {self.name!r} disabled after an internal error: {exc!r}")

    def tagged(self, phase_of, original):
        """``original`` with the recorder's ``tls.fsdp`` = (phase, layer,
        source) around it: the collectives issued inside are recorded with
        that source and detail ``"<phase> <layer>"`` (instruments/collectives.py;
        sharded data parallel: FSDP, ZeRO-3). ``phase_of(args, enclosing tag)``
        gives the tag; the enclosing one (a prefetch inside a pre-forward) is
        put back after."""
        inst = self
        tls = self.rec.tls

        @functools.wraps(original)
        def tagged(*args, **kwargs):
            if not inst.active:
                return original(*args, **kwargs)
            prev = getattr(tls, "fsdp", None)
            try:
                inst.check_fault()
                tls.fsdp = phase_of(args, prev)
            except Exception as exc:
                inst.fail(exc)
                tls.fsdp = prev
            try:
                return original(*args, **kwargs)
            finally:
                tls.fsdp = prev

        return tagged

    def check_fault(self) -> None:
        if self._fault:
            raise RuntimeError(f"fault injected into {self.name}")


def tensor_bytes(t) -> int:
    """Bytes of a tensor's elements."""
    return t.numel() * t.element_size()


def leading_dim(obj: Any, _depth: int = 0) -> Optional[int]:
    """Leading dimension of the first tensor in a (nested) batch."""
    shape = getattr(obj, "shape", None)
    if shape is not None and hasattr(obj, "dtype"):
        return int(shape[0]) if len(shape) else None
    if _depth > 3:
        return None
    if isinstance(obj, (list, tuple)):
        for item in obj:
            n = leading_dim(item, _depth + 1)
            if n is not None:
                return n
    elif isinstance(obj, dict):
        for item in obj.values():
            n = leading_dim(item, _depth + 1)
            if n is not None:
                return n
    return None


def compiling() -> bool:
    """Whether Dynamo is tracing this call (torch.compile): a hook then adds
    nothing to the graph (a call Dynamo cannot trace is a graph break)."""
    torch = sys.modules.get("torch")
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(fn()) if fn is not None else False
