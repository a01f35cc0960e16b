"""Events as numpy arrays, straight from Arrow (no pandas on the hot path).

Every analyzer takes an :class:`Events` built from a ``pyarrow.Table`` (or a
pandas DataFrame, for tests and notebooks) holding trace rows of one or more
ranks. Times are int64 nanoseconds.

**Device time first.** A row with device times (``dev_start`` and
``dev_end``: CUDA events, already on the host's clock) is placed at its
device interval, not at its host one: on a GPU the host only *enqueues*
kernels and NCCL collectives (ProcessGroupNCCL completes a collective's
future at enqueue), so host intervals say nothing about where the device
spends its time. A rank whose optimizer steps carry device times gets
device step windows too: step k runs from the device end of step k-1's
optimizer to the device end of its own (the first measured step keeps its
host length, moved to end at its optimizer's device end). Rows without
device times (data waits, CPU runs) keep their host times. Arrival skew is
the one figure that stays on host issue times (who called late), see
:mod:`.collectives`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..trace.schema import CAT

#: category name -> code in :attr:`Events.cat` (the trace schema's codes)
CAT_CODES = CAT


def _np(col, dtype, fill=0):
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_null(col.type):
        return np.full(len(col), fill, dtype=dtype)
    if col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _chunks_of(col) -> list:
    return col.chunks if isinstance(col, pa.ChunkedArray) else [col]


def _ints(col, dtype) -> np.ndarray:
    """:func:`_np` of an integer column with no null: each chunk cast
    straight into one array (no chunks combined first)."""
    chunks = _chunks_of(col)
    if len(chunks) < 2 or col.null_count or not all(pa.types.is_integer(c.type) for c in chunks):
        return _np(col, dtype)
    out = np.empty(len(col), dtype)
    pos = 0
    for c in chunks:
        out[pos:pos + len(c)] = c.to_numpy()
        pos += len(c)
    return out


def _floats(col) -> np.ndarray:
    """A numeric column as float64, a null as NaN (as Arrow converts it):
    each chunk's values cast straight into one array, its nulls marked
    from its validity bits."""
    out = np.empty(len(col), np.float64)
    pos = 0
    for c in _chunks_of(col):
        m = len(c)
        if m == 0:
            continue
        part = out[pos:pos + m]
        if pa.types.is_null(c.type):
            part[:] = np.nan
        elif pa.types.is_integer(c.type) or pa.types.is_floating(c.type):
            validity, data = c.buffers()[:2]
            part[:] = np.frombuffer(data, c.type.to_pandas_dtype(), count=c.offset + m)[c.offset:]
            if c.null_count:
                valid = np.unpackbits(np.frombuffer(validity, np.uint8), count=c.offset + m, bitorder="little")
                part[valid[c.offset:] == 0] = np.nan
        else:
            part[:] = c.to_numpy(zero_copy_only=False).astype(np.float64)
        pos += m
    return out


def _codes(col, mapping) -> np.ndarray:
    """Dictionary/string column -> int codes given a {value: code} mapping
    (unknown values and nulls -> -1). Chunk by chunk, each through its own
    dictionary (no dictionaries unified, no chunks combined first)."""
    parts = []
    for c in _chunks_of(col):
        if not pa.types.is_dictionary(c.type):
            c = c.dictionary_encode()
        dictionary = c.dictionary.to_pylist()
        lut = np.array([mapping.get(v, -1) for v in dictionary] + [-1], dtype=np.int8)
        idx = c.indices
        if idx.null_count:
            idx = pc.fill_null(idx, len(dictionary))
        parts.append(lut.take(idx.to_numpy(zero_copy_only=False)))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, np.int8)


def _bools(col) -> np.ndarray:
    """A bool column as numpy, null as False: unpacked from its value and
    validity bits chunk by chunk (no null filled in, no chunks combined
    first)."""
    parts = []
    for c in _chunks_of(col):
        if not pa.types.is_boolean(c.type):
            parts.append(_np(c, bool, fill=False))
            continue
        validity, data = c.buffers()[:2]
        span = c.offset + len(c)
        v = np.unpackbits(np.frombuffer(data, np.uint8), count=span, bitorder="little")[c.offset:]
        if validity is not None and c.null_count:
            v &= np.unpackbits(np.frombuffer(validity, np.uint8), count=span, bitorder="little")[c.offset:]
        parts.append(v.view(bool))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, bool)


def device_times(data) -> Optional[tuple]:
    """(dev_start, dev_end, has) arrays when some row has both device
    times, else None."""
    if "dev_start" not in data.column_names or "dev_end" not in data.column_names:
        return None
    ds, de = data.column("dev_start"), data.column("dev_end")
    if pa.types.is_null(ds.type) or ds.null_count == len(ds) or de.null_count == len(de):
        return None
    has = (_np(pc.is_valid(ds), bool, fill=False) & _np(pc.is_valid(de), bool, fill=False))
    if not has.any():
        return None
    return _np(ds, np.int64), _np(de, np.int64), has


def _device_view(data, rank, step, cat, t_start, t_end, dev_start, dev_end, has):
    t_start = np.where(has, dev_start, t_start)
    t_end = np.where(has, dev_end, t_end)
    # device step windows from the optimizer's device ends
    name = data.column("name")
    is_opt = (cat == CAT["compute"]) & has & (_codes(name, {"optimizer": 1}) == 1)
    if not is_opt.any():
        return t_start, t_end
    # the last optimizer end of each (rank, step)
    key = rank[is_opt] * (1 << 32) + step[is_opt]
    ends = dev_end[is_opt]
    order = np.lexsort((ends, key))
    key, ends = key[order], ends[order]
    last = np.r_[key[1:] != key[:-1], True]
    okey, oend = key[last], ends[last]
    is_step = cat == CAT["step"]
    if not is_step.any():
        return t_start, t_end
    sidx = np.flatnonzero(is_step)
    skey = rank[sidx] * (1 << 32) + step[sidx]
    pkey = skey - 1  # the previous step of the same rank
    pos = np.clip(np.searchsorted(okey, skey), 0, len(okey) - 1)
    found = okey[pos] == skey
    ppos = np.clip(np.searchsorted(okey, pkey), 0, len(okey) - 1)
    pfound = (okey[ppos] == pkey) & (step[sidx] > 0)
    new_end = np.where(found, oend[pos], t_end[sidx])
    host_len = t_end[sidx] - t_start[sidx]
    new_start = np.where(found & pfound, oend[ppos], new_end - host_len)
    t_start = t_start.copy()
    t_end = t_end.copy()
    t_start[sidx] = np.where(found, new_start, t_start[sidx])
    t_end[sidx] = new_end
    return t_start, t_end


@dataclass
class Events:
    table: pa.Table
    rank: np.ndarray
    step: np.ndarray
    cat: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    blocking: np.ndarray

    def items_at(self, rows: np.ndarray) -> np.ndarray:
        """The items (samples of a step) of the rows ``rows`` as float64, NaN
        where missing: only those rows converted (the steps', a tenth of a
        chunk)."""
        col = self.column("items")
        if col is None or not len(rows) or pa.types.is_null(col.type):
            return np.full(len(rows), np.nan)
        return _floats(col.take(rows))

    @classmethod
    def of(cls, data) -> "Events":
        if not isinstance(data, pa.Table):
            import pandas as pd

            df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
            data = pa.Table.from_pandas(df, preserve_index=False)
        n = data.num_rows
        blocking = (_bools(data.column("blocking")) if "blocking" in data.column_names
                    else np.zeros(n, bool))
        rank = _ints(data.column("rank"), np.int64)
        step = _ints(data.column("step"), np.int64)
        cat = _codes(data.column("category"), CAT_CODES)
        t_start = _np(data.column("t_start"), np.int64)
        t_end = _np(data.column("t_end"), np.int64)
        dev = device_times(data)
        if dev is not None:
            t_start, t_end = _device_view(data, rank, step, cat, t_start, t_end, *dev)
        return cls(table=data, rank=rank, step=step, cat=cat, t_start=t_start, t_end=t_end,
                   blocking=blocking)

    def __len__(self) -> int:
        return len(self.rank)

    def column(self, name: str) -> Optional[pa.ChunkedArray]:
        return self.table.column(name) if name in self.table.column_names else None
