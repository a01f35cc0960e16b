"""Self-contained HTML report with plotly figures (plotly.js inlined once).

Figures only map table columns to marks: stacked exposed shares per GPU
count and configuration, throughput and efficiency vs GPU count, bus
bandwidth vs message size, and a per-rank timeline of a few steps. Every
string that comes from a trace is HTML-escaped, in tables and in figure
labels, and the figure JSON is made safe to embed in <script>."""
from __future__ import annotations

import html
import json
from typing import List

from ..trace.values import missing
from .base import Renderer, cells

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222}
h1{font-size:1.6em} h2{font-size:1.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right} th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
.notes li{font-size:.85em;color:#444} .fig{margin:1em 0}
.finding{margin:.6em 0;padding:.4em .8em;border-left:4px solid #c60} .finding b{color:#c60}
"""
COLORS = {"comm": "#d62728", "data": "#1f77b4", "compute": "#2ca02c", "other": "#bbbbbb",
          "comm wait": "#ff9896"}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def _safe_json(obj) -> str:
    text = json.dumps(obj, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class HtmlRenderer(Renderer):
    name = "html"
    extensions = (".html", ".htm")

    def render(self, report) -> str:
        try:
            from plotly.offline import get_plotlyjs
            plotly_js = get_plotlyjs()
        except ImportError:  # tables only
            plotly_js = None
        figs = self.figures(report) if plotly_js else []
        body: List[str] = [f"<h1>{esc(report.title)}</h1>"]
        body.append("<p>Runs: " + "; ".join(
            esc(f"{r.get('path', '?')} ({r.get('world_size', '?')} ranks, {r.get('launcher', '?')})")
            for r in report.runs) + "</p>")
        for i, (title, fig) in enumerate(figs):
            body.append(f"<h2>{esc(title)}</h2><div class='fig' id='fig{i}'></div>")
            body.append(f"<script>Plotly.newPlot('fig{i}', {_safe_json(fig)}.data, "
                        f"{_safe_json(fig)}.layout, {{responsive: true}});</script>")
        for table in report.tables.values():
            body.append(f"<h2>{esc(table.title)}</h2>")
            body.append(self._findings(table) if table.style == "list" else self._table(table))
        body.append("<ul class='notes'>" + "".join(f"<li>{esc(n)}</li>" for n in report.notes) + "</ul>")
        head = f"<meta charset='utf-8'><title>{esc(report.title)}</title><style>{_CSS}</style>"
        if plotly_js:
            head += f"<script>{plotly_js}</script>"
        return f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n" + "\n".join(body) + "\n</body></html>\n"

    @staticmethod
    def _table(table) -> str:
        rows = cells(table)
        if not rows:
            return "<p>(none)</p>"
        head = "".join(f"<th>{esc(h)}</th>" for _, h, _ in table.columns)
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    @staticmethod
    def _findings(table) -> str:
        out = []
        for r in cells(table):
            out.append(f"<div class='finding'><b>{esc(r[0])} @ {esc(r[1])} GPUs: {esc(r[2])}</b><br>"
                       f"{esc(r[3])}<br><i>{esc(r[4]) if r[4] != '-' else ''}</i></div>")
        return "".join(out) or "<p>(none)</p>"

    # -- figures (dicts in plotly's JSON schema) ---------------------------------
    def figures(self, report):
        figs = []
        bd = report.tables.get("breakdown")
        if bd is not None and len(bd.frame):
            f = bd.frame
            x = [[esc(c) for c in f["config"]], [str(int(g)) for g in f["gpus"]]]
            data = [{"type": "bar", "name": name, "x": x, "y": [float(v) for v in f[col]],
                     "marker": {"color": COLORS[name]}}
                    for col, name in (("comm_pct", "comm"), ("data_pct", "data"),
                                      ("compute_pct", "compute"), ("other_pct", "other"))]
            figs.append(("Exposed share of step time per GPU count", {
                "data": data, "layout": {"barmode": "stack", "yaxis": {"title": "% of step time"},
                                         "height": 420}}))
            data = []
            for config, g in f.groupby("config"):
                g = g.sort_values("gpus")
                data.append({"type": "scatter", "mode": "lines+markers", "name": esc(config),
                             "x": [int(v) for v in g["gpus"]], "y": [float(v) for v in g["samples_per_s"]]})
                if "efficiency_pct" in g:
                    data.append({"type": "scatter", "mode": "lines+markers", "name": esc(config) + " (eff.)",
                                 "x": [int(v) for v in g["gpus"]],
                                 "y": [None if missing(v) else float(v) for v in g["efficiency_pct"]],
                                 "yaxis": "y2", "line": {"dash": "dot"}})
            ticks = sorted({int(v) for v in f["gpus"]})
            figs.append(("Throughput and parallel efficiency vs GPU count", {
                "data": data, "layout": {"xaxis": {"title": "GPUs", "type": "log", "tickvals": ticks},
                                         "yaxis": {"title": "samples/s"},
                                         "yaxis2": {"title": "efficiency %", "overlaying": "y", "side": "right",
                                                    "range": [0, 110]}, "height": 420}}))
        co = report.tables.get("collectives")
        if co is not None and len(co.frame) and co.frame["busbw_GBps"].notna().any():
            f = co.frame[co.frame["busbw_GBps"].notna()]
            data = []
            for (config, gpus, op), g in f.groupby(["config", "gpus", "op"]):
                data.append({"type": "scatter", "mode": "markers", "name": esc(f"{op} {config} @ {gpus}"),
                             "x": [float(v) for v in g["bytes_per_call"]], "y": [float(v) for v in g["busbw_GBps"]],
                             "marker": {"size": 9}})
            figs.append(("Bus bandwidth vs message size", {
                "data": data, "layout": {"xaxis": {"title": "bytes per call", "type": "log"},
                                         "yaxis": {"title": "busbw GB/s (median)"}, "height": 420}}))
        for name, tl in (report.extras.get("timelines") or {}).items():
            if tl is None or not len(tl):
                continue
            data = []
            for lane, g in tl.groupby("lane"):
                data.append({"type": "bar", "orientation": "h", "name": esc(lane),
                             "y": [f"rank {int(r)} {esc(lane)}" for r in g["rank"]],
                             "x": [float(v) for v in g["dur_ms"]], "base": [float(v) for v in g["start_ms"]],
                             "text": [esc(n) for n in g["name"]], "hoverinfo": "text+x",
                             "marker": {"color": COLORS.get(lane, "#888")}})
            figs.append((f"Timeline, a few steps: {name}", {
                "data": data, "layout": {"barmode": "overlay", "xaxis": {"title": "ms"},
                                         "height": 120 + 22 * tl[["rank", "lane"]].drop_duplicates().shape[0]}}))
            break
        return figs
