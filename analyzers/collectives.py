"""Per-collective statistics with nccl-tests bandwidths, message-size
buckets, and arrival skew across ranks.

S (``bytes``) is recorded as nccl-tests define it: the tensor for
all_reduce / broadcast / reduce, the *full* array (per-rank part x n) for
reduce_scatter and all_gather. For each call, latency t = completion -
issue: on the device when the row has device times (CUDA events: NCCL
collectives return at enqueue, so host times would be enqueue times), else
on the host clock; algbw = S / t (GB/s, 1 GB = 1e9 bytes) and
busbw = algbw x factor(n) with n = group size:
all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all, gather,
scatter (n-1)/n; broadcast, reduce 1. Tables report medians over calls.
For asynchronous collectives (DDP buckets) t includes time queued behind
earlier buckets, so their bandwidths are lower bounds.

Arrival skew: the same collective has the same (group, seq) on every rank.
Per instance, skew = latest issue - earliest issue (time the early ranks
wait for peers) and transfer = mean completion - latest issue (time after
everyone arrived). Issue times are always the host's calls (who arrived
late); completion is the device's when known. Ranks on different hosts are aligned with each rank's
wall-clock offset.
"""
from __future__ import annotations

import ctypes

from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import pandas as pd

from ..trace.ops import bus_factor  # noqa: F401  (the report's busbw factors: nccl-tests')
from .codes import int_codes, strings_at
from .events import device_times
from .sketch import Sketch

SIZE_EDGES = [0, 1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26,
              1 << 28, 1 << 30]


def size_label(i: int) -> str:
    def h(b):
        for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if b >= f:
                return f"{b // f} {unit}"
        return f"{b} B"
    if i <= 0:
        return "< 1 KiB"
    if i >= len(SIZE_EDGES) - 1:
        return f">= {h(SIZE_EDGES[-1])}"
    return f"{h(SIZE_EDGES[i])} - {h(SIZE_EDGES[i + 1])}"


def size_bucket(nbytes: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.array(SIZE_EDGES[1:]), np.nan_to_num(nbytes, nan=0), side="right")


