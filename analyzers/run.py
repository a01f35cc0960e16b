"""One run analysed: its events read once, in chunks of whole ranks.

Each chunk is swept by a worker (:func:`sweep`: the per-step breakdown and
the rows every other analysis needs from that chunk, as a
:class:`ChunkRows`); small accumulators fold those rows as they come
(:class:`Frames`, :class:`FineGrain`, :class:`Timeline`; the
:class:`Collectives`, the largest fold, in a thread of their own, in the
chunks' order: :class:`_Lane`). When every chunk is in, the hosts' clocks are aligned
from the collectives, each accumulator finishes on the aligned clocks,
and :class:`RunAnalysis` is built by keyword. The tables across runs live
in :mod:`.scaling`.

A new per-run metric is one field of :class:`ChunkRows` (filled in
:func:`sweep`), one accumulator and one field of :class:`RunAnalysis`.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import breakdown, buckets, clocks, fsdp, kernels, nodes, slowlinks, stragglers
from .collectives import CollectiveStats, _codes as _dict_codes, _run_sums, _sums_per_key, call_times
from .events import CAT_CODES, Events, _codes, _np, device_times
from .timeline import timeline, window
from ..trace.metadata import batch_size as infer_batch_size
from ..trace.schema import CAT, CATEGORIES

DEFAULT_GROUP_BY = ("framework", "loader", "model", "batch_size")
#: per-step rows kept for the whole run in these dtypes
_COMPACT = {"step_time": np.float32, "data": np.float32, "comm": np.float32, "compute": np.float32,
            "other": np.float32, "comm_busy": np.float32, "data_busy": np.float32,
            "compute_busy": np.float32, "overlap": np.float32, "items": np.float32,
            "rank": np.int32, "step": np.int32}
#: the columns of the collectives a multi-host run keeps until its clocks
#: are aligned (CollectiveStats, clock alignment, per-scope and link tables)
COMM_COLUMNS = ["rank", "name", "source", "group", "group_size", "seq", "dtype", "t_start", "t_end",
                "dev_start", "dev_end", "bytes", "blocking"]
_ALIGN_COLUMNS = ("rank", "name", "group", "group_size", "seq", "t_start", "t_end", "blocking", "bytes")


@dataclass
class RunAnalysis:
    label: str
    meta: dict
    world_size: int
    steps: pd.DataFrame            # measured per-step rows (compact dtypes)
    colls: CollectiveStats
    batch_size: Optional[int]
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    telemetry: pd.DataFrame = field(default_factory=pd.DataFrame)       # per rank (GPU metrics)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)          # Horovod timeline phases
    kernel_shares: pd.DataFrame = field(default_factory=pd.DataFrame)   # per rank
    gpu_breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)   # per rank (HTA definitions)
    clocks: pd.DataFrame = field(default_factory=pd.DataFrame)          # per host: clock alignment
    offsets: Dict[int, int] = field(default_factory=dict)               # per rank: ns added to its times
    hosts: Dict[int, str] = field(default_factory=dict)                 # per rank: host name
    nodes: pd.DataFrame = field(default_factory=pd.DataFrame)           # per host (multi-host runs)
    scope: pd.DataFrame = field(default_factory=pd.DataFrame)           # collectives intra / inter node
    links: pd.DataFrame = field(default_factory=pd.DataFrame)           # inter-node groups' transfer speeds
    #: the fine grain (analyzers/buckets.py), aligned clocks, <= buckets.MAX_STEPS steps per rank
    fine_phases: pd.DataFrame = field(default_factory=pd.DataFrame)     # per (rank, step)
    fine_grads: pd.DataFrame = field(default_factory=pd.DataFrame)      # per (rank, step, bucket)
    #: sharded data parallel: FSDP's collectives per (rank, step, layer, phase) (analyzers/fsdp.py)
    sharded: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: seconds spent per analysis stage (``commprof report --timings``)
    timings: Dict[str, float] = field(default_factory=dict)
    #: (k, calls): clock alignment, scope, link and per-host bandwidth tables
    #: read one collective instance in k of the run's calls (k = 1: all)
    comm_sample: Tuple[int, int] = (1, 0)
    #: the straggler rows of the per-step metrics (stragglers.step_verdicts),
    #: where they were tested beside the clock alignment; None: in the report
    step_stragglers: Optional[List[dict]] = None
    #: what the breakdown table reads of the steps (breakdown.step_figures),
    #: computed beside the clock alignment; None: in the report
    step_figures: Optional[dict] = None
    #: the fine grain's tables (buckets.run_tables), computed beside the
    #: per-host table; None: in the report
    fine_tables: Optional[dict] = None

    @property
    def n_steps(self) -> int:
        return int(self.steps.groupby("rank").size().max()) if not self.steps.empty else 0

    @property
    def n_ranks(self) -> int:
        return int(self.steps["rank"].nunique()) if not self.steps.empty else 0


def config_label(meta: dict, group_by: Optional[Sequence[str]] = None) -> str:
    keys = list(group_by) if group_by else list(DEFAULT_GROUP_BY) + sorted((meta.get("labels") or {}))
    parts = []
    for k in keys:
        v = meta.get(k)
        if v is None:
            v = (meta.get("labels") or {}).get(k)
        if v is None:
            continue
        parts.append(f"bs={v}" if k == "batch_size" else str(v))
    return " / ".join(parts) if parts else "run"


# -- one chunk ----------------------------------------------------------------
@dataclass
class ChunkRows:
    """What one chunk of whole ranks gives each analysis."""
    #: measured steps without times, compact types: a column at a time
    #: (arrays of their own, no frame built); None: no measured step
    compact: Optional[Dict[str, np.ndarray]] = None
    compiled: int = 0                           # measured steps left out: torch.compile compiled in them
    comm: Optional[pa.Table] = None             # collectives of the measured steps
    kernels: Optional[Tuple[pd.DataFrame, pd.DataFrame]] = None   # (shares, GPU breakdown) per rank
    telemetry: Optional[pd.DataFrame] = None    # GPU metrics per rank
    phases: Optional[pd.DataFrame] = None       # Horovod timeline phases
    fine: Optional[Tuple[pa.Table, pd.DataFrame]] = None      # (events, steps) of the sampled steps
    span: Optional[pd.DataFrame] = None         # per rank: first and last measured step
    comm_times: Optional[tuple] = None          # the collectives' codes and times (collectives.call_times)

    @property
    def empty(self) -> bool:
        """No measured step."""
        return self.compact is None or not len(self.compact["rank"])

    @property
    def compact_steps(self) -> pd.DataFrame:
        """The compact steps as a frame (over the same arrays)."""
        return pd.DataFrame(self.compact, copy=False)


def pa_mask(mask: np.ndarray):
    return pa.array(mask, type=pa.bool_())


def sweep(chunk: pa.Table, warmup: int, multi_host: bool) -> ChunkRows:
    """The per-step breakdown of a chunk and the rows the other analyses
    read from it (pure; runs in a worker thread)."""
    ev = Events.of(chunk)
    # breakdown.measured(breakdown.per_step(ev), warmup), as arrays: no frame of the steps
    steps = breakdown.step_arrays(ev)
    compiled = 0
    if steps is not None:
        keep = breakdown.measured_mask(steps["rank"], steps["step"], warmup)
        hot = _compiling_steps(chunk, ev, steps)
        if hot is not None:     # steps in which torch.compile compiled: left out like the warm-up
            compiled = int((keep & hot).sum())
            keep &= ~hot
        if not keep.all():
            at = np.flatnonzero(keep)       # taken by index: one pass over the mask, not one a column
            steps = {c: v[at] for c, v in steps.items()}
    if steps is None or not len(steps["rank"]):
        return ChunkRows()
    span = _span_of(steps["rank"], steps["step"])
    sampled = buckets.sampled_of(steps)
    masks = _event_masks(ev, span, sampled)
    comm = _comm_rows(chunk, ev.rank, ev.step, ev.cat, span, multi_host, masks[0] if masks is not None else None)
    return ChunkRows({c: v.astype(_COMPACT[c]) for c, v in steps.items() if c not in ("t_start", "t_end")},
                     compiled,
                     comm, _kernel_rows(chunk, ev), _telemetry_rows(chunk, ev), _phase_rows(chunk, ev),
                     _fine_rows(chunk, ev, sampled, masks[1] if masks is not None else None), span,
                     call_times(comm) if comm is not None and comm.num_rows else None)


#: the metric the recorder writes for a step in which torch.compile compiled
COMPILED = "compiled_graphs"


def _compiling_steps(chunk: pa.Table, ev: Events, steps: Dict[str, np.ndarray]) -> Optional[np.ndarray]:
    """Mask of the steps (rows of ``steps``) in which torch.compile compiled
    graphs (a ``compiled_graphs`` metric of that rank and step); None: none."""
    at = np.flatnonzero(ev.cat == CAT["metric"])
    if not len(at):
        return None
    names = chunk.column("name").take(pa.array(at)).to_numpy(zero_copy_only=False).astype(str)
    hit = at[names == COMPILED]
    if not len(hit):
        return None
    pairs = set(zip(ev.rank[hit].tolist(), ev.step[hit].tolist()))
    return np.fromiter(((r, s) in pairs for r, s in zip(steps["rank"].tolist(), steps["step"].tolist())),
                       bool, len(steps["rank"]))


#: the categories the fine grain reads (analyzers/buckets.py)
_FINE_CATS = ("compute", "comm", "data", "wait")


def _event_masks(ev: Events, span: pd.DataFrame, sampled: pd.DataFrame):
    """(collectives of measured steps, events of the fine grain's sampled
    steps): the masks :func:`_comm_rows` and :func:`_fine_rows` compute, in
    one pass of the compiled kernel (analyzers/native.py; None where it is
    not available, or the ranks and steps too far apart for its tables:
    those two then compute their own, the same)."""
    from . import native

    fn = native.kernel("commprof_event_masks")
    n = len(ev.rank)
    if fn is None or not n or span.empty:
        return None
    lo, hi = int(ev.rank.min()), int(ev.rank.max())
    s0, s1 = int(ev.step.min()), int(ev.step.max())
    ranks = span.index.to_numpy(np.int64)
    slots, width = hi - lo + 1, s1 - s0 + 1
    if ranks.min() < lo or ranks.max() > hi or slots * width > max(4 * n, 1 << 20):
        return None
    first = np.ones(slots, np.int64)            # first > last: nothing measured
    last = np.zeros(slots, np.int64)
    first[ranks - lo], last[ranks - lo] = span["min"].to_numpy(np.int64), span["max"].to_numpy(np.int64)
    table = np.zeros(slots * width, np.uint8)
    if len(sampled):
        sr, ss = sampled["rank"].to_numpy(np.int64), sampled["step"].to_numpy(np.int64)
        inside = (sr >= lo) & (sr <= hi) & (ss >= s0) & (ss <= s1)
        table[(sr[inside] - lo) * width + ss[inside] - s0] = 1
    fine_cat = np.zeros(len(CATEGORIES), np.uint8)
    fine_cat[[CAT[c] for c in _FINE_CATS]] = 1
    rank, step = (np.ascontiguousarray(a, np.int64) for a in (ev.rank, ev.step))
    cat = np.ascontiguousarray(ev.cat, np.int8)
    keep_comm, keep_fine = np.empty(n, np.uint8), np.empty(n, np.uint8)
    n_comm = fn(n, rank.ctypes.data, step.ctypes.data, cat.ctypes.data, lo, first.ctypes.data, last.ctypes.data,
                CAT["comm"], fine_cat.ctypes.data, len(fine_cat), s0, width, table.ctypes.data,
                keep_comm.ctypes.data, keep_fine.ctypes.data)
    return (keep_comm.view(bool) if n_comm else None), keep_fine.view(bool)


def _span_of(rank: np.ndarray, step: np.ndarray) -> pd.DataFrame:
    """Per rank, its first and last measured step
    (``steps.groupby("rank")["step"].agg(["min", "max"])``; by numpy where
    the steps come by rank, as per_step gives them)."""
    first = breakdown.rank_runs(rank)
    if first is None:
        return pd.DataFrame({"rank": rank, "step": step}).groupby("rank")["step"].agg(["min", "max"])
    return pd.DataFrame({"min": np.minimum.reduceat(step, first), "max": np.maximum.reduceat(step, first)},
                        index=pd.Index(rank[first], name="rank"))


def _comm_rows(chunk, rank: np.ndarray, step: np.ndarray, cat: np.ndarray, span: pd.DataFrame,
               multi_host: bool, keep: Optional[np.ndarray] = None) -> Optional[pa.Table]:
    """The collectives of each rank's measured steps (``span``: per rank,
    its first and last measured step); several hosts: only the columns the
    folds read. ``keep``: their mask where :func:`_event_masks` made it."""
    if keep is None:
        is_comm = cat == CAT["comm"]
        if not is_comm.any() or span.empty:
            return None
        ranks = span.index.to_numpy(np.int64)
        pos = np.clip(np.searchsorted(ranks, rank), 0, len(ranks) - 1)
        keep = is_comm & (ranks[pos] == rank) & (step >= span["min"].to_numpy()[pos]) \
            & (step <= span["max"].to_numpy()[pos])
    if multi_host:      # the columns the folds read, before the rows are taken (no device times: none)
        chunk = chunk.select([c for c in COMM_COLUMNS if c in chunk.column_names and not (
            c.startswith("dev_") and chunk.column(c).null_count == chunk.num_rows)])
    comm = chunk.filter(pa_mask(keep))
    if multi_host:
        comm = comm.select([c for c in comm.column_names if not (
            c.startswith("dev_") and comm.column(c).null_count == comm.num_rows)])
    return comm


def _kernel_rows(chunk, ev: Events):
    is_kernel = ev.cat == CAT["kernel"]
    if not is_kernel.any():
        return None
    kt = chunk.filter(pa_mask(is_kernel | (ev.cat == CAT["step"]))).select(
        ["rank", "step", "category", "name", "detail", "t_start", "t_end"]).to_pandas()
    return kernels.kernel_views(kt, hta_window=True)


def _telemetry_rows(chunk, ev: Events) -> Optional[pd.DataFrame]:
    is_metric = ev.cat == CAT["metric"]
    if not is_metric.any():
        return None
    m = chunk.filter(pa_mask(is_metric)).select(["rank", "name", "value"]).to_pandas()
    m = m[m["name"].astype(str).str.startswith("gpu.")]
    return telemetry_per_rank(m) if len(m) else None


def telemetry_per_rank(m: pd.DataFrame) -> pd.DataFrame:
    """GPU telemetry per rank: mean utilisation, peak memory, mean power,
    mean SM clock, samples."""
    g = m.assign(name=m["name"].astype(str)).groupby(["rank", "name"])["value"]
    mean, peak, n = g.mean().unstack(), g.max().unstack(), g.size().unstack()
    out = pd.DataFrame({"rank": mean.index.astype(int)})
    for col, src, name in (("util_pct", mean, "gpu.util"), ("mem_peak_mib", peak, "gpu.mem_used_mib"),
                           ("power_w", mean, "gpu.power_w"), ("sm_clock_mhz", mean, "gpu.sm_clock_mhz"),
                           ("samples", n, "gpu.util")):
        out[col] = src[name].to_numpy() if name in src else np.nan
    return out


def _phase_rows(chunk, ev: Events) -> Optional[pd.DataFrame]:
    is_phase = ev.cat == CAT["phase"]
    if not is_phase.any():
        return None
    ph = chunk.filter(pa_mask(is_phase)).select(["name", "detail", "t_start", "t_end"]).to_pandas()
    return ph[ph["name"].astype(str) != "ready"].assign(
        name=lambda d: d["name"].astype(str), ms=lambda d: (d["t_end"] - d["t_start"]) / 1e6)


def _fine_rows(chunk, ev: Events, sampled: pd.DataFrame, keep: Optional[np.ndarray] = None):
    """The events of the fine grain's sampled steps (``sampled``: Arrow)
    and those steps; :class:`FineGrain` turns every chunk's into pandas
    rows at once. ``keep``: their events' mask where already made
    (:func:`_event_masks`)."""
    if keep is None:
        keep = np.isin(ev.cat, [CAT[c] for c in _FINE_CATS])
        if keep.any():
            keep &= buckets.in_steps(ev.rank, ev.step, sampled)
    if not keep.any():
        return None
    fe = chunk.filter(pa_mask(keep)).select(
        ["rank", "step", "category", "name", "source", "detail", "t_start", "t_end", "bytes", "blocking"])
    return fe, sampled


# -- accumulators --------------------------------------------------------------
class Frames:
    """Pieces of one table, concatenated at the end."""

    def __init__(self, columns: Sequence[str] = ()):
        self.parts: List[pd.DataFrame] = []
        self.columns = list(columns)

    def add(self, frame: Optional[pd.DataFrame]) -> None:
        if frame is not None:
            self.parts.append(frame)

    def finish(self) -> pd.DataFrame:
        out = pd.concat(self.parts, ignore_index=True) if self.parts else pd.DataFrame(columns=self.columns)
        self.parts = []
        return out


class Columns(Frames):
    """Pieces of one large table (numeric columns), each piece's columns
    copied out of it as it comes and concatenated column by column at the
    end, each piece's column freed once copied: the peak is the table and
    one of its columns, not twice the table."""

    def add(self, frame: Optional[pd.DataFrame]) -> None:
        if frame is not None:
            self.parts.append({c: frame[c].to_numpy(copy=True) for c in frame.columns})

    def add_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        """A piece given as arrays of its own (kept, not copied)."""
        self.parts.append(dict(arrays))

    def finish(self) -> pd.DataFrame:
        if not self.parts:
            return pd.DataFrame(columns=self.columns)
        parts, self.parts = self.parts, []
        return pd.DataFrame({c: np.concatenate([p.pop(c) for p in parts]) for c in list(parts[0])}, copy=False)


#: measured steps up to which their straggler tests and the breakdown table's
#: figures (breakdown.step_figures) run beside the clock
#: alignment and the per-host table (steps x ranks matrices of ~8 B a step:
#: 10 M events, 0.9 M steps; at 100 M events, 9.1 M steps, the report's peak
#: would pass 2 GiB)
SIDE_STEP_ROWS = 2_000_000

#: rows per (collective instance, clock domain) a run on several hosts keeps
#: until its clocks are aligned (~40 B each); past it, with a way to read the
#: trace again, the instances are folded in a second pass
MAX_ARRIVAL_ROWS = 16_000_000


class Collectives:
    """Collective statistics fed chunk by chunk.

    One host: folded as they come (memory bounded by a chunk). Several
    hosts: as they come, everything that needs no clock offsets (the
    per-call sketches, a bounded sample of the calls for the clock
    alignment (:class:`CallSample`), exact call counts, the per-instance
    aggregates) and each instance's arrivals per clock domain
    (:class:`~.collectives.Arrivals`), shifted once the offsets are known:
    one pass over the trace. A run whose arrivals outgrow
    ``MAX_ARRIVAL_ROWS`` (many hosts, few ranks on each) drops its
    instances and, with ``reread`` (a function giving the trace's chunks
    again), folds them in a second pass on aligned clocks, memory bounded
    by a chunk."""

    def __init__(self, multi_host: bool, domain: Optional[Dict[int, int]] = None,
                 reread: Optional[Callable[[], Iterable[pa.Table]]] = None):
        self.stats = CollectiveStats()
        self.multi_host = multi_host
        self.reread = reread if multi_host else None
        self.deferred = multi_host and domain is not None
        if self.deferred and domain is not None:
            self.stats.defer_alignment(domain)
        self.kept: List[pa.Table] = []
        self.spans: List[pd.DataFrame] = []
        self.sample = CallSample(clocks.MAX_ALIGN_CALLS if self.reread is not None or self.deferred else None)
        self.calls = CallCounts()
        self.passes = 1

    def add(self, comm: Optional[pa.Table], span: Optional[pd.DataFrame] = None,
            times: Optional[tuple] = None) -> None:
        """Fold a chunk's collectives (``times``: their
        :func:`~.collectives.call_times` where the sweep took them): the
        per-call sketches and the alignment's sample, then the per-instance
        aggregates and exact counts."""
        if span is not None and self.reread is not None:
            self.spans.append(span)
        if comm is None or comm.num_rows == 0:
            return
        if times is None:
            times = call_times(comm)
        self._add_calls(comm, times)
        self._add_instances(comm, times)

    def _add_calls(self, comm: pa.Table, times: tuple) -> None:
        self.stats.add_calls_of(comm, times)
        if self.multi_host:
            self.sample.add(comm)

    def _add_instances(self, comm: pa.Table, times: tuple) -> None:
        if not self.multi_host:
            self.stats.add_instances_of(comm, times=times)
        elif self.deferred:
            self.stats.add_instances_of(comm, times=times)
            self.calls.add(comm, times)
            if self.reread is not None and self.stats.arrival_rows() > MAX_ARRIVAL_ROWS \
                    and self.stats.arrival_rows(compact=True) > MAX_ARRIVAL_ROWS:
                self.stats.drop_instances()
                self.calls, self.deferred = CallCounts(), False
        elif self.reread is None:
            self.kept.append(comm)

    def aligned_frame(self) -> Optional[pd.DataFrame]:
        """The calls clock alignment and the per-scope / per-link / per-host
        tables read (completion on the device where measured); None on one
        host."""
        return self.sample.frame() if self.multi_host else None

    def finish(self, offsets: Dict[int, int]) -> CollectiveStats:
        if self.deferred:
            self.stats.align(offsets)
        elif self.reread is not None:
            self.passes = 2
            span = pd.concat(self.spans) if self.spans else pd.DataFrame(columns=["min", "max"])
            span = span[~span.index.duplicated()].sort_index()
            for chunk in self.reread():
                cat = _codes(chunk.column("category"), CAT_CODES)
                comm = _comm_rows(chunk, _np(chunk.column("rank"), np.int64), _np(chunk.column("step"), np.int64),
                                  cat, span, True)
                if comm is not None:
                    self.stats.add_instances_of(comm, offsets)
                    if self.sample.stride > 1:
                        self.calls.add(comm)
        while self.kept:                    # each chunk freed once folded
            self.stats.add_instances_of(self.kept.pop(0), offsets)
        return self.stats


class CallSample:
    """The calls of every ``stride``-th sequence number (whole instances on
    every rank), ``stride`` a power of two doubled whenever more than
    ``limit`` calls are kept (None: every call). Kept as Arrow tables and
    made one DataFrame at the end: only the rows the last stride keeps are
    converted (at 10 M events ~0.2 s less of the main thread's time)."""

    def __init__(self, limit: Optional[int] = None):
        self.limit = limit
        self.stride = 1
        self.calls = 0
        self.tables: List[pa.Table] = []
        self.rows = 0
        self._frame: Optional[pd.DataFrame] = None

    def add(self, comm: pa.Table) -> None:
        self.calls += comm.num_rows
        # the columns read, then the rows kept (fewer columns filtered)
        comm = self._keep(comm.select([x for x in comm.column_names if x in _ALIGN_COLUMNS or x.startswith("dev_")]))
        t = comm.select([x for x in _ALIGN_COLUMNS if x in comm.column_names])
        dev = device_times(comm)
        if dev is not None:
            _d0, d1, has = dev
            i = t.column_names.index("t_end")
            t = t.set_column(i, "t_end", pa.array(np.where(has, d1, t.column(i).to_numpy(zero_copy_only=False))))
        self.tables.append(t)
        self.rows += t.num_rows
        while self.limit is not None and self.rows > self.limit:
            self.stride *= 2
            self.tables = [self._keep(x) for x in self.tables]
            self.rows = sum(x.num_rows for x in self.tables)

    def _keep(self, t: pa.Table) -> pa.Table:
        if self.stride == 1 or "seq" not in t.column_names:
            return t
        col = t.column("seq")
        if pa.types.is_integer(col.type):     # a null is 0, kept; the stride is a power of two
            keep = (_np(col, np.int64) & (self.stride - 1)) == 0
        else:
            keep = np.nan_to_num(col.to_numpy(zero_copy_only=False).astype(np.float64)) % self.stride == 0
        return t.filter(pa_mask(keep))

    def frame(self) -> Optional[pd.DataFrame]:
        """The sample as one DataFrame (made once: the tables are freed as
        their columns are converted)."""
        if self._frame is None and self.tables:
            if _same_dictionaries(self.tables):
                whole, self.tables = pa.concat_tables(self.tables, promote_options="permissive"), []
                out = whole.to_pandas(self_destruct=True)
            else:   # categories differing between chunks: as pandas concatenates them (object)
                out = pd.concat([t.to_pandas() for t in self.tables], ignore_index=True)
                self.tables = []
            out.attrs["stride"], out.attrs["calls"] = self.stride, self.calls
            self._frame = out
        return self._frame


def _same_dictionaries(tables: Sequence[pa.Table]) -> bool:
    """Whether every dictionary column holds one dictionary in all tables
    (then one conversion gives the categories each table's would)."""
    for name in tables[0].column_names:
        if not pa.types.is_dictionary(tables[0].schema.field(name).type):
            continue
        chunks = [c for t in tables for c in t.column(name).chunks]
        if chunks and not all(c.dictionary.equals(chunks[0].dictionary) for c in chunks[1:]):
            return False
    return True


class CallCounts:
    """Exact calls and bytes per (op, group), for tables read from a sample."""

    def __init__(self):
        self.sums: Dict[Tuple[str, str], List[float]] = {}

    def add(self, comm: pa.Table, times: Optional[tuple] = None) -> None:
        """``times``: the rows' :func:`~.collectives.call_times`, where taken
        (their op codes and sizes are read from them, not again)."""
        if times is not None:
            op, ops, nbytes = times[0], times[1], times[7]
        else:
            op, ops = _dict_codes(comm.column("name"))
            nbytes = comm.column("bytes").to_numpy(zero_copy_only=False).astype(np.float64)
        grp, groups = _dict_codes(comm.column("group"))
        width = len(groups) + 1
        # per (op, group): calls, summed sizes and sizes known, each sum in row order from 0.0
        got = _run_sums(op, grp, width, width + 1, floats=nbytes)
        if got is not None:
            key, b_sum, calls, b_n = got
        else:
            known = ~np.isnan(nbytes)
            key, b_sum, calls = _sums_per_key((op + 1) * width + grp + 1, np.where(known, nbytes, 0.0))
            b_n = _sums_per_key((op + 1) * width + grp + 1, known.astype(np.float64))[1]
        names, gnames = ["nan"] + list(ops), ["nan"] + list(groups)       # a null as pandas prints it
        for k, c, s_, n in zip(key.tolist(), calls.tolist(), b_sum.tolist(), b_n.tolist()):
            acc = self.sums.setdefault((names[k // width], gnames[k % width]), [0, 0.0, 0])
            acc[0] += c
            acc[1] += s_
            acc[2] += int(n)

    def frame(self) -> pd.DataFrame:
        rows = [(op, g, *v) for (op, g), v in sorted(self.sums.items())]
        return pd.DataFrame(rows, columns=["op", "group", "calls", "bytes_sum", "bytes_n"])


class FineGrain:
    """Per (rank, step) phases and per bucket collectives of the sampled
    steps, shifted onto the aligned clocks at the end."""

    def __init__(self):
        self.events: List[pa.Table] = []
        self.sampled = Frames()
        #: FSDP's collectives per (rank, step, layer, phase) (analyzers/fsdp.py), made in rows()
        self.sharded = pd.DataFrame()

    def add(self, fine) -> None:
        if fine is not None:        # (the sampled steps' events, those steps): a few per cent of a chunk
            self.events.append(fine[0])
            self.sampled.add(fine[1])

    def rows(self) -> Tuple[pd.DataFrame, pd.DataFrame]:
        """(phases, grads) on each rank's own clock (no offsets needed:
        built beside the clock alignment)."""
        if not self.events:
            return pd.DataFrame(columns=buckets.PHASE_COLUMNS), pd.DataFrame(columns=buckets.GRAD_COLUMNS)
        ev = pa.concat_tables(self.events, promote_options="permissive").to_pandas()
        self.events = []
        sampled = self.sampled.finish()
        # sharded data parallel: FSDP's collectives per layer and phase (not buckets)
        self.sharded = fsdp.rank_rows(ev, sampled) if fsdp.is_sharded(ev) else pd.DataFrame()
        return buckets.rank_rows(ev, sampled, sampled=sampled)

    def finish(self, offsets: Dict[int, int], rows: Optional[Tuple[pd.DataFrame, pd.DataFrame]] = None):
        """The rows (:meth:`rows`, or those given) on the aligned clocks."""
        return buckets.shifted(*(rows if rows is not None else self.rows()), offsets)


class Timeline:
    """The timeline of the first chunk's first ranks; several hosts: drawn
    once their clocks are aligned."""

    def __init__(self, multi_host: bool):
        self.multi_host = multi_host
        self.source: Optional[Tuple[pd.DataFrame, pd.DataFrame]] = None
        self.table = pd.DataFrame()

    def wants_more(self) -> bool:
        return self.table.empty and self.source is None

    def add(self, chunk: pa.Table, steps: pd.DataFrame) -> None:
        if not self.wants_more():
            return
        if self.multi_host:
            self.source = (_small_window(chunk, steps), steps)
        else:
            self.table = timeline(_small_window(chunk, steps), steps)

    def finish(self, offsets: Dict[int, int]) -> pd.DataFrame:
        if self.source is not None:
            win = self.source[0].copy()
            off = win["rank"].map(offsets).fillna(0).astype(np.int64)
            win["t_start"] = win["t_start"] + off
            win["t_end"] = win["t_end"] + off
            self.table = timeline(win, self.source[1])
        return self.table


def _small_window(chunk, steps: pd.DataFrame) -> pd.DataFrame:
    """The chunk's events of the ranks and steps the timeline shows (its
    first 8 ranks, the steps :func:`~.timeline.window` picks), as pandas:
    the few rows taken in Arrow, not the ranks' every step converted (10 M
    events: 0.6 M rows, ~45 ms of the reading thread)."""
    def among(name: str, values) -> pa.Array:
        col = chunk.column(name)
        return pc.is_in(col, value_set=pa.array([int(v) for v in values], col.type))

    ranks, chosen = window(steps)
    sub = chunk.filter(pc.and_(among("rank", ranks), among("step", chosen)))
    return sub.select([c for c in ("rank", "step", "category", "name", "t_start", "t_end")
                       if c in sub.column_names]).to_pandas()


@dataclass
class _Accumulators:
    multi_host: bool
    domain: Optional[Dict[int, int]] = None
    reread: Optional[Callable[[], Iterable[pa.Table]]] = None
    steps: Columns = field(default_factory=lambda: Columns(
        [c for c in breakdown.STEP_COLUMNS if c not in ("t_start", "t_end")]))
    telemetry: Frames = field(default_factory=Frames)
    phases: Frames = field(default_factory=Frames)
    kernel_shares: Frames = field(default_factory=Frames)
    gpu_breakdown: Frames = field(default_factory=Frames)
    fine: FineGrain = field(default_factory=FineGrain)
    compiled: int = 0       # measured (rank, step) pairs left out: torch.compile compiled in them
    colls: Collectives = field(init=False)
    timeline: Timeline = field(init=False)

    def __post_init__(self):
        self.colls = Collectives(self.multi_host, self.domain, self.reread)
        self.timeline = Timeline(self.multi_host)

    def add(self, chunk: pa.Table, rows: ChunkRows, lane: Optional[Callable] = None) -> None:
        """``lane``: where the collectives are folded (:class:`_Lane`, a
        thread of their own); None: here."""
        if rows.compact is not None:
            self.steps.add_arrays(rows.compact)
        self.compiled += rows.compiled
        self.telemetry.add(rows.telemetry)
        self.phases.add(rows.phases)
        self.fine.add(rows.fine)
        if rows.kernels is not None:
            self.kernel_shares.add(rows.kernels[0])
            self.gpu_breakdown.add(rows.kernels[1])
        (lane or _now)(self.colls.add, rows.comm, rows.span, rows.comm_times)
        if self.timeline.wants_more():
            self.timeline.add(chunk, rows.compact_steps)


# -- the run -------------------------------------------------------------------
class _Clock:
    """Seconds per stage, for ``commprof report --timings``."""

    def __init__(self):
        self.spent: Dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, key: str, seconds: float) -> None:
        with self.lock:
            self.spent[key] = self.spent.get(key, 0.0) + seconds

    def since(self, key: str, t0: float) -> None:
        self.add(key, time.perf_counter() - t0)


def _read_and_sweep(chunks: Iterable, sweep_one: Callable[[Any], ChunkRows], acc: _Accumulators,
                    clock: _Clock, lane: "_Lane") -> None:
    """Two chunks in flight: numpy's sorts and scans release the GIL, so the
    sweep of one chunk runs beside the decoding of the next and the folds
    of the one before, the collectives' fold in ``lane``, a thread of its
    own (10 M events: 0.135 s less than folding them in this thread, 8 of
    8 pairs, benchmarks/results/report_speed/). Returns once every chunk is
    swept and folded but the last chunk's collectives, which ``lane`` may
    still be folding."""
    def work(chunk):
        c0 = time.thread_time()
        try:
            return sweep_one(chunk)
        finally:
            clock.add("per-chunk sweep, CPU in the workers", time.thread_time() - c0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending: deque = deque()
        it = iter(chunks)
        done = False
        while pending or not done:
            while not done and len(pending) < 2:
                chunk = next(it, None)
                if chunk is None:
                    done = True
                    break
                pending.append((chunk, pool.submit(work, chunk)))
            if not pending:
                break
            chunk, fut = pending.popleft()
            rows = fut.result()
            if not rows.empty:
                acc.add(chunk, rows, lane)
            del chunk
    clock.since("read and per-chunk sweep (wall)", t0)


def _now(fn: Callable, *args) -> None:
    fn(*args)


class _Beside:
    """Work handed to the side thread that the asking thread does itself
    where the side thread has not started it by the time its result is
    wanted: the two chains of the report's end share out their work as
    they run, not by a fixed split (10 M events, 8 interleaved pairs: the
    end waited 0.04-0.13 s for the side thread with the split fixed,
    0.01-0.07 s with the work shared, benchmarks/results/report_speed/)."""

    def __init__(self, pool: ThreadPoolExecutor, fn: Callable, *args):
        self.fn, self.args = fn, args
        self.future: Future = pool.submit(fn, *args)

    def take(self) -> None:
        """Done here if still queued (the side thread is busy); an error is
        kept for :meth:`result`, as the side thread's would be."""
        if self.future.cancel():
            fut: Future = Future()
            try:
                fut.set_result(self.fn(*self.args))
            except BaseException as exc:
                fut.set_exception(exc)
            self.future = fut

    def result(self):
        self.take()
        return self.future.result()


def _results(*work: Optional[_Beside]) -> list:
    """Their results, each still queued done here first (in the order
    queued, the side thread meanwhile taking the next), then those it
    took waited for; None for None."""
    for w in work:
        if w is not None:
            w.take()
    return [w.result() if w is not None else None for w in work]


class _Lane:
    """A thread folding one accumulator's share of each chunk, in the
    chunks' order, beside the main thread and the sweeps (one chunk in
    flight: the next waits for it)."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.last: Optional[Future] = None

    def __call__(self, fn: Callable, *args) -> None:
        self.wait()
        self.last = self.pool.submit(fn, *args)

    def wait(self) -> None:
        if self.last is not None:
            last, self.last = self.last, None
            last.result()

    def __enter__(self) -> "_Lane":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.wait()
        finally:
            self.pool.shutdown(wait=True)


#: free C heap from which the stages give it back to the system: 10 M
#: events leave 208-327 MiB free at those points, 100 M events 647-951 MiB
RETURN_HEAP_FROM = 512 << 20


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later)."""
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]


def _return_free_heap() -> None:
    """Give the C heap's free pages back to the system between stages
    (glibc's ``malloc_trim``; elsewhere a no-op) where they pass
    :data:`RETURN_HEAP_FROM`. The sweep's temporaries leave freed memory
    that glibc keeps; the next stage's arrays then land beside it and the
    peak is the sum (100 M events: 2,257 MiB without, 2,075 MiB with,
    benchmarks/results/report_speed/). Less than that is kept: the next
    stage reuses its pages instead of faulting fresh ones in (10 M events,
    12 pairs: 0.12 s less system CPU, 0.10 s sooner, ~43 MB more at the
    peak). A glibc without ``mallinfo2`` gives it back every time."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        try:
            info = libc.mallinfo2
            info.restype = _MallInfo2
            if info().fordblks < RETURN_HEAP_FROM:
                return
        except AttributeError:
            pass
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _run_meta(meta: dict, rank_metas: List[dict], steps: pd.DataFrame, batch_size: Optional[int]) -> dict:
    """The run's metadata completed from the analysis: batch size (given or
    inferred from the steps' items), framework of a single process, model
    FLOPs, DDP's bucket names."""
    meta = dict(meta)
    if batch_size is not None:
        meta["batch_size"] = batch_size
    elif "batch_size" not in meta and len(steps):
        inferred = infer_batch_size(steps["items"].tolist())
        if inferred is not None:
            meta["batch_size"] = inferred
    if meta.get("framework") is None and int(meta.get("world_size") or 1) == 1:
        meta["framework"] = "none"
    flops = model_flops(rank_metas)
    if flops:
        meta["fwd_flops_per_sample"] = flops
    names = next((m.get("ddp_buckets") for m in sorted(rank_metas, key=lambda r: r.get("rank", 0))
                  if m.get("ddp_buckets")), None)
    if names:
        meta["ddp_buckets"] = names
    groups = next(((m.get("fsdp") or {}).get("groups") for m in sorted(rank_metas, key=lambda r: r.get("rank", 0))
                   if (m.get("fsdp") or {}).get("groups")), None)
    if groups:
        meta["fsdp_groups"] = groups
    return meta


def model_flops(rank_metas: List[dict]) -> Optional[float]:
    """Forward FLOPs per sample of the model, counted by the recorder on the
    first batch (torch.utils.flop_counter; the largest root module, rank
    0 first)."""
    for m in sorted(rank_metas, key=lambda r: r.get("rank", 0)):
        mf = m.get("model_flops") or {}
        best = max(mf.values(), key=lambda v: v.get("flops", 0), default=None)
        if best and best.get("flops") and best.get("items"):
            return float(best["flops"]) / float(best["items"])
    return None


def blas_in_caller():
    """A context in which BLAS (numpy's ``@``) runs in the calling thread.

    The analysis runs its own threads (two chunks swept at once, tables
    built beside the clock alignment); OpenBLAS's threads, woken by each
    chunk's pattern-table product, spin on after it and took a core from
    them: at 10 M events ~1 s of the report's 5 s of CPU, ~0.25 s of its
    wall time (benchmarks/results/report_speed/). Without threadpoolctl,
    BLAS keeps its threads."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def analyze_chunks(chunks, meta: dict, rank_metas: List[dict], warmup: int = 1,
                   batch_size: Optional[int] = None, group_by: Optional[Sequence[str]] = None,
                   reread: Optional[Callable[[], Iterable[pa.Table]]] = None) -> RunAnalysis:
    """Analyse a run given an iterable of Arrow tables, each holding whole
    ranks. ``reread``: a function giving the same chunks again (at least
    COMM_COLUMNS, step and category): a run on several hosts then keeps a
    bounded sample of its collectives, not all of them, until its clocks
    are aligned."""
    with blas_in_caller():
        return _analyze_chunks(chunks, meta, rank_metas, warmup, batch_size, group_by, reread)


def _analyze_chunks(chunks, meta: dict, rank_metas: List[dict], warmup: int,
                    batch_size: Optional[int], group_by: Optional[Sequence[str]],
                    reread: Optional[Callable[[], Iterable[pa.Table]]]) -> RunAnalysis:
    dom = clocks.domains(rank_metas)
    hosts = {r: d[0] for r, d in dom.items()}
    multi_host = len(set(dom.values())) > 1
    several = len(set(hosts.values())) > 1
    code = {d: i for i, d in enumerate(sorted(set(dom.values())))}
    acc = _Accumulators(multi_host, {r: code[d] for r, d in dom.items()}, reread)
    clock = _Clock()
    with _Lane() as lane, ThreadPoolExecutor(max_workers=1) as pool:
        _read_and_sweep(chunks, lambda chunk: sweep(chunk, warmup, multi_host), acc, clock, lane)
        steps = acc.steps.finish()
        # beside the rest, what needs no collectives, while the lane folds
        # the last chunk's: the fine grain's rows (on the ranks' own
        # clocks); the steps' straggler tests, where their matrices are
        # small (at 100 M events they would not fit beside the per-host
        # table in 2 GiB: they stay in the report)
        fine_rows = _Beside(pool, acc.fine.rows)
        early = _Beside(pool, stragglers.step_verdicts, steps) if len(steps) <= SIDE_STEP_ROWS else None
        t0 = time.perf_counter()
        lane.wait()
        clock.since("read and per-chunk sweep (wall)", t0)
        _return_free_heap()
        # the hosts' clocks are aligned from all ranks' collectives before the
        # cross-rank statistics (arrival skew) are folded
        t0 = time.perf_counter()
        cframe = acc.colls.aligned_frame()
        # for the per-scope and per-link tables, which read the calls, not
        # their clock offsets: each a frame object of its own over the same
        # arrays, made before the alignment
        for_scope, for_links = (cframe.copy(deep=False), cframe.copy(deep=False)) \
            if several and cframe is not None else (None, None)
        scopes = nodes.group_scope(cframe, hosts) if several else {}    # each group's scope, found once
        offsets, clock_table = clocks.align(cframe, rank_metas)
        clock.since("clock alignment", t0)
        t0 = time.perf_counter()
        colls = acc.colls.finish(offsets)
        fine_phases, fine_grads = acc.fine.finish(offsets, fine_rows.result())
        clock.since("collectives and fine grain folded" + (" (a second pass)" if acc.colls.passes > 1 else ""), t0)
        meta = _run_meta(meta, rank_metas, steps, batch_size)
        if acc.compiled:
            meta["compile_steps_left_out"] = acc.compiled
        # the fine grain's tables, beside the per-host table (they were the
        # report's single-threaded end: 10 M events, ~0.08 s)
        fine = _Beside(pool, buckets.run_tables, fine_phases, fine_grads, int(meta.get("world_size") or 1),
                       meta.get("ddp_buckets"))
        # queued behind them, the smaller last, each taken by whichever
        # thread is free first
        scope_of = _Beside(pool, nodes.scope_table, for_scope, hosts, scopes) if several else None
        links_of = _Beside(pool, slowlinks.group_speeds, for_links, hosts) if several else None
        t0 = time.perf_counter()
        per_host = nodes.per_host(steps, colls.rank_lateness(), hosts, cframe, scopes if several else None)
        _return_free_heap()
        clock.since("per-host table", t0)
        # what the breakdown table reads of the steps, while the side tests
        # them (where they are few enough, as the straggler tests: 100 M
        # events peaked at 2,022 MiB with them beside the per-host table,
        # benchmarks/results/report_speed/)
        step_figures = breakdown.step_figures(steps, batch_size) \
            if not steps.empty and len(steps) <= SIDE_STEP_ROWS else None
        t0 = time.perf_counter()
        step_stragglers, fine_tables, scope, links = _results(early, fine, scope_of, links_of)
        scope, links = (t if t is not None else pd.DataFrame() for t in (scope, links))
        if acc.colls.sample.stride > 1:     # exact calls and sizes, not the sample's
            counts = acc.colls.calls.frame()
            scope = nodes.with_counts(scope, counts, hosts, cframe, scopes)
            links = slowlinks.with_counts(links, counts)
        beside = "steps' straggler tests, fine-grain tables (built beside, or here if not yet started)"
        clock.since(("scope and link tables, " if several else "") + beside, t0)
    return RunAnalysis(
        label=config_label(meta, group_by), meta=meta, world_size=int(meta.get("world_size") or 1),
        steps=steps, colls=colls, batch_size=batch_size, timeline=acc.timeline.finish(offsets),
        telemetry=acc.telemetry.finish(), phases=acc.phases.finish(),
        kernel_shares=acc.kernel_shares.finish(), gpu_breakdown=acc.gpu_breakdown.finish(),
        clocks=clock_table, offsets=offsets, hosts=hosts, nodes=per_host, scope=scope, links=links,
        fine_phases=fine_phases, fine_grads=fine_grads, sharded=acc.fine.sharded, timings=clock.spent,
        comm_sample=(acc.colls.sample.stride, acc.colls.sample.calls), step_stragglers=step_stragglers,
        step_figures=step_figures, fine_tables=fine_tables)
