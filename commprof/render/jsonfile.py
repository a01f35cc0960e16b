from __future__ import annotations

import json

from ..trace.values import plain
from .base import Renderer


class JsonRenderer(Renderer):
    """Machine-readable: runs' metadata, every table as a list of records
    (raw values, NaN and infinities as null), and the definitions."""
    name = "json"
    extensions = (".json",)

    def render(self, report) -> str:
        doc = {
            "title": report.title,
            "runs": report.runs,
            "tables": {
                name: [{c: plain(row.get(c), inf_as_none=True) for c, _, _ in t.columns}
                       for row in t.frame.to_dict("records")]
                for name, t in report.tables.items()
            },
            "notes": report.notes,
        }
        return json.dumps(doc, indent=1, default=str) + "\n"
