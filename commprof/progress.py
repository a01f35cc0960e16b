"""Progress of long work (merge, import, report, export, sweep) on stderr.

Shown only where a person watches: a ``rich`` progress bar when stderr is
a terminal (it disappears when the work is done), nothing in logs and
pipes. ``COMMPROF_PROGRESS=0`` turns it off, ``COMMPROF_PROGRESS=1`` forces
one plain line per update (at most every ``interval`` seconds, and at the
end) where stderr is not a terminal. Standard library only until a bar is
actually drawn; never lets a display problem reach the work."""
from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")


def mode() -> str:
    """"rich", "lines" or "off"."""
    env = os.environ.get("COMMPROF_PROGRESS", "").strip().lower()
    if env in ("0", "off", "no", "false"):
        return "off"
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        return "rich"
    return "lines" if env in ("1", "on", "yes", "true") else "off"


class Bar:
    """``with Bar("merging", total=8, unit="ranks") as bar: bar.advance()``."""

    def __init__(self, description: str, total: Optional[int] = None, unit: str = "",
                 interval: float = 0.5):
        self.description, self.total, self.unit = description, total, unit
        self.done = 0
        self.interval = interval
        self._mode = mode()
        self._rich = None
        self._last = 0.0

    def __enter__(self) -> "Bar":
        if self._mode == "rich":
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                           TimeElapsedColumn)

                self._rich = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TextColumn(self.unit), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
                self._rich.start()
                self._task = self._rich.add_task(self.description, total=self.total)
            except Exception:  # no rich, odd terminal: no bar
                self._rich, self._mode = None, "off"
        return self

    def advance(self, n: int = 1, description: Optional[str] = None) -> None:
        self.done += n
        if description:
            self.description = description
        try:
            if self._rich is not None:
                self._rich.update(self._task, completed=self.done, description=self.description)
            elif self._mode == "lines":
                now = time.monotonic()
                if now - self._last >= self.interval or (self.total and self.done >= self.total):
                    self._last = now
                    self._line()
        except Exception:
            self._rich, self._mode = None, "off"

    def _line(self) -> None:
        of = f"/{self.total}" if self.total else ""
        sys.stderr.write(f"commprof: {self.description} {self.done}{of} {self.unit}".rstrip() + "\n")
        sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        try:
            if self._rich is not None:
                self._rich.stop()
            elif self._mode == "lines" and self.done and self.total and self.done < self.total:
                self._line()
        except Exception:
            pass


def track(items: Iterable[T], description: str, total: Optional[int] = None, unit: str = "") -> Iterator[T]:
    """Iterate ``items``, advancing a :class:`Bar` by one per item."""
    with Bar(description, total, unit) as bar:
        for item in items:
            yield item
            bar.advance()
