"""Events as numpy arrays, straight from Arrow (no pandas on the hot path).

Every analyzer takes an :class:`Events` built from a ``pyarrow.Table`` (or a
pandas DataFrame, for tests and notebooks) holding trace rows of one or more
ranks. Times are int64 nanoseconds.
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


def _codes(col, mapping) -> np.ndarray:
    """Dictionary/string column -> int codes given a {value: code} mapping
    (unknown values and nulls -> -1)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    dictionary = col.dictionary.to_pylist()
    lut = np.array([mapping.get(v, -1) for v in dictionary] + [-1], dtype=np.int8)
    idx = _np(col.indices, np.int64, fill=len(dictionary))
    return lut[idx]


@dataclass
class Events:
    table: pa.Table
    rank: np.ndarray
    step: np.ndarray
    cat: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    blocking: np.ndarray
    items: np.ndarray  # float, NaN where missing

    @classmethod
    def of(cls, data) -> "Events":
        if not isinstance(data, pa.Table):
            import pandas as pd

            df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
            data = pa.Table.from_pandas(df, preserve_index=False)
        n = data.num_rows
        blocking = (_np(data.column("blocking"), bool, fill=False) if "blocking" in data.column_names
                    else np.zeros(n, bool))
        items = np.full(n, np.nan)
        if "items" in data.column_names and n and not pa.types.is_null(data.column("items").type):
            items = data.column("items").to_numpy(zero_copy_only=False).astype(np.float64)
        return cls(
            table=data,
            rank=_np(data.column("rank"), np.int64),
            step=_np(data.column("step"), np.int64),
            cat=_codes(data.column("category"), CAT_CODES),
            t_start=_np(data.column("t_start"), np.int64),
            t_end=_np(data.column("t_end"), np.int64),
            blocking=blocking,
            items=items,
        )

    def __len__(self) -> int:
        return len(self.rank)

    def column(self, name: str) -> Optional[pa.ChunkedArray]:
        return self.table.column(name) if name in self.table.column_names else None
