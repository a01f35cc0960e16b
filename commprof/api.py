"""Python API for notebooks: ``commprof.load()``.

Example::

    import commprof
    t = commprof.load("run/trace.parquet")            # nothing read yet
    t.meta["world_size"], t.ranks[0]["host"]
    t.filter(ranks=[0, 1], steps=(10, 20)).events()   # pandas, filtered while reading
    t.breakdown()                                     # the report's tables as DataFrames
    t.collectives(); t.stragglers(); t.skew()
    t.plot_breakdown().show(); t.plot_timeline(steps=(10, 12)).show()
    commprof.compare([t4, t8, t16]).breakdown()       # several runs side by side
    commprof.diff(t_native, t_dali)                   # what grew or shrank
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import assemble as _assemble
from .trace import parquet as _parquet

PathLike = Union[str, "Trace"]
CHUNK_ROWS = _parquet.CHUNK_ROWS


@dataclass(frozen=True)
class Filter:
    """Composable event filter, applied while reading (before analysis)."""
    ranks: Optional[Tuple[int, ...]] = None
    steps: Optional[Tuple[int, int]] = None          # [first, last] inclusive
    window: Optional[Tuple[int, int]] = None         # [t0, t1) ns on the trace clock
    categories: Optional[Tuple[str, ...]] = None

    def and_(self, other: "Filter") -> "Filter":
        def pick(a, b):
            return b if b is not None else a
        return Filter(pick(self.ranks, other.ranks), pick(self.steps, other.steps),
                      pick(self.window, other.window), pick(self.categories, other.categories))

    def mask(self, table: pa.Table):
        m = None

        def both(x, y):
            return y if x is None else pc.and_(x, y)
        if self.ranks is not None:
            m = both(m, pc.is_in(table.column("rank"), value_set=pa.array(self.ranks, pa.int32())))
        if self.steps is not None:
            lo, hi = self.steps
            m = both(m, pc.and_(pc.greater_equal(table.column("step"), lo),
                                pc.less_equal(table.column("step"), hi)))
        if self.window is not None:
            t0, t1 = self.window
            m = both(m, pc.and_(pc.less(table.column("t_start"), t1), pc.greater(table.column("t_end"), t0)))
        if self.categories is not None:
            m = both(m, pc.is_in(table.column("category").cast(pa.string()),
                                 value_set=pa.array(self.categories, pa.string())))
        return m


@dataclass
class Trace:
    """One recorded run. Events are read lazily, in chunks of whole ranks,
    with the filter applied while reading."""
    path: str
    meta: dict
    ranks: List[dict]
    flt: Filter = field(default_factory=Filter)
    #: a job recorded as one folder per node: every folder (``path`` is the first)
    parts: Tuple[str, ...] = ()
    #: analysed reports by (warmup, batch_size, group_by, peak_tflops) and run
    #: analyses by (warmup, batch_size, group_by, chunk_rows); a filtered
    #: view (``filter()``) starts with empty caches
    _reports: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _analyses: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- reading -------------------------------------------------------------
    def chunks(self, columns: Optional[Sequence[str]] = None, max_rows: int = CHUNK_ROWS,
               skip_empty: bool = False):
        """Arrow tables of whole ranks, filtered (``skip_empty``: columns
        without a value may come as Arrow null-type columns, see
        :func:`commprof.trace.parquet.iter_file_chunks`)."""
        read = None
        if columns is not None:
            read = list(columns) + [c for c in ("rank", "step", "category", "t_start", "t_end")
                                    if c not in columns]
        for table in (t for part in (self.parts or (self.path,))
                      for t in _assemble.iter_chunks(part, read, max_rows, skip_empty)):
            if self.flt.ranks is not None and table.num_rows:
                r = set(pc.unique(table.column("rank")).to_pylist())
                if not r & set(self.flt.ranks):
                    continue
            m = self.flt.mask(table)
            table = table.filter(m) if m is not None else table
            yield table.select(list(columns)) if columns is not None else table

    def arrow(self, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """All (filtered) events as one Arrow table."""
        parts = list(self.chunks(columns))
        if not parts:
            return pa.table({})
        return pa.concat_tables(parts, promote_options="permissive").unify_dictionaries()

    def events(self, columns: Optional[Sequence[str]] = None) -> pd.DataFrame:
        """All (filtered) events as a pandas DataFrame (categorical strings)."""
        return self.arrow(columns).to_pandas()

    def filter(self, ranks: Optional[Iterable[int]] = None, steps: Optional[Tuple[int, int]] = None,
               window: Optional[Tuple[int, int]] = None, categories: Optional[Iterable[str]] = None) -> "Trace":
        """A view of this trace restricted to some ranks, an inclusive step
        range, a time window and/or event categories (combinable)."""
        f = Filter(tuple(int(r) for r in ranks) if ranks is not None else None,
                   tuple(steps) if steps is not None else None,
                   tuple(window) if window is not None else None,
                   tuple(categories) if categories is not None else None)
        return replace(self, flt=self.flt.and_(f))

    # -- analyzers -----------------------------------------------------------
    def analysis(self, warmup: int = 1, batch_size: Optional[int] = None,
                 group_by: Optional[Sequence[str]] = None, chunk_rows: int = CHUNK_ROWS):
        """The run analysed (read once, in chunks of whole ranks of about
        ``chunk_rows`` events; kept for the same arguments)."""
        key = (warmup, batch_size, tuple(group_by) if group_by else None, chunk_rows)
        if key not in self._analyses:
            self._analyses[key] = self._analyse(warmup, batch_size, group_by, chunk_rows)
        return self._analyses[key]

    def _analyse(self, warmup, batch_size, group_by, chunk_rows):
        from .analyzers.report import REPORT_COLUMNS, analyze_run
        from .analyzers.run import COMM_COLUMNS
        from .progress import Bar

        with Bar(f"reading {os.path.basename(self.path.rstrip(os.sep))}", len(self.ranks) or None, "ranks") as bar:
            def chunks():
                for table in self.chunks(REPORT_COLUMNS, chunk_rows, skip_empty=True):
                    yield table
                    bar.advance(len(pc.unique(table.column("rank"))) if table.num_rows else 0)

            def collectives():      # a second pass, a run on several hosts only (analyzers/run.py)
                return self.chunks(COMM_COLUMNS + ["step", "category"], chunk_rows)

            return analyze_run(chunks(), self.meta, self.ranks, self.path, warmup=warmup, batch_size=batch_size,
                               group_by=group_by, reread=collectives)

    def report(self, warmup: int = 1, batch_size: Optional[int] = None,
               group_by: Optional[Sequence[str]] = None, peak_tflops: Optional[float] = None):
        """The full report (tables as DataFrames in ``.tables[name].frame``),
        computed once per set of arguments and kept. ``peak_tflops``: the
        GPU's peak for MFU (default: known devices by name)."""
        key = (warmup, batch_size, tuple(group_by) if group_by else None, peak_tflops)
        if key not in self._reports:
            self._reports[key] = Comparison([self], warmup, batch_size, group_by,
                                            peak_tflops=peak_tflops).report()
        return self._reports[key]

    def breakdown(self, **kw) -> pd.DataFrame:
        """Per GPU count: exposed / busy shares, step time, throughput, scaling."""
        return self.report(**kw).tables["breakdown"].frame

    def per_step(self) -> pd.DataFrame:
        """One row per (rank, step): exposed and busy times in ns."""
        from .analyzers import breakdown

        return breakdown.per_step(self.arrow())

    def collectives(self, **kw) -> pd.DataFrame:
        return self.report(**kw).tables["collectives"].frame

    def skew(self, **kw) -> pd.DataFrame:
        return self.report(**kw).tables["skew"].frame

    def stragglers(self, **kw) -> pd.DataFrame:
        return self.report(**kw).tables["stragglers"].frame

    def bottlenecks(self, **kw) -> pd.DataFrame:
        return self.report(**kw).tables["bottlenecks"].frame

    # -- the fine grain (analyzers/buckets.py) -----------------------------------
    def buckets(self, **kw) -> pd.DataFrame:
        """Per gradient bucket: bytes, ready instant after the backward's
        start, waiting for peers vs transfer, exposed tail, last rank."""
        t = self.report(**kw).tables.get("buckets")
        return t.frame if t is not None else pd.DataFrame()

    def critical_path(self, per_step: bool = False, warmup: int = 1) -> pd.DataFrame:
        """What each step's end waited for: the gate table (share of steps
        per bucket and rank), or one row per step with its whole chain."""
        from .analyzers import buckets as bk

        a = self.analysis(warmup)
        paths = bk.critical_paths(a.fine_phases, a.fine_grads, a.world_size)
        if per_step:
            return paths
        return bk.gate_table(paths, bk.bucket_table(a.fine_phases, a.fine_grads, a.world_size,
                                                    a.meta.get("ddp_buckets")))

    def fsdp_layers(self, **kw) -> pd.DataFrame:
        """Sharded data parallel (FSDP2, FSDP1): per layer, its gathers,
        re-gathers and reductions per step and rank, exposed time, the
        share issued ahead (prefetch), the tail after backward and how
        often the step's end waited last for it (analyzers/fsdp.py)."""
        t = self.report(**kw).tables.get("fsdp_layers")
        return t.frame if t is not None else pd.DataFrame()

    def update_delays(self, **kw) -> pd.DataFrame:
        """Delays between weight updates per rank: distribution and what fills them."""
        t = self.report(**kw).tables.get("updates")
        return t.frame if t is not None else pd.DataFrame()

    def plot_buckets(self, steps: Optional[Tuple[int, int]] = None, ranks: int = 4, warmup: int = 1):
        """Per-bucket Gantt: each rank's backward and optimizer and every
        gradient collective (issue to completion, aligned clocks) for a few
        steps (default: 3 from the middle of the run)."""
        import plotly.graph_objects as go

        from .analyzers import buckets as bk

        a = self.analysis(warmup)
        ph, gr = a.fine_phases, a.fine_grads
        n = 3
        if steps is not None:
            ph = ph[(ph["step"] >= steps[0]) & (ph["step"] <= steps[1])]
            gr = gr[(gr["step"] >= steps[0]) & (gr["step"] <= steps[1])]
            n = steps[1] - steps[0] + 1
        bars = bk.gantt(ph, gr, steps=n, ranks=ranks)
        fig = go.Figure()
        for lane, g in bars.groupby("lane", sort=False):
            fig.add_bar(orientation="h", name=lane, y=[f"rank {r} {lane}" for r in g["rank"]], x=g["dur_ms"],
                        base=g["start_ms"], text=g["name"], hoverinfo="text+x", textposition="none")
        fig.update_layout(barmode="overlay", xaxis_title="time (ms)", yaxis={"autorange": "reversed"},
                          title="gradient buckets: backward, all-reduces, optimizer",
                          height=160 + 22 * bars[["rank", "lane"]].drop_duplicates().shape[0])
        return fig

    # -- plots (plotly figures) -----------------------------------------------
    def plot_breakdown(self, **kw):
        return compare([self], **kw).plot_breakdown()

    def plot_timeline(self, steps: Optional[Tuple[int, int]] = None, max_ranks: int = 8):
        """Per-rank timeline (data / compute / comm lanes) of a few steps."""
        import plotly.graph_objects as go

        from .analyzers.timeline import LANES

        view = self.filter(steps=steps) if steps is not None else self
        ev = view.events(["rank", "step", "category", "name", "t_start", "t_end"])
        ev = ev[ev["category"].astype(str).isin(list(LANES))]
        ranks = sorted(ev["rank"].unique())[:max_ranks]
        ev = ev[ev["rank"].isin(ranks)]
        fig = go.Figure()
        if ev.empty:
            return fig
        t0 = ev["t_start"].min()
        for lane, g in ev.groupby(ev["category"].astype(str).map(LANES)):
            fig.add_bar(orientation="h", name=lane, y=[f"rank {r} {lane}" for r in g["rank"]],
                        x=(g["t_end"] - g["t_start"]) / 1e6, base=(g["t_start"] - t0) / 1e6,
                        text=g["name"].astype(str), hoverinfo="text+x")
        fig.update_layout(barmode="overlay", xaxis_title="ms", height=150 + 25 * len(ranks) * 4)
        return fig


