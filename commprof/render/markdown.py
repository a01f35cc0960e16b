from __future__ import annotations

from .base import Renderer, cells


def _esc(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


class MarkdownRenderer(Renderer):
    """GitHub-flavoured Markdown tables."""
    name = "md"
    extensions = (".md",)

    def render(self, report) -> str:
        lines = [f"# {_esc(report.title)}", ""]
        for table in report.tables.values():
            lines.append(f"## {_esc(table.title)}")
            lines.append("")
            lines.append("| " + " | ".join(_esc(h) for _, h, _ in table.columns) + " |")
            lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(table.columns))) + "|")
            for r in cells(table):
                lines.append("| " + " | ".join(_esc(c) for c in r) + " |")
            lines.append("")
        for note in report.notes:
            lines.append(f"- {_esc(note)}")
        return "\n".join(lines).rstrip() + "\n"