def per_call(events: pd.DataFrame) -> pd.DataFrame:
    """Collective events with latency, algbw and busbw columns."""
    c = events[events["category"].astype(str) == "comm"].copy()
    c["op"] = c["name"].astype(str)
    dev = ("dev_start" in c.columns and "dev_end" in c.columns) and c["dev_start"].notna() & c["dev_end"].notna()
    if dev is not False and dev.any():
        c["latency_s"] = np.where(dev, c["dev_end"] - c["dev_start"], c["t_end"] - c["t_start"]).astype(
            np.float64) / 1e9
    else:
        c["latency_s"] = (c["t_end"] - c["t_start"]).astype(np.float64) / 1e9
    nbytes = c["bytes"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        c["algbw"] = np.where(c["latency_s"] > 0, nbytes / c["latency_s"] / 1e9, np.nan)
    c["busbw"] = np.nan
    for op, idx in c.groupby("op").groups.items():
        c.loc[idx, "busbw"] = c.loc[idx, "algbw"].to_numpy() * bus_factor(op, c.loc[idx, "group_size"].to_numpy())
    c.loc[c["op"] == "barrier", ["algbw", "busbw"]] = np.nan
    c["size_bucket"] = size_bucket(nbytes.to_numpy())
    return c


def _codes(col):
    """Dictionary codes (-1 for null) and the dictionary's values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_null(col.type):
        return np.full(len(col), -1, np.int64), []
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    idx = col.indices
    codes = pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, [str(v) for v in col.dictionary.to_pylist()]


def call_times(comm) -> tuple:
    """(op codes, ops, source codes, sources, issue, completion, latency
    ns, bytes, group size) of an Arrow table of collective calls:
    completion and latency on the device where measured, the issue the
    host's call. Pure: taken where the chunk is swept."""
    op_codes, ops = _codes(comm.column("name"))
    src_codes, srcs = _codes(comm.column("source"))
    t0 = _num(comm, "t_start", np.int64, 0)
    t1 = _num(comm, "t_end", np.int64, 0)
    dev = device_times(comm)
    if dev is not None:
        d0, d1, has = dev
        lat_ns = np.where(has, d1 - d0, t1 - t0)
        t1 = np.where(has, d1, t1)
    else:
        lat_ns = t1 - t0
    return (op_codes, ops, src_codes, srcs, t0, t1, lat_ns, _num(comm, "bytes", np.float64, np.nan),
            _num(comm, "group_size", np.float64, np.nan))


def _num(table, name, dtype, fill):
    import pyarrow as pa
    import pyarrow.compute as pc

    if name not in table.column_names:
        return np.full(table.num_rows, fill, dtype=dtype)
    col = table.column(name)
    if pa.types.is_null(col.type):
        return np.full(table.num_rows, fill, dtype=dtype)
    if col.null_count:
        col = pc.fill_null(col.cast(pa.float64()) if dtype == np.float64 else col, fill)
    return col.to_numpy().astype(dtype, copy=False)


def _table(comm):
    """An Arrow table of comm rows (a DataFrame converted)."""
    import pyarrow as pa

    return comm if isinstance(comm, pa.Table) else pa.Table.from_pandas(comm, preserve_index=False)


def _groups(key: np.ndarray):
    """(key value, indices) for each distinct key (sort-based)."""
    order = np.argsort(key, kind="stable")
    sk = key[order]
    cuts = np.flatnonzero(np.diff(sk)) + 1
    for part in np.split(order, cuts):
        yield key[part[0]], part


_INST_FIELDS = ("key", "op", "min_start", "max_start", "sum_end", "n", "bytes", "last_rank",
                "op_max", "min_bytes", "min_bytes_rank", "max_bytes_rank", "gsize", "src_min", "src_max",
                "src_min_rank", "src_max_rank", "dt_min", "dt_max", "dt_min_rank", "dt_max_rank")
_SEQ_BITS = 40


def _latest_issuer(inst: np.ndarray, n_inst: int, hit: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per instance, the highest rank among the rows ``hit`` (those holding
    the latest issue): ties of the latest issue resolved the same way
    whatever order the rows came in."""
    out = np.full(n_inst, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(out, inst[hit], rank[hit].astype(np.int64))
    return out


def _same_keys(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> bool:
    return len(a["key"]) == len(b["key"]) and bool(np.array_equal(a["key"], b["key"]))


def _later_issuer(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> np.ndarray:
    """Per key, the latest issuer of two partials (the higher rank on a tie)."""
    return np.where(b["max_start"] > a["max_start"], b["last_rank"],
                    np.where(a["max_start"] > b["max_start"], a["last_rank"],
                             np.maximum(a["last_rank"], b["last_rank"])))


def _merge_instances(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """:func:`_reduce_instances` of ``a`` then ``b`` (two partials, each
    sorted with unique keys) when both hold the same keys (every rank in
    every instance): element by element, ties resolved as there, no sort."""
    if not _same_keys(a, b):
        return _reduce_instances({f: np.concatenate([a[f], b[f]]) for f in _INST_FIELDS})
    top = np.maximum(a["max_start"], b["max_start"])
    top_b, low_b = np.fmax(a["bytes"], b["bytes"]), np.fmin(a["min_bytes"], b["min_bytes"])

    def holder(va, vb, best, ra, rb, none):
        """The rank of the last row holding ``best`` (``none`` when neither does)."""
        return np.where(vb == best, rb, np.where(va == best, ra, none))

    out = {"key": a["key"], "op": np.minimum(a["op"], b["op"]), "min_start": np.minimum(a["min_start"], b["min_start"]),
           "max_start": top, "sum_end": a["sum_end"] + b["sum_end"], "n": a["n"] + b["n"], "bytes": top_b,
           "last_rank": _later_issuer(a, b),
           "op_max": np.maximum(a["op_max"], b["op_max"]), "min_bytes": low_b,
           # neither holds a NaN extreme: the first row's rank, as the sorted reduction gives
           "min_bytes_rank": holder(a["min_bytes"], b["min_bytes"], low_b, a["min_bytes_rank"],
                                    b["min_bytes_rank"], a["min_bytes_rank"][0]),
           "max_bytes_rank": holder(a["bytes"], b["bytes"], top_b, a["max_bytes_rank"], b["max_bytes_rank"],
                                    a["max_bytes_rank"][0]),
           "gsize": np.fmax(a["gsize"], b["gsize"])}
    for f in ("src", "dt"):
        lo, hi = np.minimum(a[f + "_min"], b[f + "_min"]), np.maximum(a[f + "_max"], b[f + "_max"])
        out[f + "_min"], out[f + "_max"] = lo, hi
        out[f + "_min_rank"] = holder(a[f + "_min"], b[f + "_min"], lo, a[f + "_min_rank"], b[f + "_min_rank"],
                                      a[f + "_min_rank"])
        out[f + "_max_rank"] = holder(a[f + "_max"], b[f + "_max"], hi, a[f + "_max_rank"], b[f + "_max_rank"],
                                      a[f + "_max_rank"])
    return out


_INST_FLOATS = ("sum_end", "bytes", "min_bytes", "gsize")


def _reduce_instances_compiled(a: Dict[str, np.ndarray], order: np.ndarray,
                               first: np.ndarray) -> Optional[Dict[str, np.ndarray]]:
    """:func:`_reduce_instances` by the compiled kernel (analyzers/native.py),
    the summed completions by numpy as there; None where the kernel is not
    available or a field is not of the type it reads."""
    from . import native

    fn = native.kernel("commprof_reduce_instances")
    if fn is None:
        return None
    src = [np.ascontiguousarray(a[f]) for f in _INST_FIELDS]
    for f, v in zip(_INST_FIELDS, src):
        if v.dtype != (np.float64 if f in _INST_FLOATS else np.int64) or len(v) != len(order):
            return None
    order = np.ascontiguousarray(order, np.int64)
    n, k = len(order), len(first)
    out = [np.empty(k, v.dtype) for v in src]
    ptrs = (ctypes.c_void_p * len(src))
    got = fn(n, order.ctypes.data, ptrs(*[v.ctypes.data for v in src]), ptrs(*[v.ctypes.data for v in out]))
    if got != k:
        return None
    res = dict(zip(_INST_FIELDS, out))
    res["sum_end"] = np.add.reduceat(a["sum_end"][order], first)
    return res


def _reduce_runs(gid, seq, oid, rank, ts, te, t_ref: int, nbytes, gsize, sid, did) -> Optional[Dict[str, np.ndarray]]:
    """:func:`_reduce_instances` of raw calls (n = 1, completions summed
    relative to ``t_ref``) that come as 2-8 runs of the same keys in
    ascending order (a chunk's ranks, each in every instance), by the
    compiled kernel without a sort: the same fields, bit for bit. None
    where the rows are not such runs or the kernel is not available."""
    from . import native

    fn = native.kernel("commprof_reduce_runs")
    if fn is None or len(gid) < 2:
        return None
    gid, seq, oid, ts, te, rank, sid, did = (np.ascontiguousarray(v, np.int64)
                                             for v in (gid, seq, oid, ts, te, rank, sid, did))
    nbytes, gsize = (np.ascontiguousarray(v, np.float64) for v in (nbytes, gsize))
    args = (len(gid), gid.ctypes.data, seq.ctypes.data, _SEQ_BITS, oid.ctypes.data, ts.ctypes.data, te.ctypes.data,
            t_ref, nbytes.ctypes.data, rank.ctypes.data, gsize.ctypes.data, sid.ctypes.data, did.ctypes.data)
    k = fn(*args, None)     # the instances, counted first: the partials kept are as long as they are
    if k < 0:
        return None
    out = [np.empty(k, np.float64 if f in _INST_FLOATS else np.int64) for f in _INST_FIELDS]
    got = fn(*args, (ctypes.c_void_p * len(out))(*[v.ctypes.data for v in out]))
    return dict(zip(_INST_FIELDS, out)) if got == k else None


def _reduce_instances(a: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Combine partial per-instance aggregates that share a key: earliest
    issue, latest issue (and the rank that issued it), summed completions,
    counts, largest message. Rows of one raw event are partials with
    n = 1."""
    if len(a["key"]) == 0 or bool(np.all(a["key"][1:] > a["key"][:-1])):
        return a        # every row its own instance, in order (one rank's calls): nothing to combine
    order = np.argsort(a["key"], kind="stable")  # runs of increasing keys: cheap to merge
    key = a["key"][order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    fast = _reduce_instances_compiled(a, order, first)
    if fast is not None:
        return fast
    mx = a["max_start"][order]
    top = np.maximum.reduceat(mx, first)
    sizes = np.diff(np.r_[first, len(key)])
    inst = np.repeat(np.arange(len(first)), sizes)   # instance of each sorted row
    # the latest issuer: of the rows holding the instance's latest issue, the highest rank
    hit = np.flatnonzero(mx == top[inst])
    last_rank = _latest_issuer(inst, len(first), hit, a["last_rank"][order])
    # ranks holding the smallest / largest message (mismatch diagnosis)
    by = a["bytes"][order]
    mnb = a["min_bytes"][order]
    top_b = np.fmax.reduceat(by, first)
    low_b = np.fmin.reduceat(mnb, first)
    at_max = np.zeros(len(first), np.int64)
    h = np.flatnonzero(by == top_b[inst])
    at_max[inst[h]] = h
    at_min = np.zeros(len(first), np.int64)
    h = np.flatnonzero(mnb == low_b[inst])
    at_min[inst[h]] = h

    def extreme(field, reduce):
        """Per instance: the min / max of a code field and the rank holding it."""
        v = a[field][order]
        best = reduce.reduceat(v, first)
        at_ = np.zeros(len(first), np.int64)
        hit_ = np.flatnonzero(v == best[inst])
        at_[inst[hit_]] = hit_
        return best, a[field + "_rank"][order[at_]]

    codes = {}
    for f in ("src", "dt"):
        codes[f + "_min"], codes[f + "_min_rank"] = extreme(f + "_min", np.minimum)
        codes[f + "_max"], codes[f + "_max_rank"] = extreme(f + "_max", np.maximum)
    return {
        "key": key[first],
        "op": np.minimum.reduceat(a["op"][order], first),
        "min_start": np.minimum.reduceat(a["min_start"][order], first),
        "max_start": top,
        "sum_end": np.add.reduceat(a["sum_end"][order], first),
        "n": np.add.reduceat(a["n"][order], first),
        "bytes": top_b,
        "last_rank": last_rank,
        "op_max": np.maximum.reduceat(a["op_max"][order], first),
        "min_bytes": low_b,
        "min_bytes_rank": a["min_bytes_rank"][order[at_min]],
        "max_bytes_rank": a["max_bytes_rank"][order[at_max]],
        "gsize": np.fmax.reduceat(a["gsize"][order], first),
        **codes,
    }


def _per_rank(rank: np.ndarray, values: Dict[int, int], default: int = 0) -> np.ndarray:
    """``values[rank]`` (``default`` where absent) for each element of ``rank``."""
    ur, inv = int_codes(rank)
    return np.array([values.get(int(r), default) for r in ur], np.int64)[inv]


def _reduce_arrivals(key, rank, ts, te_rel, n, lows=None) -> Dict[str, np.ndarray]:
    """Per distinct key: earliest issue (of ``lows``, default ``ts``) and
    latest issue, the latest issuer (the highest rank holding the latest
    issue, as :func:`_reduce_instances`), summed completions and count."""
    if lows is None and (len(key) == 0 or bool(np.all(key[1:] > key[:-1]))):     # one row per key, in order
        return {"key": key, "min_start": ts, "max_start": ts, "last_rank": rank, "sum_end": te_rel, "n": n}
    order = np.argsort(key, kind="stable")
    key, ts = key[order], ts[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    top = np.maximum.reduceat(ts, first)
    inst = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(key)]))
    hit = np.flatnonzero(ts == top[inst])
    low = ts if lows is None else lows[order]
    return {"key": key[first], "min_start": np.minimum.reduceat(low, first), "max_start": top,
            "last_rank": _latest_issuer(inst, len(first), hit, rank[order]).astype(rank.dtype),
            "sum_end": np.add.reduceat(te_rel[order], first),
            "n": np.add.reduceat(n[order], first)}


def _sums_per_key(key: np.ndarray, w: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted distinct keys, each one's sum of ``w`` in row order from 0.0,
    its rows): ``bincount`` over :func:`int_codes`, or, where each key's rows
    are one run and the runs come in key order (a chunk's calls, rank by
    rank; at most 256 runs), each run's running sum: the same additions in
    the same order."""
    if len(key):
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        starts = key[first]
        if len(first) <= 256 and bool(np.all(starts[1:] > starts[:-1])):
            ends = np.r_[first[1:], len(key)]
            sums = np.array([np.cumsum(w[a:b])[-1] + 0.0 for a, b in zip(first.tolist(), ends.tolist())])
            return starts, sums, ends - first
    u, inv = int_codes(key)
    return u, np.bincount(inv, weights=w), np.bincount(inv)


def _run_sums(a: np.ndarray, b: np.ndarray, width: int, add: int, ints: Optional[np.ndarray] = None,
              t_ref: int = 0, floats: Optional[np.ndarray] = None,
              cap: int = 256) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """:func:`_sums_per_key` of keys ``a * width + b + add`` and weights
    ``ints - t_ref`` (as float64) or ``floats`` (a NaN as 0), by the compiled
    kernel in one pass, no keys or weights made: (keys, sums, rows, the
    rows of each key with a weight not NaN). None where the kernel is not
    available, the keys' runs do not ascend or are more than ``cap``."""
    from . import native

    fn = native.kernel("commprof_run_sums")
    if fn is None or not len(a):
        return None
    a, b = np.ascontiguousarray(a, np.int64), np.ascontiguousarray(b, np.int64)
    ti = np.ascontiguousarray(ints, np.int64) if ints is not None else None
    tf = np.ascontiguousarray(floats, np.float64) if ints is None and floats is not None else None
    if ti is None and tf is None:
        return None
    keys, sums, rows, known = np.empty(cap, np.int64), np.empty(cap), np.empty(cap, np.int64), np.empty(cap)
    got = fn(len(a), a.ctypes.data, b.ctypes.data, width, add, ti.ctypes.data if ti is not None else None, t_ref,
             tf.ctypes.data if tf is not None else None, cap, keys.ctypes.data, sums.ctypes.data, rows.ctypes.data,
             known.ctypes.data)
    if got < 0:
        return None
    return keys[:got].copy(), sums[:got].copy(), rows[:got].copy(), known[:got].copy()


def _combine_due(pending: int, combined: int) -> bool:
    """Whether partial aggregates are folded into the combined ones now: once
    the pending rows are as many as the combined ones (not more: the last of
    a host's ranks, a chunk of its own, would leave a second copy of the same
    instances pending to the end; 100 M events: ~170 MiB at the peak), and
    not before 2**18 rows (few, large merges). The work stays linear."""
    return pending >= max(combined, 1 << 18)


def _merge_arrivals(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """:func:`_reduce_arrivals` of the partials ``a`` then ``b`` (each
    sorted with unique keys); element by element when their keys agree."""
    if not _same_keys(a, b):
        c = {f: np.concatenate([a[f], b[f]]) for f in Arrivals.FIELDS}
        return _reduce_arrivals(c["key"], c["last_rank"], c["max_start"], c["sum_end"], c["n"], lows=c["min_start"])
    top = np.maximum(a["max_start"], b["max_start"])
    return {"key": a["key"], "min_start": np.minimum(a["min_start"], b["min_start"]), "max_start": top,
            "last_rank": _later_issuer(a, b),
            "sum_end": a["sum_end"] + b["sum_end"], "n": a["n"] + b["n"]}


class Arrivals:
    """Issue and completion times of collective instances per (instance,
    clock domain), on each host's own clock, until the clocks are aligned.

    Within one clock domain every rank gets the same offset, so the
    earliest / latest issue per (instance, domain) shifted by the domain's
    offset and reduced over domains is exactly the earliest / latest issue
    on aligned clocks; completions are summed relative to the first issue
    seen (integers: exact in float64 below 2**53 ns). Memory: one row per
    instance and domain (a host's ranks fold into one row, whichever
    chunks they come in). A chunk of one host's ranks (the usual case)
    takes its rows from the instances' own partial of the same rows: one
    reduction, not two (10 M events: ~10 ms less per chunk)."""

    FIELDS = ("key", "min_start", "max_start", "last_rank", "sum_end", "n")

    def __init__(self, domain: Dict[int, int]):
        self.domain = domain
        self.n_dom = max(domain.values(), default=-1) + 1    # the code of ranks of no known domain
        self.acc: Dict[int, Dict[str, np.ndarray]] = {}
        self.pending: Dict[int, List[Dict[str, np.ndarray]]] = {}
        self.rows = 0
        self.keys: Optional[np.ndarray] = None
        self.t_raw: Optional[int] = None
        self.first_rank = np.zeros(0, np.int64)
        self.first_ts = np.zeros(0, np.int64)

    def first(self, rank: np.ndarray, ts: np.ndarray) -> None:
        """The first chunk's issues (each rank's earliest): the reference of
        the summed times."""
        self.t_raw = int(ts.min())
        self.first_rank, inv = np.unique(rank, return_inverse=True)
        self.first_ts = np.full(len(self.first_rank), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(self.first_ts, inv, ts)

    def add(self, key: Union[np.ndarray, Callable[[], np.ndarray]], rank: np.ndarray, ts: np.ndarray,
            te: np.ndarray, reduced: Optional[Tuple[Dict[str, np.ndarray], np.ndarray, Optional[int]]] = None) -> None:
        """``key``: the rows' instance keys, or a function giving them (made
        only where ``reduced`` cannot be used). ``reduced``: the same rows'
        per-instance partial, their distinct ranks and the time its
        completions are summed from: used as it is when those ranks are of
        one clock domain and that time is this fold's first issue."""
        if self.t_raw is None:
            self.first(rank, ts)
        if reduced is not None and reduced[2] == self.t_raw:
            part, ranks, _ = reduced
            doms = {self.domain.get(int(r), self.n_dom) for r in ranks.tolist()}
            if len(doms) == 1:
                self._put(doms.pop(), {
                    "key": part["key"], "min_start": part["min_start"], "max_start": part["max_start"],
                    "last_rank": part["last_rank"].astype(np.int32), "sum_end": part["sum_end"],
                    "n": part["n"].astype(np.int32)})
                return
        if callable(key):
            key = key()
        dom = _per_rank(rank, self.domain, self.n_dom)
        te_rel = (te - self.t_raw).astype(np.float64)
        ones = np.ones(len(key), np.int32)
        doms = int_codes(dom)[0]
        for d in doms.tolist():
            sel = np.flatnonzero(dom == d) if len(doms) > 1 else slice(None)
            part = _reduce_arrivals(key[sel], rank[sel].astype(np.int32), ts[sel], te_rel[sel], ones[sel])
            self._put(d, part)

    def _put(self, d: int, part: Dict[str, np.ndarray]) -> None:
        pend = self.pending.setdefault(d, [])
        pend.append(part)
        self.rows += len(part["key"])
        have = len(self.acc[d]["key"]) if d in self.acc else 0
        if _combine_due(sum(len(p["key"]) for p in pend), have):
            self._combine(d)

    def _combine(self, d: int) -> None:
        parts = ([self.acc[d]] if d in self.acc else []) + self.pending.pop(d, [])
        if not parts:
            return
        before = sum(len(p["key"]) for p in parts)
        merged = parts[0]
        for p in parts[1:]:
            merged = _merge_arrivals(merged, p)
        # the domains of a run mostly hold the same instances: their keys kept once
        if self.keys is not None and _same_keys(merged, {"key": self.keys}):
            merged["key"] = self.keys
        elif self.keys is None:
            self.keys = merged["key"]
        self.acc[d] = merged
        self.rows += len(merged["key"]) - before

    def compact(self) -> int:
        """Combine every domain's pending rows; the rows kept."""
        for d in list(self.pending):
            self._combine(d)
        return self.rows

    def first_issue(self, offsets: Dict[int, int]) -> int:
        """The first chunk's earliest issue on aligned clocks."""
        return int((self.first_ts + _per_rank(self.first_rank, offsets)).min())

    def finish(self, offsets: Dict[int, int], t_raw: int, t_ref: int) -> Dict[str, np.ndarray]:
        """Per instance, on clocks shifted by ``offsets``, completions summed
        relative to ``t_ref``."""
        by_dom: Dict[int, int] = {}
        for r, d in self.domain.items():
            by_dom.setdefault(d, offsets.get(r, 0))
        self.compact()
        low: Dict[int, int] = {}
        for r, d in self.domain.items():
            low[d] = min(low.get(d, r), r)
        out: Optional[Dict[str, np.ndarray]] = None
        # domain by domain in rank order (as the chunks came), each freed once folded
        for d in sorted(self.acc, key=lambda d: (low.get(d, 1 << 62), d)):
            a = self.acc.pop(d)
            off = by_dom.get(d, 0)
            a = {"key": a["key"], "min_start": a["min_start"] + off, "max_start": a["max_start"] + off,
                 "last_rank": a["last_rank"], "n": a["n"],
                 "sum_end": a["sum_end"] + a["n"] * float(off + t_raw - t_ref)}
            out = a if out is None else _merge_arrivals(out, a)
        self.rows = 0
        assert out is not None
        out["last_rank"] = out["last_rank"].astype(np.int64)
        return out


class CollectiveStats:
    """Accumulates collectives chunk by chunk (each chunk holds whole ranks).

    Per collective instance (same group and sequence number on every rank)
    it keeps a handful of numbers; partial aggregates of successive chunks
    are combined when they outgrow the combined ones, so the work stays
    linear and memory bounded by the number of instances."""

    def __init__(self):
        self.calls: Dict[tuple, dict] = {}
        self._names: Dict[str, Dict[str, int]] = {"group": {}, "op": {}, "source": {}, "dtype": {}}
        self._acc: Optional[Dict[str, np.ndarray]] = None
        self._pending: list = []
        self._pending_rows = 0
        self._rank_sums: Dict[tuple, list] = {}
        self._inst_cache: Optional[pd.DataFrame] = None
        self._lateness: Optional[Tuple[pd.DataFrame, pd.DataFrame]] = None     # (the instances it read, it)
        self._t_ref: Optional[int] = None
        self._arrivals: Optional[Arrivals] = None

    def _ids(self, kind: str, values) -> np.ndarray:
        table = self._names[kind]
        return np.array([table.setdefault(v, len(table)) for v in values] + [-1], dtype=np.int64)

    def _ids_of(self, kind: str, values, codes: np.ndarray) -> np.ndarray:
        """The ids of rows given as dictionary codes (-1: none): the codes
        themselves where the chunk's dictionary lists the names in the order
        the fold first saw them (a merged trace's chunks, as a rule), else
        looked up."""
        lut = self._ids(kind, values)
        if np.array_equal(lut[:-1], np.arange(len(lut) - 1)) and codes.dtype == np.int64:
            return codes
        return lut[codes]

    # -- accumulation --------------------------------------------------------
    def add(self, comm, offsets: Optional[Dict[int, int]] = None) -> None:
        """Fold collective events (an Arrow table or DataFrame of comm rows):
        the per-call sketches and the per-instance aggregates."""
        comm = _table(comm)
        self.add_instances_of(comm, offsets, self.add_calls_of(comm))

    def add_calls_of(self, comm, times: Optional[tuple] = None) -> Optional[tuple]:
        """Fold the per (op, source, size bucket) sketches of latency and
        bandwidth. Needs no clock offsets: a multi-host run folds them while
        the trace is read and the instances once the clocks are aligned.
        ``times``: the rows' :func:`call_times` where already taken;
        returns them, for :meth:`add_instances_of` of the same rows."""
        comm = _table(comm)
        if comm.num_rows == 0:
            return None
        times = times or call_times(comm)
        op_codes, ops, src_codes, srcs, _t0, _t1, lat_ns, nbytes, gsize = times
        lat_s = lat_ns.astype(np.float64) / 1e9
        with np.errstate(divide="ignore", invalid="ignore"):
            algbw = np.where(lat_s > 0, nbytes / lat_s / 1e9, np.nan)
        bucket = size_bucket(nbytes)
        key = (op_codes.astype(np.int64) * 256 + src_codes) * 64 + bucket
        # one (op, source, size) in the whole chunk, the usual case: no copies
        groups = [(key[0], slice(None))] if bool((key == key[0]).all()) else _groups(key)
        for k, sel in groups:
            op, source, b = ops[int(k // 64 // 256)], srcs[int(k // 64 % 256)], int(k % 64)
            g = gsize[sel]
            # one group size, the usual case: its factor once (the same float)
            factor = bus_factor(op, float(g[0])) if bool((g == g[0]).all()) else bus_factor(op, g)
            bus = algbw[sel] * factor
            self._fold(op, source, b, lat_s[sel] * 1e3, algbw[sel], bus, nbytes[sel], g)
        return times

    def add_instances_of(self, comm, offsets: Optional[Dict[int, int]] = None,
                         times: Optional[tuple] = None) -> None:
        """Fold the per-instance aggregates (group, seq) on clocks shifted by
        ``offsets`` (rank -> ns); ``times``: what :meth:`add_calls_of`
        returned for the same rows (else they are read again)."""
        comm = _table(comm)
        if comm.num_rows == 0 or "seq" not in comm.column_names or "group" not in comm.column_names:
            return
        op_codes, ops, src_codes, srcs, t0, t1, _lat, nbytes, gsize = times or call_times(comm)
        rank = _num(comm, "rank", np.int64, 0)
        if offsets:
            off = _per_rank(rank, offsets)
            ts, te = t0 + off, t1 + off
        else:
            ts, te = t0, t1
        g_codes, groups = _codes(comm.column("group"))
        gid = self._ids_of("group", groups, g_codes)
        oid = self._ids_of("op", ops, op_codes)
        sid = self._ids_of("source", srcs, src_codes)
        if "dtype" in comm.column_names:
            dt_codes, dts = _codes(comm.column("dtype"))
            did = self._ids_of("dtype", dts, dt_codes)
        else:
            did = np.full(comm.num_rows, -1, np.int64)
        seq = _num(comm, "seq", np.int64, -1)
        ok = (seq >= 0) & (seq < (1 << _SEQ_BITS)) & (gid >= 0)
        if not ok.any():
            return
        if ok.all():        # the usual case: no copies of every column for nothing
            ok = slice(None)
        part, ranks = self._add_instances(gid[ok], seq[ok], oid[ok], rank[ok], ts[ok], te[ok],
                                          nbytes[ok], gsize[ok], sid[ok], did[ok])
        if self._arrivals is not None:      # clocks not aligned yet: arrivals kept per host
            # the rows of one host, on its own clock: their arrivals are the
            # instances' own earliest / latest issue, issuer and summed
            # completions, reduced once (the same rows, order and sums)
            self._arrivals.add(lambda: ((gid << _SEQ_BITS) | seq)[ok], rank[ok], t0[ok], t1[ok],
                               reduced=None if offsets else (part, ranks, self._t_ref))

    def defer_alignment(self, domain: Dict[int, int]) -> None:
        """Fold instances before the clocks are aligned (``domain``: rank ->
        clock-domain code): every field that does not depend on the clocks
        as usual, and the arrivals (earliest / latest issue, the latest
        issuer, summed completions) per instance and clock domain, so that
        :meth:`align` gives exactly what folding on aligned clocks gives."""
        self._arrivals = Arrivals(domain)

    def arrival_rows(self, compact: bool = False) -> int:
        """Rows kept per (instance, clock domain) until :meth:`align`
        (``compact``: after combining the pending ones)."""
        if self._arrivals is None:
            return 0
        return self._arrivals.compact() if compact else self._arrivals.rows

    def align(self, offsets: Dict[int, int]) -> None:
        """Shift the deferred arrivals by ``offsets`` (rank -> ns, one value
        per clock domain) and complete the per-instance aggregates."""
        arr, self._arrivals = self._arrivals, None
        if arr is None or self._t_ref is None:
            return
        self._combine()
        t_raw = self._t_ref
        t_ref = arr.first_issue(offsets)
        got = arr.finish(offsets, t_raw, t_ref)
        a = self._acc
        assert a is not None and np.array_equal(got["key"], a["key"]), "arrivals and instances disagree"
        for f in ("min_start", "max_start", "last_rank", "sum_end"):
            a[f] = got[f]
        shift = {r: offsets.get(r, 0) + t_raw - t_ref for r in {k[0] for k in self._rank_sums}}
        for (r, _g), acc in self._rank_sums.items():
            acc[0] += acc[1] * float(shift[r])
        self._t_ref = t_ref
        self._inst_cache = None

    def drop_instances(self) -> None:
        """Forget the per-instance aggregates (kept: the per-call sketches)."""
        self._acc, self._pending, self._pending_rows = None, [], 0
        self._rank_sums, self._inst_cache, self._t_ref, self._arrivals = {}, None, None, None
        self._lateness = None

    def add_calls(self, c: pd.DataFrame) -> None:
        """Fold a per_call frame into the per (op, source, size bucket) sketches."""
        c = c.assign(source=c["source"].astype(str))
        for (op, source, bucket), g in c.groupby(["op", "source", "size_bucket"], sort=False):
            self._fold(op, source, bucket, g["latency_s"].to_numpy() * 1e3, g["algbw"].to_numpy(),
                       g["busbw"].to_numpy(), g["bytes"].to_numpy(dtype=np.float64),
                       g["group_size"].to_numpy(dtype=np.float64))

    def _fold(self, op, source, bucket, lat_ms, algbw, busbw, nbytes, gsize) -> None:
        acc = self.calls.get((op, source, bucket))
        if acc is None:
            acc = self.calls[(op, source, bucket)] = {
                "lat": Sketch(), "algbw": Sketch(), "busbw": Sketch(), "bytes": 0.0, "group_size": 0}
        acc["lat"].add(lat_ms)
        acc["algbw"].add(algbw)
        acc["busbw"].add(busbw)
        acc["bytes"] += float(np.nansum(nbytes))
        if len(gsize) and not np.isnan(gsize).all():
            acc["group_size"] = max(acc["group_size"], int(np.nanmax(gsize)))

    def _add_instances(self, gid, seq, oid, rank, ts, te, nbytes, gsize, sid, did) -> Tuple[Dict[str, np.ndarray],
                                                                                           np.ndarray]:
        """Fold rows into the per-instance partials; returns the rows' own
        partial and their distinct ranks."""
        self._inst_cache = None
        # float sums are kept relative to the first issue time seen (exact enough)
        if self._t_ref is None:
            self._t_ref = int(ts.min())
        part = _reduce_runs(gid, seq, oid, rank, ts, te, self._t_ref, nbytes, gsize, sid, did)
        if part is None:
            part = _reduce_instances({
                "key": (gid << _SEQ_BITS) | seq, "op": oid, "min_start": ts, "max_start": ts,
                "sum_end": (te - self._t_ref).astype(np.float64), "n": np.ones(len(ts), np.int64), "bytes": nbytes,
                "last_rank": rank, "op_max": oid, "min_bytes": nbytes, "min_bytes_rank": rank, "max_bytes_rank": rank,
                "gsize": gsize, "src_min": sid, "src_max": sid, "src_min_rank": rank, "src_max_rank": rank,
                "dt_min": did, "dt_max": did, "dt_min_rank": rank, "dt_max_rank": rank})
        self._pending.append(part)
        self._pending_rows += len(part["key"])
        acc_rows = len(self._acc["key"]) if self._acc is not None else 0
        if _combine_due(self._pending_rows, acc_rows):
            self._combine()
        # per (rank, group): summed issue times and calls, for mean lateness
        width = int(gid.max()) + 1 if len(gid) else 1
        got = _run_sums(rank, gid, width, 0, ints=ts, t_ref=self._t_ref)
        u, sums, counts = got[:3] if got is not None else \
            _sums_per_key(rank * width + gid, (ts - self._t_ref).astype(np.float64))
        for k, s_, c_ in zip(u.tolist(), sums.tolist(), counts.tolist()):
            acc = self._rank_sums.setdefault((k // width, k % width), [0.0, 0])
            acc[0] += s_
            acc[1] += c_
        return part, np.unique(u // width)

    def _combine(self) -> None:
        parts = self._pending + ([self._acc] if self._acc is not None else [])
        self._pending, self._pending_rows = [], 0
        if parts and all(_same_keys(parts[0], p) for p in parts[1:]):
            merged = parts[0]           # every rank in every instance: element by element
            for p in parts[1:]:
                merged = _merge_instances(merged, p)
            self._acc = merged
        elif parts:
            self._acc = _reduce_instances({f: np.concatenate([p[f] for p in parts]) for f in _INST_FIELDS})

    @property
    def _inst(self) -> Optional[pd.DataFrame]:
        """Per instance: group, seq, op, min_start, max_start, sum_end (summed
        completion times relative to ``_t_ref``), n, bytes, last_rank (None
        before any collective with a sequence number)."""
        if self._inst_cache is not None:
            return self._inst_cache
        self._combine()
        a = self._acc
        if a is None or not len(a["key"]):
            return None
        groups, ops = list(self._names["group"]), list(self._names["op"])
        srcs, dts = list(self._names["source"]) + ["?"], list(self._names["dtype"]) + ["?"]
        self._inst_cache = pd.DataFrame({
            "group": strings_at(groups, a["key"] >> _SEQ_BITS), "seq": a["key"] & ((1 << _SEQ_BITS) - 1),
            "op": strings_at(ops, a["op"]), "min_start": a["min_start"], "max_start": a["max_start"],
            "sum_end": a["sum_end"], "n": a["n"], "bytes": a["bytes"], "last_rank": a["last_rank"],
            "op_max": strings_at(ops, a["op_max"]), "min_bytes": a["min_bytes"], "min_bytes_rank": a["min_bytes_rank"],
            "max_bytes_rank": a["max_bytes_rank"], "gsize": a["gsize"],
            "src_min": strings_at(srcs, a["src_min"]), "src_max": strings_at(srcs, a["src_max"]),
            "src_min_rank": a["src_min_rank"], "src_max_rank": a["src_max_rank"],
            "dt_min": strings_at(dts, a["dt_min"]), "dt_max": strings_at(dts, a["dt_max"]),
            "dt_min_rank": a["dt_min_rank"], "dt_max_rank": a["dt_max_rank"]})
        return self._inst_cache

    # -- results ---------------------------------------------------------------
    def table(self, n_steps: int, n_ranks: int) -> pd.DataFrame:
        """One row per (op, issuing instrument, message-size bucket)."""
        cols = ["op", "source", "size", "calls", "calls_per_step", "bytes_per_call", "total_bytes",
                "lat_ms_mean", "lat_ms_p50", "lat_ms_p95", "algbw_GBps", "busbw_GBps", "group_size"]
        rows = []
        for (op, source, bucket), a in sorted(self.calls.items()):
            lat = a["lat"]
            rows.append({
                "op": op, "source": source, "size": size_label(int(bucket)), "calls": lat.count,
                "calls_per_step": lat.count / max(1, n_steps * n_ranks),
                "bytes_per_call": a["bytes"] / lat.count if lat.count else np.nan,
                "total_bytes": a["bytes"],
                "lat_ms_mean": lat.mean(), "lat_ms_p50": lat.quantile(0.5), "lat_ms_p95": lat.quantile(0.95),
                "algbw_GBps": a["algbw"].quantile(0.5) if op != "barrier" else np.nan,
                "busbw_GBps": a["busbw"].quantile(0.5) if op != "barrier" else np.nan,
                "group_size": a["group_size"] or np.nan,
            })
        return pd.DataFrame(rows, columns=cols)

    def instances(self) -> pd.DataFrame:
        """Per collective instance seen on more than one rank: op, ranks,
        skew_ms (latest - earliest issue), transfer_ms (mean completion -
        latest issue), last_rank (the latest to arrive)."""
        if self._inst is None:
            return pd.DataFrame(columns=["group", "seq", "op", "ranks", "skew_ms", "transfer_ms", "last_rank"])
        i = self._inst[self._inst["n"] > 1]
        return pd.DataFrame({
            "group": i["group"], "seq": i["seq"], "op": i["op"], "ranks": i["n"],
            "skew_ms": (i["max_start"] - i["min_start"]) / 1e6,
            "transfer_ms": (i["sum_end"] / i["n"] - (i["max_start"] - self._t_ref)) / 1e6,
            "last_rank": i["last_rank"], "bytes": i["bytes"],
            # relative to the first issue seen (aligned clocks): for chaining instances
            "last_issue_ms": (i["max_start"] - self._t_ref) / 1e6, "mean_end_ms": i["sum_end"] / i["n"] / 1e6,
        }).reset_index(drop=True)

    def mismatches(self, limit: int = 20) -> pd.DataFrame:
        """Collective instances whose ranks disagree (same group and sequence
        number, different op or message size), and instances missing on
        some ranks of the group while later instances of the group are
        complete (so not the trace's ragged end). The first ``limit``
        of each kind, earliest first: the first one is where the ranks'
        sequences diverged."""
        cols = ["group", "seq", "kind", "op", "detail", "ranks_seen", "group_size"]
        inst = self._inst
        if inst is None:
            return pd.DataFrame(columns=cols)
        rows = []
        bad = inst[(inst["op"] != inst["op_max"]) | ((inst["min_bytes"] != inst["bytes"]) & inst["bytes"].notna())
                   | (inst["src_min"] != inst["src_max"]) | (inst["dt_min"] != inst["dt_max"])]
        for _, i in bad.sort_values(["group", "seq"]).head(limit).iterrows():
            if i["op"] != i["op_max"]:
                detail = f"ops differ across ranks ({i['op']} vs {i['op_max']})"
                kind = "op mismatch"
            elif i["min_bytes"] != i["bytes"]:
                detail = (f"{int(i['min_bytes']):,} B on rank {int(i['min_bytes_rank'])} vs "
                          f"{int(i['bytes']):,} B on rank {int(i['max_bytes_rank'])}")
                kind = "size mismatch"
            elif i["dt_min"] != i["dt_max"]:
                detail = (f"{i['dt_min']} on rank {int(i['dt_min_rank'])} vs "
                          f"{i['dt_max']} on rank {int(i['dt_max_rank'])}")
                kind = "dtype mismatch"
            else:
                detail = (f"issued by {i['src_min']} on rank {int(i['src_min_rank'])} vs "
                          f"{i['src_max']} on rank {int(i['src_max_rank'])}")
                kind = "issuer mismatch"
            rows.append({"group": i["group"], "seq": int(i["seq"]), "kind": kind,
                         "op": i["op"] if i["op"] == i["op_max"] else f"{i['op']}/{i['op_max']}",
                         "detail": detail, "ranks_seen": int(i["n"]),
                         "group_size": int(i["gsize"]) if i["gsize"] == i["gsize"] else -1})
        # missing: fewer ranks than the group has, before the group's last complete instance
        full = inst[inst["n"] >= inst["gsize"]]
        last_full = {str(k): int(v) for k, v in full.groupby("group")["seq"].max().items()}
        part = inst[(inst["n"] < inst["gsize"]) & (inst["gsize"] > 1)]
        bound = np.array([last_full.get(str(g), -1) for g in part["group"]], np.int64)
        part = part[part["seq"].to_numpy(np.int64) < bound]
        for _, i in part.sort_values(["group", "seq"]).head(limit).iterrows():
            rows.append({"group": i["group"], "seq": int(i["seq"]), "kind": "missing on some ranks",
                         "op": i["op"], "detail": f"seen on {int(i['n'])} of {int(i['gsize'])} ranks",
                         "ranks_seen": int(i["n"]), "group_size": int(i["gsize"])})
        return pd.DataFrame(rows, columns=cols)

    def skew_table(self) -> pd.DataFrame:
        """Per op: instances, skew mean / p95, transfer mean, and the share of
        collective time spent waiting for peers (skew / (skew + transfer))."""
        inst = self.instances()
        cols = ["op", "instances", "skew_ms_mean", "skew_ms_p95", "transfer_ms_mean", "wait_pct"]
        if inst.empty:
            return pd.DataFrame(columns=cols)
        rows = []
        for op, g in inst.groupby("op"):
            skew, tr = g["skew_ms"].mean(), g["transfer_ms"].clip(lower=0).mean()
            rows.append({"op": op, "instances": len(g), "skew_ms_mean": skew,
                         "skew_ms_p95": float(np.percentile(g["skew_ms"], 95)), "transfer_ms_mean": tr,
                         "wait_pct": 100.0 * skew / (skew + tr) if skew + tr > 0 else np.nan})
        return pd.DataFrame(rows, columns=cols)

    def last_by_block(self, n_blocks: int) -> List[Optional[int]]:
        """The rank that arrived last most often in each of ``n_blocks``
        consecutive blocks of the busiest group's instances (one block per
        measured step: the collectives of one step are not independent
        trials). A block whose most-often-last rank is tied has none."""
        inst = self._inst
        if inst is None or n_blocks < 1:
            return []
        multi = inst[(inst["n"] > 1) & inst["last_rank"].notna()]
        if multi.empty:
            return []
        g = multi["group"].value_counts().index[0]
        last = multi[multi["group"] == g].sort_values("seq")["last_rank"].to_numpy(dtype=np.int64)
        # np.array_split's blocks: the first len % n one longer; one pass over (block, rank) counts
        n = min(n_blocks, len(last))
        size, extra = divmod(len(last), n)
        sizes = np.full(n, size)
        sizes[:extra] += 1
        block = np.repeat(np.arange(n), sizes)
        width = int(last.max()) + 1
        keys, counts = np.unique(block * width + last, return_counts=True)
        kb, kr = keys // width, keys % width
        starts = np.flatnonzero(np.r_[True, kb[1:] != kb[:-1]])
        top = np.maximum.reduceat(counts, starts)
        at_top = counts == np.repeat(top, np.diff(np.r_[starts, len(kb)]))
        ties = np.bincount(kb[at_top], minlength=n)
        winner = np.full(n, -1, np.int64)
        winner[kb[at_top]] = kr[at_top]
        return [int(w) if t == 1 else None for w, t in zip(winner, ties)]

    def rank_lateness(self) -> pd.DataFrame:
        """Per rank: mean lateness (ms) of its arrival behind the earliest
        rank, and the fraction of instances it arrived last (computed once
        for the instances as they stand: the per-host table and the
        straggler tests both read it; each caller gets a copy)."""
        inst = self._inst
        held = self._lateness
        if held is not None and held[0] is inst:
            return held[1].copy()
        out = self._rank_lateness(inst)
        self._lateness = (inst, out)
        return out.copy()

    def _rank_lateness(self, inst: Optional[pd.DataFrame]) -> pd.DataFrame:
        if inst is None or not self._rank_sums:
            return pd.DataFrame(columns=["rank", "lateness_ms", "last_pct", "instances"])
        multi = inst[inst["n"] > 1]
        if multi.empty:
            return pd.DataFrame(columns=["rank", "lateness_ms", "last_pct", "instances"])
        rel = multi.assign(min_start=(multi["min_start"] - self._t_ref).astype(np.float64))
        per_group = rel.groupby("group").agg(sum_min=("min_start", "sum"), k=("min_start", "size"))
        groups = list(self._names["group"])
        sums = pd.DataFrame([(r, groups[g], v[0], v[1]) for (r, g), v in self._rank_sums.items()],
                            columns=["rank", "group", "sum_start", "n"])
        sums = sums.join(per_group, on="group", how="inner")
        sums = sums[sums["n"] == sums["k"]]  # rank took part in every instance of the group
        if sums.empty:
            return pd.DataFrame(columns=["rank", "lateness_ms", "last_pct", "instances"])
        per_rank = sums.groupby("rank").agg(late=("sum_start", "sum"), base=("sum_min", "sum"), n=("n", "sum"))
        last = multi["last_rank"].value_counts()
        out = pd.DataFrame({
            "rank": per_rank.index.astype(int),
            "lateness_ms": ((per_rank["late"] - per_rank["base"]) / per_rank["n"] / 1e6).to_numpy(),
            "last_pct": [100.0 * last.get(r, 0) / len(multi) for r in per_rank.index],
            "instances": per_rank["n"].to_numpy(),
        })
        return out.reset_index(drop=True)


def summary(calls: pd.DataFrame, n_steps: int, n_ranks: int) -> pd.DataFrame:
    """Per (op, source) table from a per_call frame (small traces, tests)."""
    stats = CollectiveStats()
    stats.add_calls(calls.assign(size_bucket=0))
    return stats.table(n_steps, n_ranks).drop(columns=["size"])
