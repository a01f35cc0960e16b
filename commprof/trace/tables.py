"""What the analyzers hand to the renderers: a :class:`Report` of named
:class:`Table` objects and notes. It lives at the bottom so that renderers
format a report without importing any analyzer (the analyzers build it in
``analyzers/report.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: (column, header, format) — format is a str.format spec or "" for str()
ColumnSpec = Tuple[str, str, str]


@dataclass
class Table:
    title: str
    frame: "pd.DataFrame"
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
