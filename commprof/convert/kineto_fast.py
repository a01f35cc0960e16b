"""The columnar Kineto importer: one rank file -> one Arrow table (trace
schema), at the speed of decompression and decoding.

msgspec decodes the JSON straight into typed structs that keep only the
fields used (everything else is skipped by the decoder); the conversion is
column-wise: kernels are classified once per distinct (name, category,
launching op), launches are joined to kernels by correlation id and CPU ops
by External id with sorted-array lookups, steps are found with
``searchsorted``. The rows are the same as :func:`commprof.convert.kineto.convert`'s
(tested on the real fixtures); a file whose fields do not have the types
expected falls back to that converter."""
from __future__ import annotations

import os
import zlib
from typing import Any, Dict, List, Optional, Union

import msgspec
import numpy as np

try:  # Intel ISA-L inflate: about 2x zlib's speed on these files
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - isal is in install_requires
    _inflate = zlib

from ..trace.schema import TraceFormatError
from . import kineto as _slow

Num = Union[int, float, str, None]


class Args(msgspec.Struct, gc=False):
    # ids typed strictly (fast to decode); other types fall back to the row converter
    external_id: Optional[int] = msgspec.field(default=None, name="External id")
    correlation: Optional[int] = None
    coll: Optional[str] = msgspec.field(default=None, name="Collective name")
    dtype: Optional[str] = None
    n_in: Num = msgspec.field(default=None, name="In msg nelems")
    n_out: Num = msgspec.field(default=None, name="Out msg nelems")
    pg: Num = msgspec.field(default=None, name="Process Group Name")
    gsize: Num = msgspec.field(default=None, name="Group size")
    nbytes: Num = msgspec.field(default=None, name="bytes")


