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


def convert_doc(doc: Doc, path: str, rank: Optional[int] = None):
    import pyarrow as pa

    from ..trace import schema

    info = doc.distributedInfo or {}
    if rank is None:
        if "rank" not in info:
            raise TraceFormatError(f"{path}: no distributedInfo.rank; give --rank for single-GPU traces")
        rank = int(info["rank"])
    rank = int(rank)
    world = int(info.get("world_size") or 1)
    base = int(doc.baseTimeNanoseconds or 0)
    events = doc.traceEvents
    if events is None:
        raise TraceFormatError(f"{path}: no traceEvents list")
    # one pass: the events each part of the conversion needs, in trace order
    kern: List[Ev] = []
    ops: List[Ev] = []
    launches: List[Ev] = []
    annots: List[Ev] = []
    ka, oa, la, aa = kern.append, ops.append, launches.append, annots.append
    regions = ("## forward ##", "## backward ##", "## optimizer ##")
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
            if n.startswith("ProfilerStep#") or n in regions or n.startswith("enumerate(DataLoader)"):
                aa(e)
    del events

    def ns(values) -> np.ndarray:
        return np.rint(np.asarray(values, np.float64) * 1000.0).astype(np.int64) + base

    # steps (host windows)
    steps = sorted((e for e in annots if e.name.startswith("ProfilerStep#")), key=lambda e: e.ts)
    step_starts = ns([e.ts for e in steps]) if steps else np.zeros(0, np.int64)
    step_ids = np.array([int(e.name.split("#", 1)[1]) for e in steps], np.int64)

    def step_of(t: np.ndarray) -> np.ndarray:
        if not len(step_ids):
            return np.zeros(len(t), np.int64)
        i = np.searchsorted(step_starts, t, side="right") - 1
        return np.where(i >= 0, step_ids[np.clip(i, 0, None)], step_ids[0] - 1)

    # CPU op name by External id (the first op with that id, as the row converter does)
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
    op_ext_u = op_ext_s[first]
    op_name_u = [op_names[i] for i in order[first]]

    # launches by correlation id (the last one wins, as the row converter's dict)
    l_corr = np.asarray([e.args.correlation for e in launches], np.int64) if launches else np.zeros(0, np.int64)
    l_ts = ns([e.ts for e in launches]) if launches else np.zeros(0, np.int64)
    lorder = np.argsort(l_corr, kind="stable")
    lc = l_corr[lorder]
    last = np.r_[lc[1:] != lc[:-1], True] if len(lc) else np.zeros(0, bool)
    l_idx_u = lorder[last]
    lc_u = lc[last]

    nk = len(kern)
    t0 = ns([e.ts for e in kern]) if nk else np.zeros(0, np.int64)
    t1 = t0 + np.rint(np.asarray([e.dur for e in kern], np.float64) * 1000.0).astype(np.int64) if nk else t0
    kargs = [e.args for e in kern]
    kext = np.asarray([-1 if a is None or a.external_id is None else a.external_id for a in kargs], np.int64)
    kcorr = np.asarray([-1 if a is None or a.correlation is None else a.correlation for a in kargs], np.int64)

    def lookup(keys_sorted, q):
        if not len(keys_sorted):
            return np.full(len(q), -1, np.int64)
        pos = np.clip(np.searchsorted(keys_sorted, q), 0, len(keys_sorted) - 1)
        return np.where(keys_sorted[pos] == q, pos, -1)

    op_pos = lookup(op_ext_u, kext)
    l_pos = lookup(lc_u, kcorr)
    launch_row = np.where(l_pos >= 0, l_idx_u[np.clip(l_pos, 0, None)] if len(l_idx_u) else 0, -1)
    # no External id match: the innermost CPU op around the launch (rare; per kernel)
    missing = np.flatnonzero((op_pos < 0) & (launch_row >= 0)).tolist()
    op_of: List[Optional[str]] = []
    if missing:
        op_of = [op_name_u[p] if p >= 0 else None for p in op_pos.tolist()]
        index = _slow._OpIndex([{"pid": e.pid, "tid": e.tid, "ts": e.ts, "dur": e.dur, "name": e.name} for e in ops])
        for i in missing:
            ln = launches[int(launch_row[i])]
            enc = index.innermost(ln.pid, ln.tid, ln.ts)
            op_of[i] = enc["name"] if enc else None
    launch_t = np.where(launch_row >= 0, l_ts[np.clip(launch_row, 0, None)] if len(l_ts) else 0, t0)
    kstep = step_of(launch_t)

    # kernel names and their launching ops as codes into small dictionaries
    names = [e.name for e in kern]
    names_d = pa.array(names, pa.string()).dictionary_encode()
    name_code = names_d.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    name_u = names_d.dictionary.to_pylist()
    if missing:
        src_d = pa.array(op_of, pa.string()).dictionary_encode()
        op_code = src_d.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        op_u = src_d.dictionary.to_pylist()
    else:
        opn_d = pa.array(op_name_u, pa.string()).dictionary_encode()
        opn_code = opn_d.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        op_code = np.where(op_pos >= 0, opn_code[np.clip(op_pos, 0, None)] if len(opn_code) else -1, -1)
        op_u = opn_d.dictionary.to_pylist()
    cat_u = list(KERNEL_CATS)
    cat_code = np.asarray([KERNEL_CATS.index(e.cat) for e in kern], np.int64) if nk else np.zeros(0, np.int64)

    # classify once per distinct (name, cat, op)
    combo = (name_code * len(cat_u) + cat_code) * (len(op_u) + 1) + (op_code + 1)
    combo_u, combo_inv = np.unique(combo, return_inverse=True)
    cls_u: List[str] = []
    for k in combo_u.tolist():
        rest, o = divmod(k, len(op_u) + 1)
        n_i, c_i = divmod(rest, len(cat_u))
        cls_u.append(_slow.classify(name_u[n_i], cat_u[c_i], op_u[o - 1] if o else None))
    cls_code = combo_inv.reshape(-1).astype(np.int64)
    kbytes = [None if a is None or a.nbytes is None else _int(a.nbytes) for a in kargs]

    def take(uniques, codes):
        """String array of ``uniques[codes]`` (code -1 -> null), built in C."""
        idx = pa.array(codes, pa.int64(), mask=codes < 0) if len(codes) else pa.array([], pa.int64())
        return pa.array(uniques, pa.string()).take(idx)

    cols: Dict[str, list] = {}
    # kernel rows
    cols["step"] = [kstep]
    cols["category"] = [pa.array(["kernel"], pa.string()).take(pa.array(np.zeros(nk, np.int64)))]
    cols["name"] = [take(cls_u, cls_code)]
    cols["source"] = [take(op_u, op_code)]
    cols["detail"] = [take(name_u, name_code)]
    cols["t_start"], cols["t_end"], cols["dev_start"], cols["dev_end"] = [t0], [t1], [t0], [t1]
    cols["bytes"] = [kbytes]
    n_none = pa.nulls(nk)
    for c in ("dtype", "group", "group_size", "seq", "blocking", "items", "value"):
        cols[c] = [n_none]

    # NCCL kernels are also collectives (numbered per group by start time)
    nccl_cls = [j for j, c in enumerate(cls_u) if c == "nccl"]
    nccl = np.flatnonzero(np.isin(cls_code, nccl_cls)).tolist() if nccl_cls else []
    if nccl:
        cr = []
        coll_cache: Dict[tuple, str] = {}
        bytes_cache: Dict[tuple, tuple] = {}
        t0l, t1l = t0.tolist(), t1.tolist()
        for i in nccl:
            a = kern[i].args
            ck = (names[i], a.coll if a is not None else None)
            coll = coll_cache.get(ck)
            if coll is None:
                ad = {"Collective name": a.coll} if a is not None else {}
                coll = coll_cache[ck] = _slow.collective_of(names[i], ad)
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
        cols["step"].append(kstep[idx])
        cols["category"].append(["comm"] * m)
        cols["name"].append([r[3] for r in cr])
        cols["source"].append(["kineto"] * m)
        cols["detail"].append(take(name_u, name_code[idx]))
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

    # annotations: steps, compute regions, data regions
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
    if arows:
        at0 = np.array([r[5] for r in arows], np.int64)
        ast = step_of(at0)
        cols["step"].append(np.array([r[0] if r[0] is not None else int(s) for r, s in zip(arows, ast)], np.int64))
        for j, c in enumerate(("category", "name", "source", "detail")):
            cols[c].append([r[j + 1] for r in arows])
        cols["t_start"].append(at0)
        cols["t_end"].append(np.array([r[6] for r in arows], np.int64))
        k = len(arows)
        for c in ("dev_start", "dev_end", "bytes", "dtype", "group", "group_size", "seq", "blocking", "items",
                  "value"):
            cols[c].append(pa.nulls(k))
    if nk == 0 and not arows:
        raise TraceFormatError(f"{path}: no events to import")

    fields = schema.TRACE_SCHEMA
    arrays = []
    total = sum(len(p) for p in cols["t_start"])
    arrays.append(pa.array(np.full(total, rank, np.int32)))
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
    table = table.take(pa.array(np.lexsort((te_, ts_))))
    meta = {"rank": rank, "world_size": world, "rank_source": "distributedInfo" if "rank" in info else "--rank",
            "host": None, "source_file": os.path.basename(path), "backend": info.get("backend"),
            "nccl_version": info.get("nccl_version"), "status": "complete", "kernels": nk,
            "steps": len(steps), "device": (doc.deviceProperties or [{}])[0].get("name")
            if doc.deviceProperties else None}
    return table, meta

