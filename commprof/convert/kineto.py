"""Import PyTorch-profiler (Kineto) traces into commprof's trace format.

``commprof import kineto DIR_OR_FILES -o trace.parquet`` reads per-rank
Chrome-trace JSON (``.json`` or ``.json.gz``, rank from ``distributedInfo``)
and writes one merged commprof trace, so every analyzer works on it:

- GPU kernels, memcpy and memset become ``kernel`` events (device time in
  t_start/t_end *and* dev_start/dev_end), ``name`` = the kernel class
  (see :func:`classify`), ``detail`` = the kernel name, ``source`` = the
  launching CPU op; NCCL kernels additionally become ``comm`` events with
  the collective type, S in bytes (nccl-tests convention, from
  ``In msg nelems`` / ``Out msg nelems`` and the dtype), dtype, group and
  group size from the kernel's args;
- ``ProfilerStep#N`` annotations become ``step`` events (host windows);
- the ``## forward ##`` / ``## backward ##`` / ``## optimizer ##``
  annotations (DDP, Lightning) become compute regions; ``enumerate(DataLoader)``
  annotations become data regions.

Times are nanoseconds on the trace's own clock (Kineto µs x 1000, offset by
``baseTimeNanoseconds`` when present).
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re
from bisect import bisect_right
from typing import Any, Dict, List, Optional, Tuple

from ..trace.schema import Event, TraceFormatError

NCCL_RE = re.compile(r"^nccl|ncclKernel|ncclDevKernel")
CUDNN_OPS_RE = re.compile(r"cudnn", re.I)
CONV_OPS = {"aten::convolution_backward", "aten::convolution", "aten::_convolution", "aten::conv2d",
            "aten::conv1d", "aten::conv3d", "aten::conv_transpose2d", "aten::_convolution_double_backward"}
GEMM_RE = re.compile(r"gemm|cublas|cutlass|splitKreduce|sgemm|hgemm|xmma", re.I)
DALI_RE = re.compile(r"dali", re.I)

#: nccl-tests names for NCCL's collective names (kernel args / kernel names)
COLLECTIVES = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "reducescatter": "reduce_scatter",
               "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
               "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
               "all_gather_into_tensor": "all_gather", "broadcast": "broadcast", "reduce": "reduce",
               "sendrecv": "all_to_all", "all_to_all": "all_to_all", "alltoall": "all_to_all",
               "all_to_allv": "all_to_all", "send": "send", "recv": "recv", "gather": "gather",
               "scatter": "scatter"}
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
               "c10::bfloat16": 2, "c10::half": 2, "int": 4, "int32": 4, "long": 8, "int64": 8,
               "int8": 1, "uint8": 1, "char": 1, "byte": 1, "bool": 1}


def classify(kernel_name: str, cat: str, op: Optional[str]) -> str:
    """Class of a GPU activity.

    - ``nccl``: kernel name matches ``^nccl|ncclKernel`` (HTA's rule);
    - ``memcpy`` / ``memset``: Kineto's gpu_memcpy / gpu_memset, except
      host-to-device copies, which are ``data`` (the input batch on its way
      to the GPU), as are DALI kernels (name contains "dali");
    - ``cudnn``: launched by a cuDNN op (``aten::cudnn_*``, joined through
      the kernel's External id / correlation), or by a convolution op
      (``aten::convolution_backward`` ...) with a kernel that is not one of
      PyTorch's own (``at::native``) — PyTorch runs those through cuDNN —,
      or with "cudnn" in the kernel name;
    - ``gemm``: cuBLAS / CUTLASS matrix kernels;
    - ``other``: every other kernel (elementwise, reductions, optimizers).
    """
    if cat == "gpu_memcpy":
        return "data" if "HtoD" in kernel_name else "memcpy"
    if cat == "gpu_memset":
        return "memset"
    if NCCL_RE.search(kernel_name):
        return "nccl"
    if DALI_RE.search(kernel_name):
        return "data"
    if op and CUDNN_OPS_RE.search(op):
        return "cudnn"
    if op in CONV_OPS and "at::native" not in kernel_name:
        return "cudnn"
    if "cudnn" in kernel_name.lower():
        return "cudnn"
    if GEMM_RE.search(kernel_name):
        return "gemm"
    return "other"


def collective_of(name: str, args: Dict[str, Any]) -> str:
    c = str(args.get("Collective name") or "").lower()
    if c:
        return COLLECTIVES.get(c, c)
    m = re.search(r"ncclKernel_([A-Za-z]+)|ncclDevKernel_([A-Za-z]+)", name)
    if m:
        word = (m.group(1) or m.group(2)).lower()
        return COLLECTIVES.get(word, word)
    return "nccl"


def nccl_bytes(op: str, args: Dict[str, Any]) -> Tuple[Optional[int], Optional[str]]:
    """S as nccl-tests define it, from the kernel's args."""
    dtype = args.get("dtype")
    size = DTYPE_BYTES.get(str(dtype).lower()) if dtype else None
    n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
    if size is None or n_in is None:
        return None, (str(dtype) if dtype else None)
    n_in, n_out = int(n_in), int(n_out if n_out is not None else n_in)
    if op == "all_gather":
        elems = n_out
    elif op in ("reduce_scatter",):
        elems = n_in
    else:
        elems = max(n_in, n_out)
    return elems * size, str(dtype)


def load(path: str) -> Dict[str, Any]:
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as fh:
            return json.load(fh)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a readable Kineto JSON trace ({exc})") from None


def find_files(inputs: List[str]) -> List[str]:
    files: List[str] = []
    for p in inputs:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "*.json")) + glob.glob(os.path.join(p, "*.json.gz")))
        elif os.path.exists(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    if not files:
        raise TraceFormatError("no .json / .json.gz traces found in " + ", ".join(inputs))
    return files


class _OpIndex:
    """CPU ops per (pid, tid), to find the innermost op enclosing a launch."""

    def __init__(self, ops: List[dict]):
        self.by_thread: Dict[tuple, Tuple[List[float], List[dict]]] = {}
        grouped: Dict[tuple, List[dict]] = {}
        for e in ops:
            grouped.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        for key, evs in grouped.items():
            evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
            self.by_thread[key] = ([e["ts"] for e in evs], evs)

    def innermost(self, pid, tid, ts: float) -> Optional[dict]:
        hit = self.by_thread.get((pid, tid))
        if not hit:
            return None
        starts, evs = hit
        i = bisect_right(starts, ts) - 1
        best = None
        # walk back over ops starting before ts; the latest-starting one that
        # still contains ts is the innermost (bounded walk)
        for j in range(i, max(-1, i - 64), -1):
            e = evs[j]
            if e["ts"] <= ts <= e["ts"] + e.get("dur", 0):
                best = e
                break
        return best


def convert(doc: Dict[str, Any], path: str, rank: Optional[int] = None, kernels_only: bool = False,
            clock_offset_ns: int = 0, step_of_time=None):
    """One Kineto trace -> (rows in journal order, rank metadata).

    ``kernels_only`` (commprof's kernel mode): only GPU activity rows, their
    times shifted by ``clock_offset_ns`` onto commprof's clock and their step
    given by ``step_of_time(launch time)``."""
    info = doc.get("distributedInfo") or {}
    if rank is None:
        if "rank" in info:
            rank = int(info["rank"])
        elif kernels_only:
            rank = 0
        else:
            raise TraceFormatError(f"{path}: no distributedInfo.rank; give --rank for single-GPU traces")
    world = int(info.get("world_size") or 1)
    rank = int(rank)
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: no traceEvents list")
    ctx = _Context(events, int(doc.get("baseTimeNanoseconds") or 0) + clock_offset_ns, step_of_time)
    rows, comm_rows, n_kernels = _rows(events, ctx, world, kernels_only)
    rows += _numbered(comm_rows)
    if n_kernels == 0 and not rows and not kernels_only:
        raise TraceFormatError(f"{path}: no events to import")
    meta = {"rank": rank, "world_size": world, "rank_source": "distributedInfo" if "rank" in info else "--rank",
            "host": None, "source_file": os.path.basename(path), "backend": info.get("backend"),
            "nccl_version": info.get("nccl_version"), "status": "complete", "kernels": n_kernels,
            "steps": len(ctx.steps), "device": (doc.get("deviceProperties") or [{}])[0].get("name")
            if doc.get("deviceProperties") else None}
    return rows, meta


class _Context:
    """What a kernel row needs from the rest of the trace: times in ns on
    ``base``, CPU ops by External id and around a time, launches by
    correlation id, the step of a time."""

    def __init__(self, events: List[Dict[str, Any]], base: int, step_of_time=None):
        self.base = base
        ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "ts" in e]
        self.op_by_ext: Dict[Any, str] = {}
        for e in ops:
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                self.op_by_ext.setdefault(ext, e["name"])
        self.launches: Dict[Any, Dict[str, Any]] = {}
        for e in events:
            # cudaLaunchKernel & co. (cuda_runtime) and cuLaunchKernelEx & co.
            # (cuda_driver: Triton, CUTLASS 3, NCCL's newer launch paths)
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X":
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    self.launches[corr] = e
        self.index = _OpIndex(ops)
        self.steps = sorted((e for e in events if e.get("ph") == "X"
                             and str(e.get("name", "")).startswith("ProfilerStep#")
                             and e.get("cat") in ("user_annotation", "cpu_op")), key=lambda e: e["ts"])
        self.step_starts = [self.ns(e["ts"]) for e in self.steps]
        self.step_ids = [int(e["name"].split("#", 1)[1]) for e in self.steps]
        self.step_of_time = step_of_time

    def ns(self, ts) -> int:
        return int(round(float(ts) * 1000.0)) + self.base

    def step_of(self, t: int) -> int:
        if self.step_of_time is not None:
            return self.step_of_time(t)
        i = bisect_right(self.step_starts, t) - 1
        return self.step_ids[i] if i >= 0 else (self.step_ids[0] - 1 if self.step_ids else 0)

    def launching_op(self, args: Dict[str, Any]):
        """(the kernel's CPU op, its launch event): by External id, else the
        innermost CPU op around the launch."""
        op = self.op_by_ext.get(args.get("External id"))
        launch = self.launches.get(args.get("correlation"))
        if op is None and launch is not None:
            enclosing = self.index.innermost(launch.get("pid"), launch.get("tid"), launch["ts"])
            op = enclosing["name"] if enclosing else None
        return op, launch