@dataclass
class Comparison:
    """Several runs analysed together (the per-GPU-count table)."""
    traces: List[Trace]
    warmup: int = 1
    batch_size: Optional[int] = None
    group_by: Optional[Sequence[str]] = None
    #: (where, results) of pairs benches run beside the study (``commprof sweep --pairs``)
    pairs: Sequence = ()
    #: the GPU's peak TFLOP/s for MFU (None: known devices by name)
    peak_tflops: Optional[float] = None
    _report: object = None
    _runs: object = None
    #: seconds of the last analysis: per run its stages, then the report's tables
    timings: object = None

    def report(self):
        if self._report is None:
            import time

            t0 = time.perf_counter()
            self._report, self._runs = analyze(self.traces, self.warmup, self.batch_size, self.group_by,
                                               pairs=self.pairs, peak_tflops=self.peak_tflops)
            total = time.perf_counter() - t0
            stages = [(f"{os.path.basename(str(r.meta.get('path', '')))}: {k}", v)
                      for r in (self._runs or []) for k, v in r.timings.items()]
            runs_wall = sum(v for k, v in stages if not k.endswith("CPU in the workers"))
            self.timings = stages + [("open, tables and findings", max(total - runs_wall, 0.0)), ("total", total)]
        return self._report

    def breakdown(self) -> pd.DataFrame:
        return self.report().tables["breakdown"].frame

    def study(self) -> pd.DataFrame:
        t = self.report().tables.get("study")
        return t.frame if t is not None else pd.DataFrame()

    def collectives(self) -> pd.DataFrame:
        return self.report().tables["collectives"].frame

    def bottlenecks(self) -> pd.DataFrame:
        return self.report().tables["bottlenecks"].frame

    def plot_breakdown(self):
        """Stacked exposed shares per GPU count and configuration."""
        import plotly.graph_objects as go

        f = self.breakdown()
        fig = go.Figure()
        x = [f["config"].tolist(), [str(g) for g in f["gpus"]]]
        for col, name in (("comm_pct", "comm"), ("data_pct", "data"), ("compute_pct", "compute"),
                          ("other_pct", "other")):
            fig.add_bar(name=name, x=x, y=f[col])
        fig.update_layout(barmode="stack", yaxis_title="% of step time")
        return fig

    def plot_scaling(self):
        """Throughput and efficiency vs GPU count, one line per configuration."""
        import plotly.graph_objects as go

        f = self.breakdown()
        fig = go.Figure()
        for config, g in f.groupby("config"):
            g = g.sort_values("gpus")
            fig.add_scatter(x=g["gpus"], y=g["samples_per_s"], name=f"{config} samples/s", mode="lines+markers")
            fig.add_scatter(x=g["gpus"], y=g["efficiency_pct"], name=f"{config} efficiency %",
                            mode="lines+markers", yaxis="y2", line={"dash": "dot"})
        fig.update_layout(xaxis={"title": "GPUs", "type": "log"}, yaxis_title="samples/s",
                          yaxis2={"title": "efficiency %", "overlaying": "y", "side": "right"})
        return fig


