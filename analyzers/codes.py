"""Integer codes for string and host columns (one pass, no string column
built per row), shared by the per-node and clock analyses."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa


def str_codes(col: pd.Series):
    """(integer code per row, the distinct values as strings), without
    converting every row to a string: a categorical's own codes, else a hash
    factorisation. Missing values are one more value, 'nan' (as astype(str))."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy().astype(np.int64)
        names = [str(c) for c in col.cat.categories]
        if (codes < 0).any():
            codes = np.where(codes < 0, len(names), codes)
            names.append("nan")
        return codes, names
    codes, uniq = pd.factorize(col, use_na_sentinel=False)
    return codes.astype(np.int64), [str(u) for u in uniq]


def strings_at(names: Sequence[str], codes: np.ndarray):
    """``names[codes]`` (a negative code counts from the end, as numpy
    indexes) as pandas makes a column of such strings (pandas 3: its
    Arrow-backed ``str``; before: objects), taken in Arrow: pandas 3 looks
    at every row of an object array to convert it (70 k rows: ~10 ms a
    column, against ~1 ms)."""
    values = list(names)
    if not len(codes) or not all(isinstance(v, str) for v in values):     # pandas' own inference, as before
        return pd.Series(np.array(values, dtype=object)[codes]).array
    at = np.asarray(codes, np.int64)      # codes from the end made positive without overflow
    if at.size and at.min() < 0:
        at = np.where(at < 0, at + len(values), at)
    return pa.array(values, pa.string()).take(pa.array(at)).to_pandas().array


def host_codes(ranks: np.ndarray, hosts: Dict[int, str]) -> np.ndarray:
    """Per row, an integer code of its rank's host (unknown hosts: one code, '?')."""
    r = np.asarray(ranks, np.int64)
    if not len(r):
        return np.zeros(0, np.int64)
    names = sorted(set(hosts.values()) | {"?"})
    code = {h: i for i, h in enumerate(names)}
    lut = np.full(int(r.max()) + 1, code["?"], np.int64)
    for rank, h in hosts.items():
        if 0 <= int(rank) < len(lut):
            lut[int(rank)] = code[h]
    return lut[r]


def _small_range(v: np.ndarray) -> Optional[Tuple[int, int]]:
    """(least, greatest) of integers whose range is small enough to count
    (and whose values fit int64), else None."""
    if not len(v) or v.dtype.kind not in "iu":
        return None
    lo, hi = int(v.min()), int(v.max())
    if hi - lo > max(4 * len(v), 1 << 16) or hi >= (1 << 62) or lo < -(1 << 62):
        return None
    return lo, hi


def _from_zero(v: np.ndarray, lo: int) -> np.ndarray:
    """The values less their least, as int64 (bincount's index type; a
    narrower type would overflow)."""
    if v.dtype == np.int64:
        return v - lo if lo else v          # values from 0 (ranks, steps): no copy of the rows
    return v.astype(np.int64) - lo


def int_codes(values) -> tuple:
    """(sorted distinct values, the index of each row's value among them):
    ``np.unique(values, return_inverse=True)`` for integers, by counting
    when their range is small (no sort of the rows)."""
    v = np.asarray(values)
    span = _small_range(v)
    if span is None:
        return np.unique(v, return_inverse=True)
    lo, hi = span
    shifted = _from_zero(v, lo)
    present = np.bincount(shifted, minlength=hi - lo + 1) > 0
    rank = (np.cumsum(present) - 1).astype(np.int32 if hi - lo < (1 << 31) else np.int64)  # codes: 4 B per row
    return (np.flatnonzero(present) + lo).astype(v.dtype), rank[shifted]



def distinct(values) -> np.ndarray:
    """``np.unique(values)``: the sorted distinct values, by counting where
    they are integers of a small range (no sort, no index per row)."""
    v = np.asarray(values)
    span = _small_range(v)
    if span is None:
        return np.unique(v)
    lo, hi = span
    return (np.flatnonzero(np.bincount(_from_zero(v, lo), minlength=hi - lo + 1)) + lo).astype(v.dtype)
