"""Renderers: a :class:`Report` (named tables + notes) to text. They format;
they never compute. Chosen by name or by output-file extension."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import pandas as pd

#: (column, header, format) — format is a str.format spec or "" for str()
ColumnSpec = Tuple[str, str, str]


@dataclass
class Table:
    title: str
    frame: pd.DataFrame
    columns: List[ColumnSpec]
    #: "table", or "list" for long-text tables (one block per row in text output)
    style: str = "table"


@dataclass
class Report:
    title: str
    tables: Dict[str, Table]
    notes: List[str] = field(default_factory=list)
    runs: List[dict] = field(default_factory=list)
    #: renderer-specific data computed by analyzers (e.g. timelines for html)
    extras: Dict[str, object] = field(default_factory=dict)


def fmt(value, spec: str) -> str:
    if value is None:
        return "-"
    try:
        if pd.isna(value):
            return "-"
    except (TypeError, ValueError):
        pass
    if spec:
        try:
            return format(value, spec)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def cells(table: Table) -> List[List[str]]:
    out = []
    for row in table.frame.to_dict("records"):  # keeps each column's type (iterrows would upcast)
        out.append([fmt(row.get(col), spec) for col, _, spec in table.columns])
    return out


def get(name: str):
    from .csvrenderer import CsvRenderer
    from .jsonrenderer import JsonRenderer
    from .markdown import MarkdownRenderer
    from .html import HtmlRenderer
    from .terminal import TerminalRenderer

    renderers = {"table": TerminalRenderer, "md": MarkdownRenderer, "csv": CsvRenderer,
                 "json": JsonRenderer, "html": HtmlRenderer}
    if name not in renderers:
        raise ValueError(f"unknown format {name!r}; choose from {', '.join(renderers)}")
    return renderers[name]()


def format_for_path(path: str) -> Optional[str]:
    ext = os.path.splitext(path)[1].lower()
    return {".md": "md", ".csv": "csv", ".json": "json", ".txt": "table", ".html": "html",
            ".htm": "html"}.get(ext)
