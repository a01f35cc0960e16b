"""Self-contained HTML report with plotly figures (plotly.js inlined once).

Figures only map table columns to marks: stacked exposed shares per GPU
count and configuration, throughput and efficiency vs GPU count, bus
bandwidth vs message size, and a per-rank timeline of a few steps. Every
string that comes from a trace is HTML-escaped, in tables and in figure
labels, and the figure JSON is made safe to embed in <script>."""
from __future__ import annotations

import html
import json
import math
from typing import List

from ..trace.values import missing
from .base import Renderer, cells

_CSS = """
:root{--fg:#1b1b1b;--muted:#555;--bg:#fff;--rule:#c8c8c8;--head:#f1f1f1;--accent:#b35900}
@media (prefers-color-scheme: dark){:root{--fg:#e6e6e6;--muted:#aaa;--bg:#161616;--rule:#444;
  --head:#262626;--accent:#f0a040}}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:var(--fg);
  background:var(--bg);max-width:1600px}
h1{font-size:1.6em} h2{font-size:1.2em;margin-top:2em}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid var(--rule);padding:3px 8px;text-align:right;white-space:nowrap}
th{background:var(--head)} th.group{text-align:center}
td:first-child,th:first-child{text-align:left}
.notes li,.how{font-size:.85em;color:var(--muted)} .how{margin:.2em 0 .6em}
.fig{margin:0 0 1em;min-height:300px}
.finding{margin:.6em 0;padding:.4em .8em;border-left:4px solid var(--accent)} .finding b{color:var(--accent)}
"""
#: Okabe-Ito: distinguishable with colour-blindness, readable on light and dark backgrounds
COLORS = {"comm": "#D55E00", "data": "#0072B2", "compute": "#009E73", "other": "#999999",
          "comm wait": "#E69F00", "optimizer": "#CC79A7", "forward": "#56B4E9", "backward": "#009E73"}
SERIES = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#999999"]
#: plotly layout shared by every figure: transparent backgrounds (the page's
#: colours show through), grid lines that work on both schemes, room for labels
_BASE_LAYOUT = {"paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)",
                "margin": {"t": 50, "r": 30}, "legend": {"orientation": "h", "y": -0.2}}
