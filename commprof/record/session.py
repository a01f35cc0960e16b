"""The recording session of one process: recorder + instruments + exit paths.

``start(config)`` is what the bootstrap ``sitecustomize`` calls in every new
interpreter of a recorded job. It is also usable directly (tests, notebooks):
``stop()`` uninstalls every patch and finalises the trace."""
from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from typing import Dict, Optional

from . import importhook as _importhook
from .config import Config
from .instruments import ALL
from .log import warn
from .recorder import Recorder

_current: Optional["Session"] = None
_fork_handler_registered = False


def _after_fork_in_child() -> None:
    if _current is not None:
        _current.recorder.after_fork_in_child()


def _register_fork_handler() -> None:
    # os.register_at_fork cannot be undone: register one module-level
    # handler per process that follows whatever session is current.
    global _fork_handler_registered
    if not _fork_handler_registered:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_registered = True


class Session:
    def __init__(self, config: Config):
        self.config = config
        self.recorder = Recorder(config)
        self.instruments: Dict[str, object] = {}
        self._exit_patched = False
        self._orig_exit = None
        self._sigterm_installed = False

    # -- instruments ---------------------------------------------------------
    def install_for(self, module_name: str) -> None:
        for name, cls in ALL.items():
            if cls.trigger != module_name or name in self.config.disable or name in self.instruments:
                continue
            inst = cls(self.recorder)
            inst.install()
            self.instruments[name] = inst
        if module_name == "torch":
            self._note_versions()

    def _note_versions(self) -> None:
        import sys

        info = self.recorder.run_info
        torch = sys.modules.get("torch")
        if torch is not None:
            from .device import cuda_present

            info["torch"] = getattr(torch, "__version__", None)
            # never torch.cuda.is_available() here: it initialises CUDA state
            # that breaks fork() (DataLoader workers, Lightning's ddp_fork)
            info["cuda"] = cuda_present()

    def uninstall(self) -> None:
        for inst in reversed(list(self.instruments.values())):
            inst.uninstall()
        self.instruments.clear()

    # -- exit paths ------------------------------------------------------------
    def hook_exits(self) -> None:
        atexit.register(self.recorder.close)
        _register_fork_handler()
        self._orig_exit = os._exit
        rec = self.recorder
        orig = self._orig_exit

        def _exit(code):
            try:
                rec.close()
            finally:
                orig(code)

        os._exit = _exit
        self._exit_patched = True
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True

    def _on_sigterm(self, signum, frame):
        # Finalise, then die of SIGTERM exactly as without commprof.
        try:
            if self.recorder._forensics:
                from . import forensics

                forensics.note_sigterm(frame)
        except Exception:
            pass
        rec = self.recorder
        if rec.closing is not None and rec.pid == os.getpid():
            if rec.closing == threading.get_ident():
                # it interrupted this thread's final flush (atexit, os._exit): that flush ends by dying of it
                rec.sigterm_pending = True
                return
            deadline = time.monotonic() + 10.0      # another thread's final flush: let it finish first
            while rec.closing is not None and time.monotonic() < deadline:
                time.sleep(0.01)
        try:
            self.recorder.close()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def unhook_exits(self) -> None:
        atexit.unregister(self.recorder.close)
        if self._exit_patched:
            os._exit = self._orig_exit
            self._exit_patched = False
        if self._sigterm_installed and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._sigterm_installed = False


def start(config: Config, hook_exits: bool = True) -> Session:
    """Start recording in this process (idempotent)."""
    global _current
    if _current is not None:
        return _current
    session = _current = Session(config)
    if config.labels:
        session.recorder.run_info["labels"] = dict(config.labels)
    if hook_exits:
        session.hook_exits()
    for trigger in sorted({cls.trigger for cls in ALL.values()}):
        _importhook.when_imported(trigger, lambda _m, t=trigger: session.install_for(t))
    return session


def stop() -> None:
    """Uninstall every patch and write this process's shard."""
    global _current
    session, _current = _current, None
    if session is None:
        return
    _importhook.remove_finder()
    session.uninstall()
    session.recorder.close()
    session.unhook_exits()


def current() -> Optional[Session]:
    return _current


def metric(name: str, value: float) -> None:
    """Record a metric (loss, lr, accuracy, samples/s) into the trace, if
    this process is being recorded; a no-op otherwise."""
    if _current is not None:
        try:
            _current.recorder.metric(name, value)
        except Exception as exc:  # never break the caller
            warn(f"metric {name!r} not recorded: {exc!r}")


def set_run_info(**info) -> None:
    """Attach run configuration (framework, loader, model, batch size...)
    to this rank's metadata, if recording."""
    if _current is not None:
        _current.recorder.run_info.update(info)
