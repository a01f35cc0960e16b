"""``commprof export chrome``: a multi-rank timeline for Perfetto UI /
chrome://tracing, in the PyTorch-profiler (Kineto) JSON layout.

Layout: ``{"schemaVersion": 1, "distributedInfo": {...}, "traceEvents":
[...], "displayTimeUnit": "ms", "baseTimeNanoseconds": ...}`` with complete
("X") events in microseconds. Per rank:

- a CPU process (pid = 1000 + rank) with threads ``steps``
  (``ProfilerStep#N`` user annotations), ``data`` and ``compute`` regions
  (user annotations), ``comm wait``;
- a "GPU" process (pid = rank) with a compute stream (tid 7: forward /
  backward / optimizer as ``kernel`` events named ``commprof::<region>``)
  and a communication stream (tid 20: every collective as a ``kernel``
  event named ``ncclKernel_<Op>_commprof`` with its bytes, dtype, group and
  sequence number as args) — so Holistic Trace Analysis reads commprof's
  regions as compute kernels and its collectives as NCCL kernels. Imported
  GPU kernels keep their own names on tid 30.
- flow arrows (``s``/``f``) link the same collective (group, seq) across
  ranks in a merged file.

``per_rank=True`` writes one file per rank (``NAME.rank<R>.json[.gz]``),
each with its own ``distributedInfo``: the layout HTA loads from a folder.
A last, empty ``ProfilerStep#`` marks the end so that tools which drop
what follows the last step (HTA) keep the final step.
"""
from __future__ import annotations

import gzip
import json
import os
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..trace.files import atomic_path
from ..trace.schema import TraceFormatError
from ..trace.values import plain as _val

CPU_PID = 1000
TID = {"step": 1, "data": 2, "compute": 3, "wait": 4, "metric": 5}
GPU_COMPUTE_TID, GPU_COMM_TID, GPU_KERNEL_TID = 7, 20, 30


#: Perfetto's UI and chrome://tracing load a JSON timeline whole in the browser: past a few million
#: events they become slow or run out of memory
VIEWER_EVENTS = 5_000_000


def _us(ns: int, base: int) -> float:
    return (int(ns) - base) / 1000.0


