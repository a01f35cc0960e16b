"""Collective operations: their names and their bus factors, defined once.

The trace stores a collective's op as its torch.distributed name
(``all_reduce``, ``reduce_scatter``, ...). Everything that converts bytes
and time into bandwidth — the report's busbw columns, the nccl-tests
import and table, ``commprof bench``, the cost model of
:mod:`commprof.analyzers.collmodel` — takes the factors from here.

Bus bandwidth as nccl-tests defines it (doc/PERFORMANCE.md): algbw = S / t,
busbw = algbw x factor(n) with S the *full* array (for reduce_scatter the
input, for all_gather the output):

============== ============
all_reduce     2 (n - 1) / n
reduce_scatter (n - 1) / n
all_gather     (n - 1) / n
all_to_all     (n - 1) / n
gather/scatter (n - 1) / n
broadcast      1
reduce         1
============== ============

Any other op (barrier, send, recv, ...) has no bus bandwidth: NaN."""
from __future__ import annotations

from typing import Dict

#: canonical name -> bus factor kind: "ar" 2(n-1)/n, "ring" (n-1)/n, "one" 1
_KIND = {"all_reduce": "ar", "reduce_scatter": "ring", "all_gather": "ring", "all_to_all": "ring",
         "gather": "ring", "scatter": "ring", "broadcast": "one", "reduce": "one"}

#: the collectives with a bus factor, in the order tables list them
OPS = tuple(_KIND)

#: other spellings -> canonical name (nccl-tests binaries, NCCL / Horovod / DeepSpeed names)
ALIASES: Dict[str, str] = {
    "allreduce": "all_reduce", "all_reduce_perf": "all_reduce", "ncclallreduce": "all_reduce",
    "reducescatter": "reduce_scatter", "reduce_scatter_perf": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "allgather": "all_gather", "all_gather_perf": "all_gather", "all_gather_into_tensor": "all_gather",
    "_allgather_base": "all_gather",
    "alltoall": "all_to_all", "alltoall_perf": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast_perf": "broadcast", "bcast": "broadcast",
    "reduce_perf": "reduce", "gather_perf": "gather", "scatter_perf": "scatter",
}


def canonical(op: str) -> str:
    """The trace's name of a collective (unknown names come back unchanged)."""
    key = str(op).strip()
    if key in _KIND:
        return key
    return ALIASES.get(key.lower(), key)


def bus_factor(op: str, n):
    """nccl-tests' bus factor of ``op`` at ``n`` ranks: a float for a scalar
    ``n``, an array for an array; NaN for an op without bus bandwidth or
    n < 1."""
    kind = _KIND.get(canonical(op))
    if not hasattr(n, "__len__") and getattr(n, "ndim", 0) == 0:
        return _scalar(kind, float(n))
    import numpy as np

    arr = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "ar":
            out = 2.0 * (arr - 1) / arr
        elif kind == "ring":
            out = (arr - 1) / arr
        elif kind == "one":
            out = np.ones_like(arr)
        else:
            return np.full_like(arr, np.nan)
    return np.where(arr >= 1, out, np.nan)


def _scalar(kind, n: float) -> float:
    if kind is None or not n >= 1:
        return float("nan")
    if kind == "ar":
        return 2.0 * (n - 1) / n
    if kind == "ring":
        return (n - 1) / n
    return 1.0


def bandwidths(op: str, nbytes: float, time_s: float, n: int) -> "tuple[float, float]":
    """(algbw, busbw) in bytes per second (NaN where undefined)."""
    if not time_s or time_s <= 0:
        return float("nan"), float("nan")
    alg = float(nbytes) / float(time_s)
    return alg, alg * _scalar(_KIND.get(canonical(op)), float(n))