def join_jobs(traces: Sequence["Trace"]) -> List["Trace"]:
    """Folders that hold parts of one job (one ``commprof record`` per node,
    each writing its own folder) become one Trace: same run id, same world
    size, disjoint ranks. Anything else stays as it is."""
    out: List[Trace] = []
    by_id: dict = {}
    for t in traces:
        rid, world = t.meta.get("run_id"), t.meta.get("world_size")
        ranks = {int(m["rank"]) for m in t.ranks if "rank" in m}
        key = (rid, world)
        j = by_id.get(key) if rid else None
        if j is not None and not (ranks & j[1]) and t.flt == out[j[0]].flt:
            i, seen = j
            base = out[i]
            meta = dict(base.meta)
            meta["ranks_recorded"] = len(seen | ranks)
            meta["hosts"] = sorted(set(base.meta.get("hosts") or []) | set(t.meta.get("hosts") or []))
            meta["parts"] = list(base.parts or (base.path,)) + list(t.parts or (t.path,))
            out[i] = Trace(base.path, meta, base.ranks + t.ranks, base.flt, tuple(meta["parts"]))
            by_id[key] = (i, seen | ranks)
            continue
        if rid:
            by_id[key] = (len(out), ranks)
        out.append(t)
    return out


def load(paths: Union[PathLike, Sequence[PathLike]]) -> Union[Trace, Comparison]:
    """Open one run (a ``Trace``) or several (a ``Comparison``).

    A path is a merged ``trace.parquet``, a record folder or a shard folder.
    A study folder (``commprof sweep``'s output) opens as a ``Comparison``
    of its runs. Nothing is read but metadata until a method needs events."""
    if isinstance(paths, (str, Trace)) or hasattr(paths, "__fspath__"):
        paths = [paths]
        expanded = _expand(paths)
        if len(expanded) == 1:
            return _one(expanded[0])
    traces = open_runs(paths)
    return traces[0] if len(traces) == 1 else compare(traces, pairs=study_pairs(paths))


