"""Fitting a table into a terminal width (pure string work, no terminal).

A table's columns come most-important first. :func:`pages` splits them into
pages that each fit ``width`` characters: the leading *key* columns (the
configuration, the GPU count, ...) repeat on every page, the other columns
fill the first page in order and spill onto the next ones. Headers of the
form ``GROUP | SUB`` (the study table: one group per configuration) become
one *grouped* column: the group name on the first header line, the
sub-headers under it, the values in fixed sub-columns — so a configuration
is named once, not once per share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

#: leading columns that identify a row (repeated on every page)
KEY_COLUMNS = ("config", "gpus", "trace", "host", "rank", "op")
SEP = "  "


@dataclass
class Column:
    """One displayed column: header lines, cells, alignment."""
    header: List[str]
    cells: List[str]
    right: bool = True
    key: bool = False

    @property
    def width(self) -> int:
        return max([len(h) for h in self.header] + [len(c) for c in self.cells] + [1])


def columns(table, body: List[List[str]]) -> List[Column]:
    """The table's displayed columns (grouped where headers say ``G | S``)."""
    out: List[Column] = []
    specs = table.columns
    leading = True
    i = 0
    while i < len(specs):
        key, header, _spec = specs[i]
        if " | " in header:
            group = header.split(" | ", 1)[0]
            j = i
            while j < len(specs) and specs[j][1].startswith(group + " | "):
                j += 1
            out.append(_grouped(group, [s[1].split(" | ", 1)[1] for s in specs[i:j]],
                                [[r[k] for k in range(i, j)] for r in body]))
            leading = False
            i = j
            continue
        is_key = leading and key in KEY_COLUMNS
        leading = is_key
        text = [r[i] for r in body]
        out.append(Column([header], text, right=not _is_text(text), key=is_key))
        i += 1
    return out


def _is_text(cells: Sequence[str]) -> bool:
    vals = [c for c in cells if c not in ("", "-")]
    if not vals:
        return False
    return sum(not _numeric(c) for c in vals) > len(vals) / 2


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", "").replace("%", ""))
        return True
    except ValueError:
        return False


def _grouped(group: str, subs: List[str], rows: List[List[str]]) -> Column:
    widths = [max([len(s)] + [len(r[k]) for r in rows]) for k, s in enumerate(subs)]
    inner = sum(widths) + len(SEP) * (len(widths) - 1)
    if len(group) > inner:  # widen the last sub-column so the group name fits over them
        widths[-1] += len(group) - inner
        inner = len(group)
    sub_line = SEP.join(s.rjust(w) for s, w in zip(subs, widths))
    cells = [SEP.join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return Column([group.center(inner), sub_line], cells, right=True)


def pages(cols: List[Column], width: Optional[int], sep: int = len(SEP)) -> List[List[Column]]:
    """Split columns into pages no wider than ``width`` (None: one page).
    Key columns repeat on every page; a column wider than a whole page gets
    a page of its own."""
    if not width:
        return [cols]
    keys = [c for c in cols if c.key]
    rest = [c for c in cols if not c.key]
    base = sum(c.width for c in keys) + sep * len(keys)
    out: List[List[Column]] = []
    page: List[Column] = []
    used = base
    for c in rest:
        need = c.width + (sep if page or keys else 0)
        if page and used + need > width:
            out.append(keys + page)
            page, used = [], base
            need = c.width + (sep if keys else 0)
        page.append(c)
        used += need
    if page or not out:
        out.append(keys + page)
    return out


def limit(split: List[List[Column]], max_pages: int):
    """At most ``max_pages`` pages; returns (pages, headers of the columns left out)."""
    if len(split) <= max_pages:
        return split, []
    dropped = [" ".join(h.strip() for h in c.header) for page in split[max_pages:] for c in page if not c.key]
    return split[:max_pages], dropped


def plain(cols: List[Column]) -> List[str]:
    """Aligned text lines of one page: header lines, a rule, the rows."""
    widths = [c.width for c in cols]
    n_head = max(len(c.header) for c in cols)
    lines = []
    for h in range(n_head):
        parts = []
        for c, w in zip(cols, widths):
            text = c.header[h - (n_head - len(c.header))] if h >= n_head - len(c.header) else ""
            parts.append(text.rjust(w) if c.right else text.ljust(w))
        lines.append(SEP.join(parts).rstrip())
    lines.append(SEP.join("-" * w for w in widths))
    for i in range(len(cols[0].cells) if cols else 0):
        lines.append(SEP.join(c.cells[i].rjust(w) if c.right else c.cells[i].ljust(w)
                              for c, w in zip(cols, widths)).rstrip())
    return lines