def _rows(events, ctx: _Context, world: int, kernels_only: bool):
    """(kernel, step, region and data rows in trace order; the NCCL kernels'
    collective rows, unnumbered; how many kernels)."""
    rows: List[tuple] = []
    comm_rows: List[tuple] = []
    n_kernels = 0
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or "ts" not in e:
            continue
        t0 = ctx.ns(e["ts"])
        t1 = t0 + int(round(float(e.get("dur", 0)) * 1000.0))
        args = e.get("args") or {}
        name = str(e.get("name", ""))
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            n_kernels += 1
            op, launch = ctx.launching_op(args)
            cls = classify(name, cat, op)
            step = ctx.step_of(ctx.ns(launch["ts"]) if launch is not None else t0)
            rows.append(Event(step, "kernel", cls, op, name, t0, t1, t0, t1, bytes=args.get("bytes")))
            # In kernel mode the host rows already are the collectives (with
            # their group's sequence numbers): NCCL kernels stay kernels, or
            # every collective would count twice under colliding (group, seq).
            if cls == "nccl" and not kernels_only:
                coll = collective_of(name, args)
                nbytes, dtype = nccl_bytes(coll, args)
                gsize = args.get("Group size")
                comm_rows.append(Event(step, "comm", coll, "kineto", name, t0, t1, t0, t1, bytes=nbytes,
                                       dtype=dtype, group=str(args.get("Process Group Name") or "0"),
                                       group_size=int(gsize) if gsize is not None else world,
                                       blocking=False))
        elif cat in ("user_annotation", "cpu_op") and not kernels_only:
            if name.startswith("ProfilerStep#"):
                rows.append(Event(int(name.split("#", 1)[1]), "step", "step", "kineto", None, t0, t1))
            elif cat == "user_annotation" and name in ("## forward ##", "## backward ##", "## optimizer ##"):
                rows.append(Event(ctx.step_of(t0), "compute", name.strip("# ").strip(), "kineto", name, t0, t1))
            elif cat == "user_annotation" and name.startswith("enumerate(DataLoader)"):
                rows.append(Event(ctx.step_of(t0), "data", "dataloader", "kineto", name, t0, t1))
    return rows, comm_rows, n_kernels


def _numbered(comm_rows: List[tuple]) -> List[tuple]:
    """NCCL kernels of one group run in the same order on every rank (one
    stream per communicator): numbered by start time."""
    seq: Dict[str, int] = {}
    out = []
    for r in sorted(comm_rows, key=lambda r: (r.t_start, r.t_end)):
        n = seq.get(r.group, 0)
        seq[r.group] = n + 1
        out.append(r._replace(seq=n))
    return out