_AXIS = {"gridcolor": "rgba(128,128,128,0.3)", "zerolinecolor": "rgba(128,128,128,0.5)", "automargin": True}
#: picks the font colour from the page's colour scheme before drawing
_PLOT_JS = """function commprofPlot(id, fig){
  var dark = window.matchMedia && window.matchMedia('(prefers-color-scheme: dark)').matches;
  fig.layout.font = Object.assign({color: dark ? '#e6e6e6' : '#1b1b1b'}, fig.layout.font || {});
  Plotly.newPlot(id, fig.data, fig.layout, {responsive: true, displaylogo: false});
}"""


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
        if report.runs:
            body.append("<p>Runs: " + "; ".join(
            esc(f"{r.get('path', '?')} ({r.get('world_size', '?')} rank{'' if r.get('world_size') == 1 else 's'}, "
                f"{r.get('launcher', '?')})")
                for r in report.runs) + "</p>")
        for i, (title, how, fig) in enumerate(figs):
            body.append(f"<h2>{esc(title)}</h2><p class='how'>{esc(how)}</p><div class='fig' id='fig{i}'></div>")
            body.append(f"<script>commprofPlot('fig{i}', {_safe_json(fig)});</script>")
        for table in report.tables.values():
            body.append(f"<h2>{esc(table.title)}</h2>")
            body.append(self._findings(table) if table.style == "list" else self._table(table))
        body.append("<ul class='notes'>" + "".join(f"<li>{esc(n)}</li>" for n in report.notes) + "</ul>")
        head = f"<meta charset='utf-8'><title>{esc(report.title)}</title><style>{_CSS}</style>"
        if plotly_js:
            head += f"<script>{plotly_js}</script><script>{_PLOT_JS}</script>"
        return f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n" + "\n".join(body) + "\n</body></html>\n"

    @staticmethod
    def _table(table) -> str:
        rows = cells(table)
        if not rows:
            return "<p>(none)</p>"
        headers = [h for _, h, _ in table.columns]
        if any(" | " in h for h in headers):  # grouped columns (the study table): one header per group
            top, sub, i = [], [], 0
            while i < len(headers):
                if " | " not in headers[i]:
                    top.append(f"<th rowspan='2'>{esc(headers[i])}</th>")
                    i += 1
                    continue
                group = headers[i].split(" | ", 1)[0]
                j = i
                while j < len(headers) and headers[j].startswith(group + " | "):
                    sub.append(f"<th>{esc(headers[j].split(' | ', 1)[1])}</th>")
                    j += 1
                top.append(f"<th class='group' colspan='{j - i}'>{esc(group)}</th>")
                i = j
            head = f"<tr>{''.join(top)}</tr><tr>{''.join(sub)}</tr>"
        else:
            head = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
        return f"<div class='scroll'><table><thead>{head}</thead><tbody>{body}</tbody></table></div>"

    @staticmethod
    def _findings(table) -> str:
        out = []
        for r in cells(table):
            out.append(f"<div class='finding'><b>{esc(r[0])} @ {esc(r[1])} GPUs: {esc(r[2])}</b><br>"
                       f"{esc(r[3])}<br><i>{esc(r[4]) if r[4] != '-' else ''}</i></div>")
        return "".join(out) or "<p>(none)</p>"

    # -- figures (dicts in plotly's JSON schema) ---------------------------------
    def figures(self, report):
        """[(title, how to read it, plotly figure dict)]."""
        figs = []
        pm = report.tables.get("pair_matrix")
        if pm is not None and len(pm.frame):
            hosts = [str(h) for h in pm.frame["host"]]
            z = [[None if v != v else float(v) for v in pm.frame[h]] for h in hosts]
            figs.append(("Bandwidth between nodes",
                         "Each cell is one node pair's median bandwidth each way (GB/s); a slow node is a dark "
                         "row and column, a slow link one dark cell pair.",
                         _layout([{"type": "heatmap", "x": hosts, "y": hosts, "z": z, "colorscale": "Viridis",
                                   "colorbar": {"title": {"text": "GB/s"}}, "hoverongaps": False}],
                                 "bandwidth each way between every pair (GB/s, median over iterations)",
                                 {"title": {"text": "node"}}, {"title": {"text": "node"}, "autorange": "reversed"})))
        bd = report.tables.get("breakdown")
        if bd is not None and len(bd.frame):
            figs += self._breakdown_figures(bd.frame)
        co = report.tables.get("collectives")
        if co is not None and len(co.frame) and co.frame["busbw_GBps"].notna().any():
            f = co.frame[co.frame["busbw_GBps"].notna()]
            lo, hi = math.log10(float(f["bytes_per_call"].min())), math.log10(float(f["bytes_per_call"].max()))
            data = []
            for k, ((config, gpus, op), g) in enumerate(f.groupby(["config", "gpus", "op"])):
                data.append({"type": "scatter", "mode": "markers", "name": esc(f"{op} {config} @ {gpus}"),
                             "x": [float(v) for v in g["bytes_per_call"]], "y": [float(v) for v in g["busbw_GBps"]],
                             "marker": {"size": 9, "color": SERIES[k % len(SERIES)]}})
            figs.append(("Bus bandwidth vs message size",
                         "Each point is one collective at one message size (median over calls); points "
                         "that rise to the right are latency-bound at small sizes, flat ones bandwidth-bound.",
                         _layout(data, "bus bandwidth per collective and message size",
                                 {"title": {"text": "bytes per call (log scale)"}, "type": "log", "dtick": 1,
                                  "tickformat": ".1s", "range": [math.floor(lo - 0.3), math.ceil(hi + 0.3)]},
                                 {"title": {"text": "busbw (GB/s, median)"}, "rangemode": "tozero"})))
        pr = report.tables.get("prediction")
        if pr is not None and len(pr.frame):
            figs.append(self._prediction_figure(pr.frame))
        gantt = report.extras.get("gantt")
        if gantt is not None and len(gantt):
            figs.append(self._gantt_figure(gantt))
        timelines = [(name, tl) for name, tl in (report.extras.get("timelines") or {}).items()
                     if tl is not None and len(tl)]
        # the run with the most ranks (ties: the first): where waiting shows
        timelines.sort(key=lambda item: -int(item[1]["rank"].nunique()))
        for name, tl in timelines:
            data = []
            for lane, g in tl.groupby("lane"):
                data.append({"type": "bar", "orientation": "h", "name": esc(lane),
                             "y": [f"rank {int(r)} {esc(lane)}" for r in g["rank"]],
                             "x": [float(v) for v in g["dur_ms"]], "base": [float(v) for v in g["start_ms"]],
                             "text": [esc(n) for n in g["name"]], "hoverinfo": "text+x", "textposition": "none",
                             "marker": {"color": COLORS.get(lane, "#888")}})
            lanes = tl[["rank", "lane"]].drop_duplicates().shape[0]
            fig = _layout(data, f"timeline of a few steps: {esc(name)}", {"title": {"text": "time (ms)"}},
                          {"title": {"text": "rank / activity"}, "autorange": "reversed", "type": "category"})
            fig["layout"].update(barmode="overlay", height=160 + 24 * lanes)
            figs.append((f"Timeline, a few steps: {name}",
                         "One row per rank and activity; bars are when it ran (hover for the name). Gaps in "
                         "compute rows while a comm row is busy are exposed communication.", fig))
            break
        return figs

    @staticmethod
    def _gantt_figure(g):
        data = []
        lanes = list(dict.fromkeys(g["lane"]))
        for j, lane in enumerate(lanes):
            d = g[g["lane"] == lane]
            others = ["#E69F00", "#56B4E9", "#0072B2", "#D55E00", "#999999", "#F0E442"]
            color = {"backward": COLORS["compute"], "optimizer": COLORS["optimizer"]}.get(
                lane, others[j % len(others)])
            data.append({"type": "bar", "orientation": "h", "name": esc(lane),
                         "y": [f"rank {int(r)} {esc(lane)}" for r in d["rank"]],
                         "x": [float(v) for v in d["dur_ms"]], "base": [float(v) for v in d["start_ms"]],
                         "text": [esc(n) for n in d["name"]], "hoverinfo": "text+x", "textposition": "none",
                         "marker": {"color": color}})
        rows = g[["rank", "lane"]].drop_duplicates().shape[0]
        fig = _layout(data, f"gradient buckets: {esc(g.attrs.get('title', ''))}", {"title": {"text": "time (ms)"}},
                      {"title": {"text": "rank / activity"}, "autorange": "reversed", "type": "category"})
        fig["layout"].update(barmode="overlay", height=180 + 22 * rows)
        return ("Gradient buckets, a few steps",
                "One row per rank and bucket: each bar runs from the bucket's all-reduce issue (its gradients "
                "ready) to its completion; the last rank's issue starts the transfer; the part after the "
                "backward bar ends is exposed.", fig)

    @staticmethod
    def _prediction_figure(f):
        data = []
        for k, (config, g) in enumerate(f.groupby("config", sort=False)):
            color = SERIES[k % len(SERIES)]
            p = g[g["kind"] == "predicted"].sort_values("gpus")
            if len(p):
                xs = [int(v) for v in p["gpus"]]
                data.append({"type": "scatter", "mode": "lines", "x": xs + xs[::-1],
                             "y": [float(v) for v in p["samples_per_s_hi"]] +
                                  [float(v) for v in p["samples_per_s_lo"]][::-1],
                             "fill": "toself", "fillcolor": "rgba(128,128,128,0.2)", "line": {"width": 0},
                             "name": esc(config) + " (interval)", "hoverinfo": "skip"})
                data.append({"type": "scatter", "mode": "lines+markers", "name": esc(config) + " (predicted)",
                             "x": xs, "y": [float(v) for v in p["samples_per_s"]],
                             "line": {"color": color, "dash": "dash"}, "marker": {"color": color, "size": 6}})
            m = g[g["kind"] == "measured"].sort_values("gpus")
            data.append({"type": "scatter", "mode": "markers", "name": esc(config) + " (measured)",
                         "x": [int(v) for v in m["gpus"]], "y": [float(v) for v in m["samples_per_s"]],
                         "marker": {"color": color, "size": 11, "symbol": "circle-open", "line": {"width": 2}}})
            for j, (scenario, w) in enumerate(g[g["kind"] == "what-if"].groupby("scenario", sort=False)):
                w = w.sort_values("gpus")
                data.append({"type": "scatter", "mode": "lines", "name": esc(f"{config}: {scenario}"),
                             "x": [int(v) for v in w["gpus"]], "y": [float(v) for v in w["samples_per_s"]],
                             "line": {"color": SERIES[(k + j + 1) % len(SERIES)], "dash": "dot"}})
        ticks = sorted({int(v) for v in f["gpus"]})
        return ("Measured vs predicted throughput",
                "Open circles: measured runs; dashed line: the replayed prediction with its interval (grey); "
                "dotted: what-ifs. Ideal scaling is a straight line of slope 1 on these log axes.",
                _layout(data, "throughput, measured and predicted",
                        {"title": {"text": "GPUs (log scale)"}, "type": "log", "tickvals": ticks,
                         "ticktext": [str(t) for t in ticks]},
                        {"title": {"text": "throughput (samples/s, log scale)"}, "type": "log"}))

    @staticmethod
    def _breakdown_figures(f):
        figs = []
        x = [[esc(c) for c in f["config"]], [f"{int(g)} GPU" + ("s" if int(g) != 1 else "") for g in f["gpus"]]]
        data = [{"type": "bar", "name": name, "x": x, "y": [float(v) for v in f[col]],
                 "marker": {"color": COLORS[name]}}
                for col, name in (("comm_pct", "comm"), ("data_pct", "data"),
                                  ("compute_pct", "compute"), ("other_pct", "other"))]
        fig = _layout(data, "exposed share of step time", {"title": {"text": "configuration / GPU count"}},
                      {"title": {"text": "share of step time (%)"}, "range": [0, 100]})
        fig["layout"]["barmode"] = "stack"
        figs.append(("Exposed share of step time per GPU count",
                     "Each bar is one run's step time split into what the ranks were waiting for; the parts "
                     "add up to 100 %. A comm part that grows with the GPU count is the scaling cost.", fig))
        counts = f.groupby("config")["gpus"].nunique()
        if counts.max() < 2:  # no configuration at two GPU counts: throughput per run, no scaling curve
            data = [{"type": "bar", "name": "samples/s", "x": x, "y": [float(v) for v in f["samples_per_s"]],
                     "marker": {"color": SERIES[0]}, "showlegend": False}]
            figs.append(("Throughput per run",
                         "Samples per second of each run. Scaling (speedup, efficiency) needs a configuration "
                         "measured at two or more GPU counts.",
                         _layout(data, "throughput", {"title": {"text": "configuration / GPU count"}},
                                 {"title": {"text": "throughput (samples/s)"}, "rangemode": "tozero"})))
            return figs
        data = []
        for k, (config, g) in enumerate(f.groupby("config")):
            g = g.sort_values("gpus")
            color = SERIES[k % len(SERIES)]
            data.append({"type": "scatter", "mode": "lines+markers", "name": esc(config),
                         "x": [int(v) for v in g["gpus"]], "y": [float(v) for v in g["samples_per_s"]],
                         "marker": {"color": color, "size": 8}, "line": {"color": color}})
            if len(g) > 1 and g["efficiency_pct"].notna().any():
                data.append({"type": "scatter", "mode": "lines+markers", "name": esc(config) + " (efficiency)",
                             "x": [int(v) for v in g["gpus"]],
                             "y": [None if missing(v) else float(v) for v in g["efficiency_pct"]],
                             "yaxis": "y2", "line": {"dash": "dot", "color": color},
                             "marker": {"symbol": "diamond", "color": color}})
        ticks = sorted({int(v) for v in f["gpus"]})
        fig = _layout(data, "throughput and parallel efficiency",
                      {"title": {"text": "GPUs (log scale)"}, "type": "log", "tickvals": ticks,
                       "ticktext": [str(t) for t in ticks]},
                      {"title": {"text": "throughput (samples/s)"}, "rangemode": "tozero"})
        fig["layout"]["yaxis2"] = dict(_AXIS, title={"text": "parallel efficiency (%)"}, overlaying="y",
                                       side="right", range=[0, 110], dtick=20, showgrid=False)
        figs.append(("Throughput and parallel efficiency vs GPU count",
                     "Solid lines: samples/s (left axis), ideal scaling is a straight line up; dotted lines: "
                     "parallel efficiency (right axis), 100 % = linear speedup.", fig))
        return figs


def _layout(data, title: str, xaxis: dict, yaxis: dict) -> dict:
    layout = dict(_BASE_LAYOUT, title={"text": title, "x": 0.01, "font": {"size": 14}}, height=440,
                  xaxis=dict(_AXIS, **xaxis), yaxis=dict(_AXIS, **yaxis))
    return {"data": data, "layout": layout}