def study_runs(folder: str) -> List[str]:
    """The record folders of a study (``commprof sweep``'s
    ``STUDY/<configuration>/<N>/``, or any tree of record folders) that
    hold a merged trace, sorted; attempts set aside (``*.failed-*``) are
    left out."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if ".failed-" not in d and d not in ("shards", ".nodes", "report"))
        if _assemble.TRACE_FILE in files and root != folder:
            out.append(root)
            dirs[:] = []
    return out


def _expand(paths: Sequence[PathLike]) -> List[PathLike]:
    """Paths with every study folder (a folder of record folders, no trace
    of its own) replaced by its runs."""
    out: List[PathLike] = []
    for p in paths:
        if isinstance(p, (str, os.PathLike)) and os.path.isdir(p) and \
                not os.path.isfile(os.path.join(p, _assemble.TRACE_FILE)):
            try:
                _assemble.resolve(str(p))
            except Exception:
                runs = study_runs(str(p))
                if runs:
                    out += runs
                    continue
        out.append(p)
    return out


def study_pairs(paths: Sequence[PathLike]) -> List[tuple]:
    """(path, results) of the pairs bench each study folder holds
    (``commprof sweep --pairs``: ``STUDY/pairs/pairs.json``)."""
    from .sweep import PAIRS

    out = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            continue
        f = os.path.join(str(p), PAIRS, "pairs.json")
        if os.path.isfile(f):
            try:
                with open(f) as fh:
                    doc = json.load(fh)
            except (OSError, ValueError) as exc:
                from .errors import UsageError

                raise UsageError(f"{f}: not a pairs bench result ({exc})")
            if doc.get("mode") == "pairs":
                out.append((f, doc))
    return out


def _one(p: PathLike) -> Trace:
    if isinstance(p, Trace):
        return p
    p = str(p)
    meta, ranks, _kind, _where = _assemble.open_run(p)
    return Trace(p, meta, ranks)


def open_runs(paths: Sequence[PathLike]) -> List[Trace]:
    """The runs behind ``paths`` (trace files, record folders, study
    folders expanded into their runs, Trace objects), a job recorded as one
    folder per node joined into one run."""
    return join_jobs([_one(p) for p in _expand(list(paths))])


def compare(traces: Sequence[PathLike], warmup: int = 1, batch_size: Optional[int] = None,
            group_by: Optional[Sequence[str]] = None, pairs: Optional[Sequence] = None,
            peak_tflops: Optional[float] = None) -> Comparison:
    """Analyse several runs together (grouped by configuration and GPU count);
    a study folder's pairs bench (``commprof sweep --pairs``) comes along.
    ``peak_tflops``: the GPU's peak for MFU (default: known devices by name)."""
    return Comparison(open_runs(traces), warmup, batch_size, group_by,
                      pairs=study_pairs(traces) if pairs is None else pairs, peak_tflops=peak_tflops)


