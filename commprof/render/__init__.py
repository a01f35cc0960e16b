"""Renderers: a :class:`~commprof.trace.tables.Report` (named tables +
notes) to text. They format; they never compute.

Each renderer is a small :class:`Renderer` subclass with a ``name`` (the
``--format`` value) and the file ``extensions`` it is chosen for; the list of
formats, the choice by name or by output-file extension and the files
``--out-dir`` writes all derive from those classes. Importing this package
costs nothing beyond the standard library."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Optional, Type

from ..trace.files import atomic_write
from .base import Renderer, cells, fmt
from .csvtables import CsvRenderer
from .html import HtmlRenderer
from .jsonfile import JsonRenderer
from .markdown import MarkdownRenderer
from .terminal import TerminalRenderer

if TYPE_CHECKING:  # pragma: no cover
    from ..trace.tables import Report

RENDERERS: Dict[str, Type[Renderer]] = {cls.name: cls for cls in
                                        (TerminalRenderer, MarkdownRenderer, CsvRenderer, JsonRenderer,
                                         HtmlRenderer)}
#: the ``--format`` choices
FORMATS = tuple(RENDERERS)

__all__ = ["Renderer", "cells", "fmt", "RENDERERS", "FORMATS", "get", "format_for_path", "write_all"]


def get(name: str) -> Renderer:
    if name not in RENDERERS:
        raise ValueError(f"unknown format {name!r}; choose from {', '.join(RENDERERS)}")
    return RENDERERS[name]()


def format_for_path(path: str) -> Optional[str]:
    ext = os.path.splitext(path)[1].lower()
    for name, cls in RENDERERS.items():
        if ext in cls.extensions:
            return name
    return None


def write_all(report: "Report", out_dir: str) -> List[str]:
    """Every format into ``out_dir`` (``report.<ext>``; one CSV per table);
    returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, cls in RENDERERS.items():
        if not cls.in_out_dir:
            continue
        path = os.path.join(out_dir, "report" + cls.extensions[0])
        atomic_write(path, cls().render(report))
        written.append(path)
    for name, text in CsvRenderer().tables(report).items():
        path = os.path.join(out_dir, f"{name}.csv")
        atomic_write(path, text)
        written.append(path)
    return written
