"""The journal writer of one process: a daemon thread that, every
``flush_interval`` seconds, moves the queued event rows (and the device
times resolved since) into the rank's journal and refreshes its metadata.
The hot path only appends to the queue; everything else happens here."""
from __future__ import annotations

import collections
import json
import os
import threading
from typing import Any, Callable, Dict, Optional

from ..trace.files import atomic_write
from ..trace.journal import PROGRESS_SUFFIX, JournalWriter
from .log import log_once


#: metadata fields that alone do not make the journal's metadata worth rewriting
_VOLATILE = ("clock", "steps")


class Flusher:
    def __init__(self, queue: collections.deque, shard_dir: str, host: str, pid: int,
                 interval: float, meta: Callable[[str], Dict[str, Any]],
                 before_flush: Callable[[Optional[float]], None], on_fail: Callable[[], None],
                 progress: Optional[Callable[[], Dict[str, Any]]] = None):
        self.q = queue
        self.journal = JournalWriter(shard_dir, host, pid)
        self.interval = interval
        self._meta = meta
        self._before = before_flush
        self._on_fail = on_fail
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._meta_written: Optional[str] = None
        self._progress = progress
        self._progress_path = os.path.join(shard_dir, f"{host}.{pid}{PROGRESS_SUFFIX}")

    def start(self) -> None:
        """Create the journal and its metadata now (a rank killed in its
        first steps still leaves both), then flush every ``interval``."""
        with self.lock:
            self.journal.open()
            self._write_meta()
        self._thread = threading.Thread(target=self._loop, name="commprof-flush", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception as exc:  # never take the training down
                log_once("flush", f"journal flush failed: {exc!r}; recording stopped")
                self._on_fail()
                return

    def stop(self) -> None:
        self._stop.set()

    def flush(self, deadline: Optional[float] = None) -> None:
        """Move what is queued into the journal (device rows resolved first,
        waiting for pending ones until ``deadline`` when given)."""
        with self.lock:
            self._before(deadline)
            n = len(self.q)
            if n:
                self.journal.append([self.q.popleft() for _ in range(n)])
            self._write_meta()
            if self._progress is not None:
                atomic_write(self._progress_path, json.dumps(self._progress(), default=str))

    def _write_meta(self) -> None:
        if not self.journal.started:
            return
        meta = self._meta("journal")
        # rewritten when what it says changes, not for the clock reading or the
        # step count alone (both move at every flush: a file write each time,
        # ~1 ms of the writer's CPU per flush measured here); the final
        # metadata at close has both exact, and the events carry the steps
        key = json.dumps({k: v for k, v in meta.items() if k not in _VOLATILE}, sort_keys=True, default=str)
        if key == self._meta_written:
            return
        self.journal.write_meta(meta)
        self._meta_written = key

    def close(self) -> None:
        """Mark the journal complete (its metadata says so) and close it."""
        with self.lock:
            if self.journal.started:
                self.journal.write_meta(self._meta("complete"))
            self.journal.close()