def analyze(paths: Sequence[PathLike], warmup: int = 1, batch_size: Optional[int] = None,
            group_by: Optional[Sequence[str]] = None, chunk_rows: int = CHUNK_ROWS,
            pairs: Optional[Sequence] = None, peak_tflops: Optional[float] = None):
    """Analyse runs together: (Report, [RunAnalysis per run]). What
    ``commprof report`` prints is this report."""
    from .analyzers.report import build_report

    traces = open_runs(paths)
    if len(traces) == 1 and is_bench(traces[0]) and traces[0].meta.get("bench_mode") == "pairs":
        return pairs_of(traces[0]), []
    if traces and all(is_bench(t) for t in traces):
        return model(traces), []
    if any(is_bench(t) for t in traces):
        from .errors import UsageError

        raise UsageError("benchmark traces (commprof bench -o) are reported on their own, not beside training runs")
    from .analyzers.scaling import adopt_baselines

    runs = adopt_baselines([t.analysis(warmup, batch_size, group_by, chunk_rows) for t in traces], group_by)
    return build_report(runs, warmup, pairs=study_pairs(paths) if pairs is None else pairs,
                        peak_tflops=peak_tflops), runs


def _comm_frame(t: "Trace") -> pd.DataFrame:
    ev = t.filter(categories=["comm"]).events(["rank", "name", "source", "detail", "t_start", "t_end", "dev_start",
                                               "dev_end", "bytes", "dtype", "group", "group_size", "seq",
                                               "blocking"])
    return ev


