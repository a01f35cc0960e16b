from __future__ import annotations

from .base import Renderer, cells


class TerminalRenderer(Renderer):
    """Aligned plain-text tables for a terminal."""
    name = "table"
    extensions = (".txt",)

    def render(self, report) -> str:
        lines = [report.title, "=" * len(report.title), ""]
        for table in report.tables.values():
            if table.style == "list":
                lines += self._list(table)
                continue
            headers = [h for _, h, _ in table.columns]
            body = cells(table)
            widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
            lines.append(table.title)
            lines.append("  ".join(h.rjust(w) if i else h.ljust(w)
                                   for i, (h, w) in enumerate(zip(headers, widths))))
            lines.append("  ".join("-" * w for w in widths))
            for r in body:
                lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                                       for i, (c, w) in enumerate(zip(r, widths))))
            if not body:
                lines.append("(none)")
            lines.append("")
        for note in report.notes:
            lines.append(note)
        return "\n".join(lines).rstrip() + "\n"

    @staticmethod
    def _list(table) -> list:
        lines = [table.title, "-" * len(table.title)]
        for row in cells(table):
            head = " @ ".join(c for c in row[:2] if c and c != "-")
            lines.append(f"* [{head}] {row[2]}" if head else f"* {row[2]}")
            for (_, h, _), c in zip(table.columns[3:], row[3:]):
                if c and c != "-":
                    lines.append(f"    {h}: {c}")
        if len(lines) == 2:
            lines.append("(none)")
        lines.append("")
        return lines
