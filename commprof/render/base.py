"""What every renderer shares: the base class and cell formatting."""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Tuple

from ..trace.values import missing

if TYPE_CHECKING:  # pragma: no cover
    from ..trace.tables import Report, Table


class Renderer:
    #: ``--format`` name
    name = ""
    #: file extensions (first: the one ``--out-dir`` uses)
    extensions: Tuple[str, ...] = ()
    #: written by ``--out-dir`` as ``report<ext>``
    in_out_dir = True

    def render(self, report: "Report") -> str:  # pragma: no cover - abstract
        raise NotImplementedError


def fmt(value, spec: str) -> str:
    if missing(value):
        return "-"
    if spec:
        try:
            return format(value, spec)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def cells(table: "Table") -> List[List[str]]:
    out = []
    for row in table.frame.to_dict("records"):  # keeps each column's type (iterrows would upcast)
        out.append([fmt(row.get(col), spec) for col, _, spec in table.columns])
    return out