def pairs_of(t: "Trace"):
    """The report of a pairs bench's trace (``commprof bench --pairs -o DIR``),
    rebuilt from its exchanges."""
    from .analyzers.pairs import samples_from_events
    from .analyzers.report import pairs_report

    hosts = {int(r["rank"]): str(r.get("host") or "?") for r in t.ranks}
    ev = t.filter(categories=["comm"]).events(["rank", "step", "name", "detail", "t_start", "t_end", "bytes",
                                               "group", "seq"])
    samples = samples_from_events(ev, hosts)
    world = int(t.meta.get("world_size") or len(hosts))
    names = [hosts.get(r, "?") for r in range(world)]
    bw = samples[samples["kind"] == "bw"]
    doc = {"world_size": world, "hosts": names, "rounds": sorted(set(samples["round"].tolist())),
           "samples": samples.to_dict("records"),
           "bytes": int(bw["bytes"].max()) if len(bw) else 0,
           "iters": int(bw["iteration"].max()) + 1 if len(bw) else 0, "warmup": "?"}
    return pairs_report(doc)


def is_bench(t: "Trace") -> bool:
    return t.meta.get("source") == "bench"


def fit_model(p: PathLike) -> dict:
    """The alpha-beta model of one trace's collectives (``commprof model``)."""
    from .analyzers.model import fit_trace

    t = _one(p)
    hosts = {int(m["rank"]): str(m.get("host")) for m in t.ranks if "rank" in m}
    m = fit_trace(_comm_frame(t), hosts)
    m.update({"world_size": t.meta.get("world_size"), "source": "bench trace" if is_bench(t) else "trace",
              "trace": t.path})
    return m


def model(paths: Sequence[PathLike], against: Sequence[str] = ()):
    """``commprof model``'s report: each trace's fit, agreement with the given
    models (``commprof bench --model`` JSON files or other traces)."""
    import json

    from .analyzers.collectives import bus_factor
    from .analyzers.model import bench_doc
    from .analyzers.report import model_report
    from .errors import UsageError

    fits, benches = [], []
    for p in paths:
        t = _one(p)
        fits.append((t.path, fit_model(t)))
        if is_bench(t):
            doc = bench_doc(_comm_frame(t), t.meta)
            rows = []
            for r in doc["rows"]:
                for mode in ("out_of_place", "in_place"):
                    m = r.get(mode)
                    if m:
                        alg = r["bytes"] / (m["time_us"] * 1e-6) / 1e9
                        rows.append({"op": r["op"], "dtype": r["dtype"], "bytes": r["bytes"], "mode": mode,
                                     "calls": m["calls"], "time_us": m["time_us"], "median_us": m["median_us"],
                                     "algbw_GBps": alg,
                                     "busbw_GBps": float(alg * bus_factor(r["op"], doc["world_size"]))})
            benches.append((t.path, rows))
    refs = []
    for a in against:
        if str(a).endswith(".json"):
            try:
                with open(a) as fh:
                    refs.append((str(a), json.load(fh)))
            except (OSError, ValueError) as exc:
                raise UsageError(f"{a}: not a model JSON file ({exc})")
        else:
            refs.append((str(a), fit_model(a)))
    return model_report(fits, refs, benches)


def diff(a: PathLike, b: PathLike, warmup: int = 1) -> pd.DataFrame:
    """What grew or shrank from run A to run B: per category (exposed ms per
    step and share of step time) and per collective (calls/step, bytes/call,
    mean latency). Columns: what, metric, a, b, delta, delta_pct."""
    from .analyzers.diff import diff_tables

    ra, rb = compare([a], warmup=warmup).report(), compare([b], warmup=warmup).report()
    return diff_tables(ra.tables["breakdown"].frame, rb.tables["breakdown"].frame,
                       ra.tables["collectives"].frame, rb.tables["collectives"].frame)
