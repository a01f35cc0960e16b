from __future__ import annotations

import csv
import io

from . import Report


class CsvRenderer:
    """Raw values (no rounding), one block per table, each block preceded by
    a ``# table: NAME`` line; ``tables()`` gives one CSV text per table."""

    def tables(self, report: Report) -> dict:
        out = {}
        for name, table in report.tables.items():
            buf = io.StringIO()
            cols = [c for c, _, _ in table.columns]
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(cols)
            for row in table.frame.to_dict("records"):
                writer.writerow(["" if _isna(row.get(c)) else row.get(c) for c in cols])
            out[name] = buf.getvalue()
        return out

    def render(self, report: Report) -> str:
        parts = []
        for name, text in self.tables(report).items():
            parts.append(f"# table: {name}\n{text}")
        return "\n".join(parts)


def _isna(v) -> bool:
    try:
        return v is None or v != v
    except Exception:
        return False
