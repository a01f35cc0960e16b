from __future__ import annotations

import csv
import io

from ..trace.values import missing
from .base import Renderer


class CsvRenderer(Renderer):
    """Raw values (no rounding), one block per table, each block preceded by
    a ``# table: NAME`` line; ``tables()`` gives one CSV text per table (what
    ``--out-dir`` writes, one file each)."""
    name = "csv"
    extensions = (".csv",)
    in_out_dir = False

    def tables(self, report) -> dict:
        out = {}
        for name, table in report.tables.items():
            buf = io.StringIO()
            cols = [c for c, _, _ in table.columns]
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(cols)
            for row in table.frame.to_dict("records"):
                writer.writerow(["" if missing(row.get(c)) else row.get(c) for c in cols])
            out[name] = buf.getvalue()
        return out

    def render(self, report) -> str:
        parts = []
        for name, text in self.tables(report).items():
            parts.append(f"# table: {name}\n{text}")
        return "\n".join(parts)
