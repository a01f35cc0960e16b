"""Tables for a terminal: fitted to its width, most important columns first.

Two faces of one layout (:mod:`.layout`): plain aligned text (logs, files,
pipes, ``--plain``) and, on a terminal, ``rich`` tables with the
configuration columns and the bottleneck findings highlighted. Columns that
do not fit ``width`` continue in a second table under the first (the key
columns repeated); ``width=None`` (``--wide``, or output that is not a
terminal) keeps every table in one piece."""
from __future__ import annotations

import io
import textwrap
from typing import List, Optional

from .layout import SEP, columns, limit, pages, plain
from .base import Renderer, cells


class TerminalRenderer(Renderer):
    """Aligned text tables; ``width`` to fit, ``color`` for rich output."""
    name = "table"
    extensions = (".txt",)

    #: a fitted table shows at most this many pieces (the rest: --wide or --columns)
    max_pages = 2

    def __init__(self, width: Optional[int] = None, color: bool = False, **_ignored):
        self.width = width if width and width > 20 else None
        self.color = color

    def _pages(self, table, body, sep):
        split = pages(columns(table, body), self.width, sep=sep)
        split, dropped = limit(split, self.max_pages if self.width else len(split))
        more = (f"({len(dropped)} more column{'s' if len(dropped) > 1 else ''}: {', '.join(dropped)}; "
                "see them with --wide or --columns)") if dropped else ""
        return split, more

    def render(self, report) -> str:
        if self.color:
            try:
                return self._rich(report)
            except ImportError:  # rich missing: plain text, same layout
                pass
        return self._plain(report)

    # -- plain text -------------------------------------------------------------
    def _plain(self, report) -> str:
        lines = [report.title, "=" * len(report.title), ""]
        for table in report.tables.values():
            if table.style == "list":
                lines += self._list(table)
                continue
            body = cells(table)
            if not body:
                lines += [table.title, "(none)", ""]
                continue
            split, more = self._pages(table, body, len(SEP))
            for k, page in enumerate(split):
                lines.append(self._wrap_title(table.title if k == 0 else f"{table.title} (continued)"))
                lines += plain(page)
                lines.append("")
            if more:
                lines[-1:] = self._wrap(more, " ") + [""]
        for note in report.notes:
            lines += self._wrap(note) if self.width else [note]
        return "\n".join(lines).rstrip() + "\n"

    def _wrap(self, text: str, indent: str = "", first: str = "") -> List[str]:
        if not self.width:
            return [first + text]
        return textwrap.wrap(text, self.width, initial_indent=first, subsequent_indent=indent,
                             break_on_hyphens=False) or [first]

    def _wrap_title(self, title: str) -> str:
        return "\n".join(self._wrap(title, "  "))

    def _list(self, table) -> list:
        lines = [table.title, "-" * len(table.title)]
        for row in cells(table):
            head = " @ ".join(c for c in row[:2] if c and c != "-")
            lines += self._wrap(row[2], "  ", f"* [{head}] " if head else "* ")
            for (_, h, _), c in zip(table.columns[3:], row[3:]):
                if c and c != "-":
                    lines += self._wrap(c, " " * 6, f"    {h}: ")
        if len(lines) == 2:
            lines.append("(none)")
        lines.append("")
        return lines

    # -- rich -------------------------------------------------------------------
    def _rich(self, report) -> str:
        from rich import box
        from rich.console import Console
        from rich.padding import Padding
        from rich.table import Table
        from rich.text import Text

        buf = io.StringIO()
        console = Console(file=buf, width=self.width or 10_000, force_terminal=True, color_system="standard",
                          highlight=False, soft_wrap=not self.width)
        console.print(Text(report.title, style="bold"))
        console.print()
        for table in report.tables.values():
            if table.style == "list":
                console.print(Text(table.title, style="bold underline"))
                rows = cells(table)
                for row in rows:
                    head = " @ ".join(c for c in row[:2] if c and c != "-")
                    line = Text("● ", style="yellow")
                    if head:
                        line.append(f"[{head}] ", style="cyan")
                    line.append(row[2], style="bold yellow")
                    console.print(line)
                    for (_, h, _), c in zip(table.columns[3:], row[3:]):
                        if c and c != "-":
                            console.print(Padding(Text.assemble((f"{h}: ", "dim"), c), (0, 0, 0, 4)))
                if not rows:
                    console.print("(none)")
                console.print()
                continue
            body = cells(table)
            if not body:
                console.print(Text(table.title, style="bold"))
                console.print("(none)\n")
                continue
            # rich puts 3 characters between columns (padding 1 + divider + padding 1)
            split, more = self._pages(table, body, 3)
            for k, page in enumerate(split):
                title = table.title if k == 0 else f"{table.title} (continued)"
                # the title above the table, wrapped to the terminal (not squeezed to the table's width)
                console.print(Text(title, style="bold"))
                t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
                for c in page:
                    t.add_column("\n".join(c.header), justify="right" if c.right else "left", no_wrap=True,
                                 style="cyan" if c.key else None, min_width=c.width,
                                 vertical="bottom")
                for i in range(len(page[0].cells)):
                    t.add_row(*[c.cells[i] for c in page])
                console.print(t)
                console.print()
            if more:
                console.print(Text(more, style="dim"))
                console.print()
        for note in report.notes:
            console.print(Text(note, style="dim"))
        return buf.getvalue()