def _plain_list(col: pd.Series) -> list:
    """A column as JSON-ready Python values (None where missing), as
    :func:`commprof.trace.values.plain` makes them, without a call per row."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return [None if v != v or v is None else str(v) for v in col.astype(object).tolist()]
    missing = col.isna().to_numpy()
    vals = col.tolist()
    if col.dtype == object:
        simple = (bool, int, float, str)
        return [None if m else (v if type(v) in simple else _val(v)) for v, m in zip(vals, missing)]
    return [None if m else v for v, m in zip(vals, missing)] if missing.any() else vals


def _header_events(rank: int, host: Optional[str]) -> List[dict]:
    cpu, gpu = CPU_PID + rank, rank
    out = [{"ph": "M", "name": "process_name", "pid": cpu, "tid": 0,
            "args": {"name": f"rank {rank}" + (f" ({host})" if host else "") + " host"}},
           {"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": f"rank {rank} device"}}]
    for name, tid in (("steps", 1), ("data", 2), ("compute", 3), ("comm wait", 4)):
        out.append({"ph": "M", "name": "thread_name", "pid": cpu, "tid": tid, "args": {"name": name}})
    for name, tid in (("compute stream", GPU_COMPUTE_TID), ("communication stream", GPU_COMM_TID),
                      ("kernels", GPU_KERNEL_TID)):
        out.append({"ph": "M", "name": "thread_name", "pid": gpu, "tid": tid, "args": {"name": name}})
    return out


def rank_events(ev: pd.DataFrame, rank: int, base: int, host: Optional[str]) -> List[dict]:
    """One rank's events (``ev``: that rank's rows, in order) as trace events."""
    table = pa.Table.from_pandas(ev, preserve_index=False)
    return json.loads("[" + b"".join(_chunk_texts(table, base, {rank: host})).decode().rstrip(", ") + "]")


# -- events as text, vectorised in Arrow ----------------------------------------------------------
def _lit(text: str):
    return pa.scalar(text, pa.string())


def _join(*parts):
    """Element-wise concatenation of string arrays and literals."""
    return pc.binary_join_element_wise(*[_lit(p) if isinstance(p, str) else p for p in parts], _lit(""))


def _us_text(ns: np.ndarray) -> pa.Array:
    """(ns) / 1000 as Python's repr writes the float: the decimal of an
    integer number of nanoseconds, trailing zeros trimmed ('12.5', '3.0').
    Exact for |values| below 2**52 ns / 1000 (52 days), where no shorter
    decimal reaches the same double; beyond, Python's repr per value."""
    ns = np.asarray(ns, np.int64)
    big = np.abs(ns) >= (1 << 52)
    whole = pc.cast(pa.array(np.abs(ns) // 1000), pa.string())
    frac = pc.utf8_rtrim(pc.utf8_lpad(pc.cast(pa.array(np.abs(ns) % 1000), pa.string()), 3, "0"), "0")
    frac = pc.if_else(pc.equal(pc.utf8_length(frac), 0), _lit("0"), frac)
    text = _join(pc.if_else(pa.array(ns < 0), _lit("-"), _lit("")), whole, ".", frac)
    if big.any():
        fix = [repr(v / 1000.0) for v in ns[big].tolist()]
        text = pc.replace_with_mask(text, pa.array(big), pa.array(fix, pa.string()))
    return text


def _num_text(col: pa.ChunkedArray, as_float: bool = False) -> pa.Array:
    """A numeric column as json.dumps writes each value (floats by repr, null).
    ``as_float``: integers written as floats, as pandas holds an integer
    column with missing values."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_integer(arr.type) and not as_float:
        return pc.fill_null(pc.cast(arr, pa.string()), _lit("null"))
    if pa.types.is_boolean(arr.type):
        return pc.fill_null(pc.if_else(arr, _lit("true"), _lit("false")), _lit("null"))
    v = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    valid = np.isfinite(v)
    integral = valid & (np.floor(v) == v) & (np.abs(v) < 1e16)
    whole = np.where(integral, v, 0).astype(np.int64)
    text = _join(pc.cast(pa.array(whole), pa.string()), ".0")
    other = valid & ~integral
    if other.any():
        text = pc.replace_with_mask(text, pa.array(other), pa.array([repr(x) for x in v[other].tolist()], pa.string()))
    return pc.if_else(pa.array(valid), text, _lit("null"))


def _str_text(col: pa.ChunkedArray, fmt=None) -> pa.Array:
    """A string column JSON-encoded (one json.dumps per distinct value); null
    as null. ``fmt`` turns each value into the string that is encoded."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    values = arr.dictionary.to_pylist()
    texts = pa.array([json.dumps(fmt(v) if fmt else v) for v in values] + ["null"], pa.string())
    idx = pc.fill_null(arr.indices.cast(pa.int64()), len(values))
    return pc.take(texts, idx)


#: rows formatted at a time (memory: ~1 KB per row in flight)
SLICE_ROWS = 65_536


def _chunk_texts(table: pa.Table, base: int, hosts: Dict[int, Optional[str]]):
    """:func:`_slice_texts` over slices of at most SLICE_ROWS rows of one rank
    each, the rank's metadata events first and its end marker last."""
    rank = table.column("rank").to_numpy().astype(np.int64)
    order = np.argsort(rank, kind="stable")
    if (np.diff(order) != 1).any():
        table = table.take(pa.array(order))
        rank = rank[order]
    n = table.num_rows
    if not n:
        return
    bounds = np.flatnonzero(np.diff(rank)) + 1
    is_step = pc.equal(table.column("category").cast(pa.string()), "step")
    for a, b in zip(np.r_[0, bounds].tolist(), np.r_[bounds, n].tolist()):
        r = int(rank[a])
        yield ("".join(json.dumps(e) + ", " for e in _header_events(r, hosts.get(r)))).encode()
        part = table.slice(a, b - a)
        for lo in range(0, b - a, SLICE_ROWS):
            yield from _slice_texts(part.slice(lo, SLICE_ROWS), base, part)
        steps = part.filter(pc.fill_null(is_step.slice(a, b - a), False))
        if steps.num_rows:
            marker = {"ph": "X", "cat": "user_annotation",
                      "name": f"ProfilerStep#{int(pc.max(part.column('step')).as_py()) + 1}",
                      "pid": CPU_PID + r, "tid": 1, "ts": _us(int(pc.max(steps.column("t_end")).as_py()), base) + 1.0,
                      "dur": 0.0, "args": {"end_marker": True}}
            yield (json.dumps(marker) + ", ").encode()


def _slice_texts(table: pa.Table, base: int, whole: pa.Table):
    """Rows of one rank as UTF-8 bytes, in order (a compute region is two
    events, host and device), every event followed by ', ', exactly as
    ``json.dumps`` writes it. ``whole``: the rank's table (integer columns
    with missing values anywhere are written as floats, as pandas holds
    them)."""
    r = _RankColumns(table, base, whole)
    pieces = [p for p in (_step_texts(r), _wait_texts(r), _compute_texts(r), _comm_texts(r), _kernel_texts(r))
              if p is not None]
    yield _in_row_order(pieces, table.num_rows)


class _RankColumns:
    """One rank's rows as arrays, and the text of their common fields."""

    def __init__(self, table: pa.Table, base: int, whole: pa.Table):
        self.table, self.base, self.whole = table, base, whole
        rank = table.column("rank").to_numpy().astype(np.int64)
        cats = table.column("category").combine_chunks()
        if not pa.types.is_dictionary(cats.type):
            cats = pc.dictionary_encode(cats)
        names = cats.dictionary.to_pylist()
        ci = cats.indices.to_numpy(zero_copy_only=False)
        self.cat = np.array(names + [""], dtype=object)[np.where(pd.isna(ci), len(names), ci).astype(np.int64)] \
            if len(ci) else np.array([], dtype=object)
        self.t0 = table.column("t_start").to_numpy().astype(np.int64)
        self.t1 = table.column("t_end").to_numpy().astype(np.int64)
        self.step = table.column("step").to_numpy().astype(np.int64)
        self.cpu = pc.cast(pa.array(CPU_PID + rank), pa.string())
        self.gpu = pc.cast(pa.array(rank), pa.string())

    def rows(self, kinds) -> np.ndarray:
        return np.flatnonzero(np.isin(self.cat, kinds))

    def common(self, sel):
        """(ts, dur, step, CPU pid, GPU pid) as text."""
        return (_us_text(self.t0[sel] - self.base), _us_text(np.maximum(self.t1[sel] - self.t0[sel], 0)),
                pc.cast(pa.array(self.step[sel]), pa.string()), pc.take(self.cpu, pa.array(sel)),
                pc.take(self.gpu, pa.array(sel)))

    def col(self, name, sel, fmt=None, kind="str"):
        c = self.table.column(name).take(pa.array(sel))
        return _str_text(c, fmt) if kind == "str" else _num_text(c, self.whole.column(name).null_count > 0)


def _step_texts(r: _RankColumns):
    sel = r.rows(["step"])
    if not len(sel):
        return None
    ts, dur, st, c_pid, _g = r.common(sel)
    return sel, _join('{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#', st,
                      '", "pid": ', c_pid, ', "tid": 1, "ts": ', ts, ', "dur": ', dur,
                      ', "args": {"items": ', r.col("items", sel, kind="num"), '}}, ')


def _wait_texts(r: _RankColumns):
    sel = r.rows(["data", "wait"])
    if not len(sel):
        return None
    ts, dur, st, c_pid, _g = r.common(sel)
    tid = pa.array(np.where(r.cat[sel] == "data", str(TID["data"]), str(TID["wait"])).tolist(), pa.string())
    return sel, _join('{"ph": "X", "cat": "user_annotation", "name": ', r.col("name", sel), ', "pid": ',
                      c_pid, ', "tid": ', tid, ', "ts": ', ts, ', "dur": ', dur,
                      ', "args": {"step": ', st, '}}, ')


def _compute_texts(r: _RankColumns):
    """A compute region: a host annotation and a device kernel."""
    sel = r.rows(["compute"])
    if not len(sel):
        return None
    ts, dur, st, c_pid, g_pid = r.common(sel)
    return sel, _join('{"ph": "X", "cat": "user_annotation", "name": ', r.col("name", sel), ', "pid": ',
                      c_pid, ', "tid": 3, "ts": ', ts, ', "dur": ', dur, ', "args": {"step": ', st,
                      ', "detail": ', r.col("detail", sel), '}}, ',
                      '{"ph": "X", "cat": "kernel", "name": ',
                      r.col("name", sel, lambda v: f"commprof::{v}"), ', "pid": ', g_pid,
                      f', "tid": {GPU_COMPUTE_TID}, "ts": ', ts, ', "dur": ', dur,
                      f', "args": {{"device": 0, "stream": {GPU_COMPUTE_TID}, "step": ', st, '}}, ')


def _comm_texts(r: _RankColumns):
    """A collective: an NCCL-named kernel with the args HTA reads."""
    sel = r.rows(["comm"])
    if not len(sel):
        return None
    ts, dur, st, _c, g_pid = r.common(sel)
    kname = r.col("name", sel, lambda v: "ncclKernel_" + "".join(w.capitalize() for w in str(v).split("_"))
                  + "_commprof")
    return sel, _join('{"ph": "X", "cat": "kernel", "name": ', kname, ', "pid": ', g_pid,
                      f', "tid": {GPU_COMM_TID}, "ts": ', ts, ', "dur": ', dur,
                      f', "args": {{"device": 0, "stream": {GPU_COMM_TID}, "Collective name": ',
                      r.col("name", sel), ', "bytes": ', r.col("bytes", sel, kind="num"), ', "dtype": ',
                      r.col("dtype", sel), ', "Group size": ', r.col("group_size", sel, kind="num"),
                      ', "Process Group Name": ', r.col("group", sel), ', "seq": ',
                      r.col("seq", sel, kind="num"), ', "blocking": ', r.col("blocking", sel, kind="num"),
                      ', "source": ', r.col("source", sel), ', "step": ', st, '}}, ')


def _kernel_texts(r: _RankColumns):
    sel = r.rows(["kernel"])
    if not len(sel):
        return None
    ts, dur, _s, _c, g_pid = r.common(sel)
    return sel, _join('{"ph": "X", "cat": "kernel", "name": ', r.col("detail", sel, str), ', "pid": ',
                      g_pid, f', "tid": {GPU_KERNEL_TID}, "ts": ', ts, ', "dur": ', dur,
                      f', "args": {{"device": 0, "stream": {GPU_KERNEL_TID}, "class": ',
                      r.col("name", sel), '}}, ')


def _in_row_order(pieces, n: int) -> bytes:
    """Every row's text (empty for rows that make no event), in row order,
    as one byte string."""
    pos = np.full(n, -1, np.int64)
    arrays, offset = [], 0
    for sel, text in pieces:
        pos[sel] = offset + np.arange(len(sel))
        arrays.append(text)
        offset += len(sel)
    arrays.append(pa.array([""], pa.string()))
    pos[pos < 0] = offset
    allt = pa.concat_arrays([a.cast(pa.large_string()) for a in arrays])
    rows = pc.take(allt, pa.array(pos))
    offs = rows.buffers()[1]
    data = rows.buffers()[2]
    o = np.frombuffer(offs, np.int64)[rows.offset:rows.offset + len(rows) + 1]
    return memoryview(data)[o[0]:o[-1]].tobytes()


class _Flows:
    """Collectives gathered rank chunk by rank chunk (group, seq, rank,
    issue, op), turned into flow arrows at the end with a few sorts: one
    arrow from the earliest issuer to every other rank of the same (group,
    seq). Ids number the instances in order of first appearance."""

    def __init__(self):
        self.parts: List[tuple] = []
        self.groups: Dict[str, int] = {}
        self.names: Dict[str, int] = {}

    def add_table(self, table: pa.Table) -> None:
        cat = table.column("category").cast(pa.string())
        m = pc.and_(pc.and_(pc.equal(cat, "comm"), pc.is_valid(table.column("seq"))),
                    pc.is_valid(table.column("group")))
        c = table.filter(pc.fill_null(m, False))
        if not c.num_rows:
            return

        def codes(name, known):
            arr = c.column(name).combine_chunks()
            if not pa.types.is_dictionary(arr.type):
                arr = pc.dictionary_encode(arr)
            lut = np.array([known.setdefault(str(v), len(known)) for v in arr.dictionary.to_pylist()], np.int64)
            return lut[arr.indices.to_numpy(zero_copy_only=False).astype(np.int64)]

        self.parts.append((codes("group", self.groups), c.column("seq").to_numpy().astype(np.int64),
                           c.column("rank").to_numpy().astype(np.int64),
                           c.column("t_start").to_numpy().astype(np.int64), codes("name", self.names)))

    def events(self, base: int):
        """The arrows as JSON texts (as json.dumps writes them), in batches
        of at most 262,144."""
        if not self.parts:
            return
        g, seq, rank, t, nm = (np.concatenate([p[k] for p in self.parts]) for k in range(5))
        self.parts = []
        s0 = int(seq.min())
        key = g * (int(seq.max()) - s0 + 1) + (seq - s0)
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        ident = np.empty(len(uniq), np.int64)
        ident[np.argsort(first, kind="stable")] = np.arange(1, len(uniq) + 1)   # first-appearance order
        width = int(rank.max()) + 1
        pairs = np.unique(inv.astype(np.int64) * width + rank)                  # an instance on one rank: no arrow
        n_ranks = np.bincount(pairs // width, minlength=len(uniq))
        order = np.lexsort((t, inv))                                            # by instance, then issue time
        inv_o, rank_o, t_o, seq_o = inv[order], rank[order], t[order], seq[order]
        head = np.r_[True, inv_o[1:] != inv_o[:-1]]
        head_idx = np.cumsum(head) - 1
        first_name = nm[order][head]
        names = list(self.names)
        label: Dict[int, str] = {}
        keep = np.flatnonzero(n_ranks[inv_o] >= 2)
        for lo in range(0, len(keep), 1 << 18):                                 # in batches: memory stays flat
            idx = keep[lo:lo + (1 << 18)]
            out: List[str] = []
            for hd, h, r, tt, inst, sq in zip(head[idx].tolist(), head_idx[idx].tolist(), rank_o[idx].tolist(),
                                              ((t_o[idx] - base) / 1000.0).tolist(), ident[inv_o[idx]].tolist(),
                                              seq_o[idx].tolist()):
                lab = label.get(h)
                if lab is None:
                    lab = label[h] = json.dumps(f"{names[int(first_name[h])]} seq {sq}")
                out.append((_FLOW_S if hd else _FLOW_F) % (inst, lab, r, GPU_COMM_TID, tt))
            yield ", ".join(out)


_FLOW_S = '{"ph": "s", "id": %d, "name": %s, "cat": "collective", "pid": %d, "tid": %d, "ts": %r}'
_FLOW_F = '{"ph": "f", "bp": "e", "id": %d, "name": %s, "cat": "collective", "pid": %d, "tid": %d, "ts": %r}'


def flows(ev: pd.DataFrame, base: int) -> List[dict]:
    """Flow arrows linking the same collective (group, seq) across ranks."""
    f = _Flows()
    f.add_table(pa.Table.from_pandas(ev, preserve_index=False))
    return [e for batch in f.events(base) for e in json.loads("[" + batch + "]")]


COLUMNS = ["rank", "step", "category", "name", "source", "detail", "t_start", "t_end", "bytes", "dtype", "group",
           "group_size", "seq", "blocking", "items"]


@contextmanager
def _stream(path: str):
    """A binary file that becomes ``path`` when the block ends without error;
    gzip (ISA-L's where installed, level 1: the speed of the write) for ``.gz``."""
    with atomic_path(path) as tmp:
        if path.endswith(".gz"):
            try:
                from isal import igzip

                fh = igzip.open(tmp, "wb", compresslevel=1)
            except ImportError:
                fh = gzip.open(tmp, "wb", compresslevel=1)
        else:
            fh = open(tmp, "wb", buffering=1 << 20)
        try:
            yield fh
        finally:
            fh.close()


class _Writer:
    """``{header..., "traceEvents": [`` events, streamed ``]}``, written as
    ``json.dump`` writes the whole document (default separators: HTA finds
    the rank with ``"rank":\\s+(\\d+)``). Events come as text each followed
    by ', '; the last separator is held back."""

    def __init__(self, fh, header: dict):
        self.fh = fh
        head = json.dumps(dict(header, traceEvents=[]))
        cut = head.rindex("[]")
        self.tail = head[cut + 2:]
        fh.write(head[:cut + 1].encode())
        self.held = b""

    def write_bytes(self, text: bytes) -> None:
        if not text:
            return
        self.fh.write(self.held)
        self.fh.write(text[:-2])
        self.held = text[-2:]

    def close(self) -> None:
        self.fh.write(("]" + self.tail).encode())


def _scan(trace) -> tuple:
    """First pass over two columns: the earliest start, the ranks, the event count."""
    base, ranks, count = None, set(), 0
    for t in trace.chunks(["rank", "category", "t_start"]):
        if not t.num_rows:
            continue
        keep = pc.not_equal(t.column("category").cast(pa.string()), "metric")
        t = t.filter(keep)
        if not t.num_rows:
            continue
        m = pc.min(t.column("t_start")).as_py()
        base = m if base is None else min(base, m)
        ranks.update(pc.unique(t.column("rank")).to_pylist())
        count += t.num_rows
    return base, sorted(int(r) for r in ranks), count


def export_chrome(trace, out: str, steps=None, ranks: Optional[Sequence[int]] = None,
                  per_rank: bool = False, on_rank=None, warn=None) -> List[str]:
    """Write the timeline, streaming: one rank chunk at a time is read,
    encoded and written (memory flat in the trace's size). Returns the paths
    written. ``on_rank(done, total)`` is called after each rank (progress
    display); ``warn(text)`` once when the timeline is larger than the
    viewers load well."""
    view = trace.filter(ranks=ranks, steps=steps)
    base, seen, count = _scan(view)
    if base is None:
        raise TraceFormatError(f"{trace.path}: no events in the chosen steps / ranks")
    if warn is not None and count > VIEWER_EVENTS:
        warn(f"{count:,} events: Perfetto's UI and chrome://tracing load a timeline whole and become slow or "
             f"fail past ~{VIEWER_EVENTS // 1_000_000} M; choose a part with --steps A:B and/or --ranks LIST")
    hosts: Dict[int, str] = {int(m.get("rank", -1)): m.get("host") for m in trace.ranks}
    world = int(trace.meta.get("world_size") or len(seen))
    header = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": int(base),
              "traceName": os.path.basename(out), "commprof": {"run_id": trace.meta.get("run_id"),
                                                              "source": trace.path}}
    n, done = len(seen), 0

    def rank_tables():
        for table in view.chunks(COLUMNS, max_rows=1):      # one rank at a time
            if not table.num_rows:
                continue
            keep = pc.not_equal(table.column("category").cast(pa.string()), "metric")
            table = table.filter(pc.fill_null(keep, True))
            if table.num_rows:
                yield table

    if per_rank:
        stem = out
        for ext in (".json.gz", ".json"):
            if stem.endswith(ext):
                stem = stem[: -len(ext)]
                break
        suffix = ".json.gz" if out.endswith(".gz") else ".json"
        written = []
        for table in rank_tables():
            ranks_here = sorted(set(table.column("rank").to_pylist()))
            for rank in ranks_here:
                part = table.filter(pc.equal(table.column("rank"), rank))
                path = f"{stem}.rank{rank}{suffix}"
                with _stream(path) as fh:
                    w = _Writer(fh, dict(header, distributedInfo={"rank": rank, "world_size": world,
                                                                  "backend": trace.meta.get("backend")}))
                    for text in _chunk_texts(part, base, hosts):
                        w.write_bytes(text)
                    w.close()
                written.append(path)
                done += 1
                if on_rank is not None:
                    on_rank(done, n)
        return written
    fl = _Flows()
    with _stream(out) as fh:
        w = _Writer(fh, dict(header, distributedInfo={"rank": seen[0], "world_size": world,
                                                      "backend": trace.meta.get("backend"), "merged_ranks": seen}))
        for table in rank_tables():
            for text in _chunk_texts(table, base, hosts):
                w.write_bytes(text)
            fl.add_table(table)
            for _r in set(table.column("rank").to_pylist()):
                done += 1
                if on_rank is not None:
                    on_rank(done, n)
        for batch in fl.events(base):
            w.write_bytes((batch + ", ").encode())
        w.close()
    return [out]


def as_device_view(events: pd.DataFrame) -> pd.DataFrame:
    """commprof's events as the export presents them to HTA: compute regions
    as compute kernels, collectives as NCCL kernels (for computing HTA's
    figures from the trace itself, see commprof.analyzers.kernels)."""
    ev = events[events["category"].astype(str).isin(["compute", "comm"])].copy()
    ev["name"] = ev["category"].astype(str).map({"compute": "other", "comm": "nccl"})
    ev["detail"] = "commprof"
    ev["category"] = "kernel"
    return ev


REQUIRED = {"X": ("name", "ph", "ts", "dur", "pid", "tid"), "M": ("name", "ph", "pid", "args"),
            "s": ("name", "ph", "ts", "pid", "tid", "id"), "f": ("name", "ph", "ts", "pid", "tid", "id", "bp")}


def validate(doc: dict) -> List[str]:
    """Problems with a trace-event-format document (empty list = valid)."""
    problems = []
    if not isinstance(doc.get("traceEvents"), list):
        return ["traceEvents is not a list"]
    for i, e in enumerate(doc["traceEvents"]):
        ph = e.get("ph")
        if ph not in REQUIRED:
            problems.append(f"event {i}: unknown phase {ph!r}")
            continue
        for k in REQUIRED[ph]:
            if k not in e:
                problems.append(f"event {i}: {ph} event without {k!r}")
        if "ts" in e and not isinstance(e["ts"], (int, float)):
            problems.append(f"event {i}: ts is not a number")
        if ph == "X" and (not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0):
            problems.append(f"event {i}: bad dur")
    return problems