class Ev(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: Optional[float] = None
    dur: float = 0.0
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    args: Optional[Args] = None


class Doc(msgspec.Struct):
    traceEvents: Optional[List[Ev]] = None
    distributedInfo: Optional[Dict[str, Any]] = None
    baseTimeNanoseconds: Optional[int] = None
    deviceProperties: Optional[List[Dict[str, Any]]] = None


_DECODER = msgspec.json.Decoder(Doc)
_NP = {"int32": np.int32, "int64": np.int64, "bool": np.bool_, "double": np.float64}
KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        if path.endswith(".gz"):
            # one inflate call over the whole member(s) (faster than GzipFile's reads)
            d = _inflate.decompressobj(wbits=31)
            parts = [d.decompress(raw)]
            while d.unused_data:          # concatenated gzip members
                rest = d.unused_data
                d = _inflate.decompressobj(wbits=31)
                parts.append(d.decompress(rest))
            if not d.eof:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            return b"".join(parts) if len(parts) > 1 else parts[0]
        return raw
    except (OSError, EOFError, zlib.error, _inflate.error) as exc:
        raise TraceFormatError(f"{path}: not a readable Kineto JSON trace ({exc})") from None


def _int(v) -> Optional[int]:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def convert_file(path: str, rank: Optional[int] = None):
    """(Arrow table in the trace schema, rank metadata) of one Kineto file.
    The cyclic garbage collector is paused meanwhile: hundreds of thousands
    of small acyclic objects would otherwise trigger collection after
    collection (structs are decoded untracked, ``gc=False``)."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return _convert_file(path, rank)
    finally:
        if enabled:
            gc.enable()


def _convert_file(path: str, rank: Optional[int] = None):
    data = read_bytes(path)
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError:
        # unexpected field types: the general converter
        import json

        try:
            full = json.loads(data)
        except ValueError as exc:
            raise TraceFormatError(f"{path}: not a readable Kineto JSON trace ({exc})") from None
        return _slow_table(full, path, rank)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: not a readable Kineto JSON trace ({exc})") from None
    del data
    return convert_doc(doc, path, rank)


def _slow_table(full, path, rank):
    from ..trace import schema

    rows, meta = _slow.convert(full, path, rank)
    rows.sort(key=lambda r: (r.t_start, r.t_end))
    return schema.rows_to_table(rows, meta["rank"]), meta


_REGIONS = ("## forward ##", "## backward ##", "## optimizer ##")


def convert_doc(doc: Doc, path: str, rank: Optional[int] = None):
    """One decoded Kineto document -> (Arrow table in the trace schema,
    rank metadata). Named steps: the rank, one pass sorting the events
    by kind, the step clock, each kernel's launching op and step, the
    kernel rows, the NCCL kernels as collectives, the annotations, the
    table."""
    info = doc.distributedInfo or {}
    rank, world = _rank_of(info, path, rank)
    base = int(doc.baseTimeNanoseconds or 0)
    if doc.traceEvents is None:
        raise TraceFormatError(f"{path}: no traceEvents list")
    kern, ops, launches, annots = _partition(doc.traceEvents)
    clock = _StepClock(annots, base)
    k = _Kernels(kern, ops, launches, clock)
    cols = _kernel_columns(k)
    _add_collectives(cols, k, world)
    n_annots = _add_annotations(cols, annots, clock)
    if k.n == 0 and not n_annots:
        raise TraceFormatError(f"{path}: no events to import")
    table = _table(cols, rank)
    meta = {"rank": rank, "world_size": world, "rank_source": "distributedInfo" if "rank" in info else "--rank",
            "host": None, "source_file": os.path.basename(path), "backend": info.get("backend"),
            "nccl_version": info.get("nccl_version"), "status": "complete", "kernels": k.n,
            "steps": len(clock.steps), "device": (doc.deviceProperties or [{}])[0].get("name")
            if doc.deviceProperties else None}
    return table, meta


def _rank_of(info: Dict[str, Any], path: str, rank: Optional[int]):
    """(rank, world size): the given rank, else distributedInfo's."""
    if rank is None:
        if "rank" not in info:
            raise TraceFormatError(f"{path}: no distributedInfo.rank; give --rank for single-GPU traces")
        rank = int(info["rank"])
    return int(rank), int(info.get("world_size") or 1)


def _partition(events: List[Ev]):
    """One pass, in trace order: (kernels and memory copies, CPU ops, CUDA
    launches with a correlation id, step / region / data annotations)."""
    kern: List[Ev] = []
    ops: List[Ev] = []
    launches: List[Ev] = []
    annots: List[Ev] = []
    ka, oa, la, aa = kern.append, ops.append, launches.append, annots.append
    for e in events:
        if e.ph != "X" or e.ts is None:
            continue
        c = e.cat
        if c == "kernel" or c == "gpu_memcpy" or c == "gpu_memset":
            ka(e)
        elif c == "cpu_op":
            oa(e)
            if e.name.startswith("ProfilerStep#"):
                aa(e)
        elif c == "cuda_runtime" or c == "cuda_driver":
            if e.args is not None and e.args.correlation is not None:
                la(e)
        elif c == "user_annotation":
            n = e.name
            if n.startswith("ProfilerStep#") or n in _REGIONS or n.startswith("enumerate(DataLoader)"):
                aa(e)
    return kern, ops, launches, annots


class _StepClock:
    """Microsecond timestamps -> ns on the trace's base; a time -> the
    ProfilerStep whose host window holds it."""

    def __init__(self, annots: List[Ev], base: int):
        self.base = base
        self.steps = sorted((e for e in annots if e.name.startswith("ProfilerStep#")), key=lambda e: e.ts)
        self.starts = self.ns([e.ts for e in self.steps]) if self.steps else np.zeros(0, np.int64)
        self.ids = np.array([int(e.name.split("#", 1)[1]) for e in self.steps], np.int64)

    def ns(self, values) -> np.ndarray:
        return np.rint(np.asarray(values, np.float64) * 1000.0).astype(np.int64) + self.base

    def step_of(self, t: np.ndarray) -> np.ndarray:
        if not len(self.ids):
            return np.zeros(len(t), np.int64)
        i = np.searchsorted(self.starts, t, side="right") - 1
        return np.where(i >= 0, self.ids[np.clip(i, 0, None)], self.ids[0] - 1)


def _lookup(keys_sorted: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Position of each of ``q`` in ``keys_sorted``, -1 where absent."""
    if not len(keys_sorted):
        return np.full(len(q), -1, np.int64)
    pos = np.clip(np.searchsorted(keys_sorted, q), 0, len(keys_sorted) - 1)
    return np.where(keys_sorted[pos] == q, pos, -1)


def _take(uniques, codes):
    """String array of ``uniques[codes]`` (code -1 -> null), built in C."""
    import pyarrow as pa

    idx = pa.array(codes, pa.int64(), mask=codes < 0) if len(codes) else pa.array([], pa.int64())
    return pa.array(uniques, pa.string()).take(idx)


class _Kernels:
    """The kernels with their times, step (of their launch), launching CPU
    op and class, as codes into small dictionaries (the same answers as the
    row converter, commprof/convert/kineto.py)."""

    def __init__(self, kern: List[Ev], ops: List[Ev], launches: List[Ev], clock: _StepClock):
        self.kern = kern
        self.n = nk = len(kern)
        ns = clock.ns
        self.t0 = ns([e.ts for e in kern]) if nk else np.zeros(0, np.int64)
        self.t1 = self.t0 + np.rint(np.asarray([e.dur for e in kern], np.float64) * 1000.0).astype(np.int64) \
            if nk else self.t0
        self.args = kargs = [e.args for e in kern]
        kext = np.asarray([-1 if a is None or a.external_id is None else a.external_id for a in kargs], np.int64)
        kcorr = np.asarray([-1 if a is None or a.correlation is None else a.correlation for a in kargs], np.int64)
        op_ext_u, op_name_u = self._op_names(ops)
        lc_u, l_idx_u = self._launches(launches)
        op_pos = _lookup(op_ext_u, kext)
        l_pos = _lookup(lc_u, kcorr)
        launch_row = np.where(l_pos >= 0, l_idx_u[np.clip(l_pos, 0, None)] if len(l_idx_u) else 0, -1)
        l_ts = ns([e.ts for e in launches]) if launches else np.zeros(0, np.int64)
        launch_t = np.where(launch_row >= 0, l_ts[np.clip(launch_row, 0, None)] if len(l_ts) else 0, self.t0)
        self.step = clock.step_of(launch_t)
        self.names = [e.name for e in kern]
        names_d = pa_dict(self.names)
        self.name_code = names_d.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        self.name_u = names_d.dictionary.to_pylist()
        self.op_code, self.op_u = self._launching_ops(ops, launches, op_pos, op_name_u, launch_row)
        self.cls_u, self.cls_code = self._classes()
        self.bytes = [None if a is None or a.nbytes is None else _int(a.nbytes) for a in kargs]

    @staticmethod
    def _op_names(ops: List[Ev]):
        """CPU op name by External id (the first op with that id, as the row
        converter does): (sorted ids, their names)."""
        op_names: List[Optional[str]] = []
        op_ext = []
        for e in ops:
            x = e.args.external_id if e.args is not None else None
            if x is not None:
                op_ext.append(x)
                op_names.append(e.name)
        op_ext_a = np.asarray(op_ext, np.int64)
        order = np.argsort(op_ext_a, kind="stable")
        op_ext_s = op_ext_a[order]
        first = np.r_[True, op_ext_s[1:] != op_ext_s[:-1]] if len(op_ext_s) else np.zeros(0, bool)
        return op_ext_s[first], [op_names[i] for i in order[first]]

    @staticmethod
    def _launches(launches: List[Ev]):
        """Launches by correlation id (the last one wins, as the row
        converter's dict): (sorted ids, index of each id's launch)."""
        l_corr = np.asarray([e.args.correlation for e in launches], np.int64) if launches \
            else np.zeros(0, np.int64)
        lorder = np.argsort(l_corr, kind="stable")
        lc = l_corr[lorder]
        last = np.r_[lc[1:] != lc[:-1], True] if len(lc) else np.zeros(0, bool)
        return lc[last], lorder[last]

    def _launching_ops(self, ops, launches, op_pos, op_name_u, launch_row):
        """Each kernel's launching op as (codes, names); without an External
        id match, the innermost CPU op around the launch (rare; per kernel)."""
        missing = np.flatnonzero((op_pos < 0) & (launch_row >= 0)).tolist()
        if missing:
            op_of = [op_name_u[p] if p >= 0 else None for p in op_pos.tolist()]
            index = _slow._OpIndex([{"pid": e.pid, "tid": e.tid, "ts": e.ts, "dur": e.dur, "name": e.name}
                                    for e in ops])
            for i in missing:
                ln = launches[int(launch_row[i])]
                enc = index.innermost(ln.pid, ln.tid, ln.ts)
                op_of[i] = enc["name"] if enc else None
            src_d = pa_dict(op_of)
            return src_d.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64), \
                src_d.dictionary.to_pylist()
        opn_d = pa_dict(op_name_u)
        opn_code = opn_d.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        op_code = np.where(op_pos >= 0, opn_code[np.clip(op_pos, 0, None)] if len(opn_code) else -1, -1)
        return op_code, opn_d.dictionary.to_pylist()

    def _classes(self):
        """Each kernel's class, classified once per distinct (name, cat, op)."""
        cat_u = list(KERNEL_CATS)
        cat_code = np.asarray([KERNEL_CATS.index(e.cat) for e in self.kern], np.int64) if self.n \
            else np.zeros(0, np.int64)
        n_op = len(self.op_u) + 1
        combo = (self.name_code * len(cat_u) + cat_code) * n_op + (self.op_code + 1)
        combo_u, combo_inv = np.unique(combo, return_inverse=True)
        cls_u: List[str] = []
        for key in combo_u.tolist():
            rest, o = divmod(key, n_op)
            n_i, c_i = divmod(rest, len(cat_u))
            cls_u.append(_slow.classify(self.name_u[n_i], cat_u[c_i], self.op_u[o - 1] if o else None))
        return cls_u, combo_inv.reshape(-1).astype(np.int64)


def pa_dict(values):
    import pyarrow as pa

    return pa.array(values, pa.string()).dictionary_encode()


def _kernel_columns(k: _Kernels) -> Dict[str, list]:
    """Column parts of the kernel rows (more parts are appended per kind)."""
    import pyarrow as pa

    nk = k.n
    cols: Dict[str, list] = {
        "step": [k.step],
        "category": [pa.array(["kernel"], pa.string()).take(pa.array(np.zeros(nk, np.int64)))],
        "name": [_take(k.cls_u, k.cls_code)], "source": [_take(k.op_u, k.op_code)],
        "detail": [_take(k.name_u, k.name_code)],
        "t_start": [k.t0], "t_end": [k.t1], "dev_start": [k.t0], "dev_end": [k.t1], "bytes": [k.bytes]}
    n_none = pa.nulls(nk)
    for c in ("dtype", "group", "group_size", "seq", "blocking", "items", "value"):
        cols[c] = [n_none]
    return cols


def _add_collectives(cols: Dict[str, list], k: _Kernels, world: int) -> None:
    """NCCL kernels are also collectives (numbered per group by start time)."""
    import pyarrow as pa

    nccl_cls = [j for j, c in enumerate(k.cls_u) if c == "nccl"]
    nccl = np.flatnonzero(np.isin(k.cls_code, nccl_cls)).tolist() if nccl_cls else []
    if not nccl:
        return
    cr = []
    coll_cache: Dict[tuple, str] = {}
    bytes_cache: Dict[tuple, tuple] = {}
    t0l, t1l = k.t0.tolist(), k.t1.tolist()
    for i in nccl:
        a = k.args[i]
        ck = (k.names[i], a.coll if a is not None else None)
        coll = coll_cache.get(ck)
        if coll is None:
            coll = coll_cache[ck] = _slow.collective_of(k.names[i], {"Collective name": a.coll} if a is not None
                                                        else {})
        if a is not None:
            bk = (coll, a.dtype, a.n_in, a.n_out)
            nb = bytes_cache.get(bk)
            if nb is None:
                ad = {"Collective name": a.coll, "dtype": a.dtype, "In msg nelems": a.n_in,
                      "Out msg nelems": a.n_out}
                nb = bytes_cache[bk] = _slow.nccl_bytes(coll, ad)
            nbytes, dtype = nb
            group = str(a.pg) if a.pg is not None else "0"
            gsize = _int(a.gsize)
        else:
            nbytes, dtype = _slow.nccl_bytes(coll, {})
            group, gsize = "0", None
        cr.append((t0l[i], t1l[i], i, coll, nbytes, dtype, group, gsize if gsize is not None else world))
    cr.sort(key=lambda r: (r[0], r[1]))
    seqs: Dict[str, int] = {}
    seq_col = []
    for r in cr:
        n = seqs.get(r[6], 0)
        seqs[r[6]] = n + 1
        seq_col.append(n)
    idx = np.array([r[2] for r in cr], np.int64)
    m = len(cr)
    ct0 = np.array([r[0] for r in cr], np.int64)
    ct1 = np.array([r[1] for r in cr], np.int64)
    cols["step"].append(k.step[idx])
    cols["category"].append(["comm"] * m)
    cols["name"].append([r[3] for r in cr])
    cols["source"].append(["kineto"] * m)
    cols["detail"].append(_take(k.name_u, k.name_code[idx]))
    for c, v in (("t_start", ct0), ("t_end", ct1), ("dev_start", ct0), ("dev_end", ct1)):
        cols[c].append(v)
    cols["bytes"].append([r[4] for r in cr])
    cols["dtype"].append([r[5] for r in cr])
    cols["group"].append([r[6] for r in cr])
    cols["group_size"].append([int(r[7]) for r in cr])
    cols["seq"].append(seq_col)
    cols["blocking"].append([False] * m)
    cols["items"].append(pa.nulls(m))
    cols["value"].append(pa.nulls(m))


def _add_annotations(cols: Dict[str, list], annots: List[Ev], clock: _StepClock) -> int:
    """Steps, compute regions and data regions as rows; returns how many."""
    import pyarrow as pa

    base = clock.base
    arows = []
    for e in annots:
        a0 = int(round(float(e.ts) * 1000.0)) + base
        a1 = a0 + int(round(float(e.dur) * 1000.0))
        if e.name.startswith("ProfilerStep#"):
            arows.append((int(e.name.split("#", 1)[1]), "step", "step", "kineto", None, a0, a1))
        elif e.name.startswith("enumerate(DataLoader)"):
            arows.append((None, "data", "dataloader", "kineto", e.name, a0, a1))
        else:
            arows.append((None, "compute", e.name.strip("# ").strip(), "kineto", e.name, a0, a1))
    if not arows:
        return 0
    at0 = np.array([r[5] for r in arows], np.int64)
    ast = clock.step_of(at0)
    cols["step"].append(np.array([r[0] if r[0] is not None else int(s) for r, s in zip(arows, ast)], np.int64))
    for j, c in enumerate(("category", "name", "source", "detail")):
        cols[c].append([r[j + 1] for r in arows])
    cols["t_start"].append(at0)
    cols["t_end"].append(np.array([r[6] for r in arows], np.int64))
    n = len(arows)
    for c in ("dev_start", "dev_end", "bytes", "dtype", "group", "group_size", "seq", "blocking", "items",
              "value"):
        cols[c].append(pa.nulls(n))
    return n


def _table(cols: Dict[str, list], rank: int):
    """The column parts as one table in the trace schema, in time order."""
    import pyarrow as pa

    from ..trace import schema

    fields = schema.TRACE_SCHEMA
    total = sum(len(p) for p in cols["t_start"])
    arrays = [pa.array(np.full(total, rank, np.int32))]
    for f in fields:
        if f.name == "rank":
            continue
        dictionary = pa.types.is_dictionary(f.type)
        typ = pa.string() if dictionary else f.type
        parts = []
        for p in cols[f.name]:
            if isinstance(p, np.ndarray):
                p = pa.array(p.astype(_NP[str(typ)], copy=False))
            elif not isinstance(p, pa.Array):
                p = pa.array(p, typ)
            parts.append(p if p.type == typ else p.cast(typ))
        col = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
        arrays.append(col.dictionary_encode() if dictionary else col)
    table = pa.Table.from_arrays(arrays, schema=pa.schema(
        [pa.field(f.name, a.type, f.nullable) for f, a in zip(fields, arrays)]))
    ts_, te_ = table.column("t_start").to_numpy(), table.column("t_end").to_numpy()
    return table.take(pa.array(np.lexsort((te_, ts_))))

