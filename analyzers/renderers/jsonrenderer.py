from __future__ import annotations

import json
import math

from . import Report


def _clean(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


class JsonRenderer:
    """Machine-readable: runs' metadata, every table as a list of records
    (raw values, NaN as null), and the definitions."""

    def render(self, report: Report) -> str:
        doc = {
            "title": report.title,
            "runs": report.runs,
            "tables": {
                name: [{c: _clean(row.get(c)) for c, _, _ in t.columns}
                       for row in t.frame.to_dict("records")]
                for name, t in report.tables.items()
            },
            "notes": report.notes,
        }
        return json.dumps(doc, indent=1, default=str) + "\n"
