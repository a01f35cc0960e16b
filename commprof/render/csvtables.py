from __future__ import annotations

import csv
import io

from ..trace.values import missing
from .base import Renderer


class CsvRenderer(Renderer):
    """Raw values (no rounding), one table — CSV that pandas, DuckDB and
    spreadsheets read: the report's first table (the breakdown) or the one
    named by ``table``; ``tables()`` gives one CSV text per table (what
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

    def __init__(self, table=None):
        self.table = table

    def render(self, report) -> str:
        from ..errors import UsageError

        texts = self.tables(report)
        if not texts:
            return ""
        name = self.table or next(iter(texts))
        if name not in texts:
            raise UsageError(f"no table {name!r} in this report; tables: {', '.join(texts)}")
        return texts[name]
