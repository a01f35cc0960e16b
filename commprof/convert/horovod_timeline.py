"""Horovod timeline (HOROVOD_TIMELINE) -> commprof ``phase`` events.

``commprof record --horovod-timeline`` sets HOROVOD_TIMELINE for the job;
rank 0 (Horovod's coordinator) writes a Chrome-trace JSON with one
"process" per tensor (``allreduce.<name>``) and nested ``B``/``E`` phases:
NEGOTIATE_<OP> (with one ``X`` tick per rank as it reports the tensor
ready), <OP>, WAIT_FOR_DATA, QUEUE, MEMCPY_IN_FUSION_BUFFER,
NCCL_/MPI_/GLOO_<OP>, MEMCPY_OUT_FUSION_BUFFER, ... At merge time the file
becomes rank-0 events with category ``phase``: ``name`` = the phase,
``detail`` = the tensor, ``items`` = nesting depth; each rank's ready tick
is a ``phase`` event named ``ready`` whose ``value`` is that rank. Times
are moved onto rank 0's clock with the timeline's
``start_time_since_epoch_in_micros`` and rank 0's wall-clock offset.
A file cut short (job killed) is read up to its last complete event.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from ..trace.schema import Event


def parse(path: str) -> List[Dict[str, Any]]:
    """The events of a (possibly unterminated) Horovod timeline file."""
    with open(path) as fh:
        text = fh.read().strip()
    if not text:
        return []
    body = text.rstrip().rstrip(",")
    if not body.endswith("]"):
        body += "]"
    try:
        return json.loads(body)
    except ValueError:
        pass
    events = []
    for chunk in text.lstrip("[").replace("},{", "}\n{").splitlines():
        chunk = chunk.strip().rstrip(",").rstrip("]")
        if not chunk:
            continue
        try:
            events.append(json.loads(chunk))
        except ValueError:
            break  # torn tail
    return events


def convert(events: List[Dict[str, Any]], wall_minus_mono_ns: int) -> Tuple[List[tuple], Dict[str, Any]]:
    """Timeline events -> (Event rows for rank 0, step -1: the caller sets it; summary)."""
    start_us = 0
    tensors: Dict[int, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args") or {}
            if "start_time_since_epoch_in_micros" in args:
                start_us = int(args["start_time_since_epoch_in_micros"])
            elif "name" in args:
                tensors[e.get("pid")] = str(args["name"])

    def ns(ts) -> int:
        return (start_us + int(ts)) * 1000 - wall_minus_mono_ns

    rows: List[tuple] = []
    stacks: Dict[Any, List[tuple]] = {}
    for e in events:
        ph, pid = e.get("ph"), e.get("pid")
        if ph == "B":
            stacks.setdefault(pid, []).append((str(e.get("name")), int(e.get("ts", 0))))
        elif ph == "E":
            stack = stacks.get(pid)
            if stack:
                name, t0 = stack.pop()
                rows.append(Event(-1, "phase", name, "horovod_timeline", tensors.get(pid), ns(t0),
                                  ns(e.get("ts", t0)), items=len(stack)))
        elif ph == "X" and str(e.get("name", "")).isdigit():
            t = ns(e.get("ts", 0))
            rows.append(Event(-1, "phase", "ready", "horovod_timeline", tensors.get(pid), t, t,
                              value=float(e["name"])))
    return rows, {"tensors": len(tensors), "phases": len(rows)}
