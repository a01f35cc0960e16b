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

import json
import os
from typing import Dict, List, Optional, Sequence

import pandas as pd

from ..trace.files import atomic_open
from ..trace.schema import TraceFormatError
from ..trace.values import plain as _val

CPU_PID = 1000
TID = {"step": 1, "data": 2, "compute": 3, "wait": 4, "metric": 5}
GPU_COMPUTE_TID, GPU_COMM_TID, GPU_KERNEL_TID = 7, 20, 30


def _us(ns: int, base: int) -> float:
    return (int(ns) - base) / 1000.0


def rank_events(ev: pd.DataFrame, rank: int, base: int, host: Optional[str]) -> List[dict]:
    out: List[dict] = []
    cpu, gpu = CPU_PID + rank, rank
    out.append({"ph": "M", "name": "process_name", "pid": cpu, "tid": 0,
                "args": {"name": f"rank {rank}" + (f" ({host})" if host else "") + " host"}})
    out.append({"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": f"rank {rank} device"}})
    for name, tid in (("steps", 1), ("data", 2), ("compute", 3), ("comm wait", 4)):
        out.append({"ph": "M", "name": "thread_name", "pid": cpu, "tid": tid, "args": {"name": name}})
    for name, tid in (("compute stream", GPU_COMPUTE_TID), ("communication stream", GPU_COMM_TID),
                      ("kernels", GPU_KERNEL_TID)):
        out.append({"ph": "M", "name": "thread_name", "pid": gpu, "tid": tid, "args": {"name": name}})
    last_end = None
    for r in ev.itertuples(index=False):
        cat, name = str(r.category), str(r.name)
        ts, dur = _us(r.t_start, base), max(0.0, (int(r.t_end) - int(r.t_start)) / 1000.0)
        if cat == "step":
            out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{int(r.step)}",
                        "pid": cpu, "tid": 1, "ts": ts, "dur": dur, "args": {"items": _val(r.items)}})
            last_end = max(last_end or 0, int(r.t_end))
        elif cat in ("data", "wait"):
            out.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": cpu, "tid": TID[cat],
                        "ts": ts, "dur": dur, "args": {"step": int(r.step)}})
        elif cat == "compute":
            out.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": cpu, "tid": 3,
                        "ts": ts, "dur": dur, "args": {"step": int(r.step), "detail": _val(r.detail)}})
            out.append({"ph": "X", "cat": "kernel", "name": f"commprof::{name}", "pid": gpu,
                        "tid": GPU_COMPUTE_TID, "ts": ts, "dur": dur,
                        "args": {"device": 0, "stream": GPU_COMPUTE_TID, "step": int(r.step)}})
        elif cat == "comm":
            op = "".join(w.capitalize() for w in name.split("_"))
            out.append({"ph": "X", "cat": "kernel", "name": f"ncclKernel_{op}_commprof", "pid": gpu,
                        "tid": GPU_COMM_TID, "ts": ts, "dur": dur,
                        "args": {"device": 0, "stream": GPU_COMM_TID, "Collective name": name,
                                 "bytes": _val(r.bytes), "dtype": _val(r.dtype), "Group size": _val(r.group_size),
                                 "Process Group Name": _val(r.group), "seq": _val(r.seq),
                                 "blocking": _val(r.blocking), "source": _val(r.source), "step": int(r.step)}})
        elif cat == "kernel":
            out.append({"ph": "X", "cat": "kernel", "name": str(r.detail), "pid": gpu, "tid": GPU_KERNEL_TID,
                        "ts": ts, "dur": dur, "args": {"device": 0, "stream": GPU_KERNEL_TID, "class": name}})
    if last_end is not None:
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{int(ev['step'].max()) + 1}",
                    "pid": CPU_PID + rank, "tid": 1, "ts": _us(last_end, base) + 1.0, "dur": 0.0,
                    "args": {"end_marker": True}})
    return out


def flows(ev: pd.DataFrame, base: int) -> List[dict]:
    """Flow arrows linking the same collective (group, seq) across ranks."""
    c = ev[(ev["category"].astype(str) == "comm") & ev["seq"].notna() & ev["group"].notna()]
    out = []
    for i, ((group, seq), g) in enumerate(c.groupby([c["group"].astype(str), "seq"], sort=False)):
        if g["rank"].nunique() < 2:
            continue
        g = g.sort_values("t_start")
        first = g.iloc[0]
        out.append({"ph": "s", "id": i + 1, "name": f"{first['name']} seq {int(seq)}", "cat": "collective",
                    "pid": int(first["rank"]), "tid": GPU_COMM_TID, "ts": _us(first["t_start"], base)})
        for _, r in g.iloc[1:].iterrows():
            out.append({"ph": "f", "bp": "e", "id": i + 1, "name": f"{first['name']} seq {int(seq)}",
                        "cat": "collective", "pid": int(r["rank"]), "tid": GPU_COMM_TID,
                        "ts": _us(r["t_start"], base)})
    return out


def _dump(doc: dict, path: str) -> None:
    with atomic_open(path) as fh:
        json.dump(doc, fh)  # default separators: HTA finds the rank with r'"rank":\s+(\d+)'


def export_chrome(trace, out: str, steps=None, ranks: Optional[Sequence[int]] = None,
                  per_rank: bool = False, on_rank=None) -> List[str]:
    """Write the timeline; returns the paths written. ``on_rank(done,
    total)`` is called after each rank (progress display)."""
    def tick(i, n):
        if on_rank is not None:
            on_rank(i, n)

    view = trace.filter(ranks=ranks, steps=steps)
    ev = view.events(["rank", "step", "category", "name", "source", "detail", "t_start", "t_end", "bytes",
                      "dtype", "group", "group_size", "seq", "blocking", "items"])
    ev = ev[ev["category"].astype(str) != "metric"]
    if ev.empty:
        raise TraceFormatError(f"{trace.path}: no events in the chosen steps / ranks")
    base = int(ev["t_start"].min())
    hosts: Dict[int, str] = {int(m.get("rank", -1)): m.get("host") for m in trace.ranks}
    world = int(trace.meta.get("world_size") or ev["rank"].nunique())
    header = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
              "traceName": os.path.basename(out), "commprof": {"run_id": trace.meta.get("run_id"),
                                                              "source": trace.path}}
    written = []
    if per_rank:
        stem = out
        for ext in (".json.gz", ".json"):
            if stem.endswith(ext):
                stem = stem[: -len(ext)]
                break
        suffix = ".json.gz" if out.endswith(".gz") else ".json"
        n = int(ev["rank"].nunique())
        for i, (rank, g) in enumerate(ev.groupby("rank")):
            doc = dict(header, distributedInfo={"rank": int(rank), "world_size": world,
                                                "backend": trace.meta.get("backend")},
                       traceEvents=rank_events(g, int(rank), base, hosts.get(int(rank))))
            path = f"{stem}.rank{int(rank)}{suffix}"
            _dump(doc, path)
            written.append(path)
            tick(i + 1, n)
        return written
    events: List[dict] = []
    n = int(ev["rank"].nunique())
    for i, (rank, g) in enumerate(ev.groupby("rank")):
        events += rank_events(g, int(rank), base, hosts.get(int(rank)))
        tick(i + 1, n)
    events += flows(ev, base)
    doc = dict(header, distributedInfo={"rank": int(ev["rank"].min()), "world_size": world,
                                        "backend": trace.meta.get("backend"), "merged_ranks":
                                        sorted(int(r) for r in ev["rank"].unique())}, traceEvents=events)
    _dump(doc, out)
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
