"""``commprof model INPUT... --to N1,N2``: the collective cost model of
:mod:`commprof.analyzers.collmodel` fitted to whatever was measured —
nccl-tests logs, ``commprof bench --json`` results, the collectives of
traces (training runs or bench traces) — validated by leaving one measured
N out, and the collectives predicted at other rank counts."""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from .analyzers import collmodel as cm
from .errors import UsageError


def is_measurement(path: str) -> bool:
    """A bench results JSON or an nccl-tests log (not a trace)."""
    p = str(path)
    if os.path.isdir(p) or p.endswith(".parquet"):
        return False
    return os.path.isfile(p)


def load(paths: Sequence[str], op: Optional[str] = None) -> Tuple[cm.Measurements, str, Dict[str, List[float]]]:
    """Measurements of all inputs, their backend, and the message sizes per op."""
    from .convert.nccltests import import_logs
    from .trace.schema import TraceFormatError

    ms = cm.Measurements()
    backends: List[str] = []
    for p in paths:
        p = str(p)
        if not is_measurement(p):
            backends.append(_add_trace(ms, p))
            continue
        if p.endswith(".json"):
            try:
                with open(p) as fh:
                    doc = json.load(fh)
            except (OSError, ValueError) as exc:
                raise UsageError(f"{p}: not a commprof bench results file ({exc})")
            rows = doc.get("rows") or doc.get("measurements")
            if not rows:
                raise UsageError(f"{p}: no measured rows (give commprof bench --json results, or --model output "
                                 "written by this version)")
            n = int(doc.get("world_size") or 0)
            ms.extend(cm.from_rows(rows, n, int(doc.get("ranks_per_node") or n or 1), source=p))
            backends.append(str(doc.get("backend") or "nccl"))
            continue
        try:
            docs = import_logs([p], op=op)
        except TraceFormatError as exc:
            raise UsageError(str(exc))
        for d in docs:
            if not d.get("world_size"):
                raise UsageError(f"{p}: the log names no ranks (no '# Rank N ... on HOST' lines)")
            ms.extend(cm.from_rows(d["rows"], d["world_size"], d.get("ranks_per_node") or d["world_size"],
                                   source=p, forced=d.get("algorithm") or ""))
        backends.append("nccl")
    sizes: Dict[str, List[float]] = {}
    for o, nb in zip(ms.op, ms.nbytes):
        sizes.setdefault(o, [])
        if nb not in sizes[o]:
            sizes[o].append(nb)
    for o in sizes:
        sizes[o].sort()
    return ms, (backends[0] if backends else "nccl"), sizes


def _add_trace(ms: cm.Measurements, path: str) -> str:
    from .api import _one
    from .predict import instances_of

    try:
        t = _one(path)
        a = t.analysis(1, None, None)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(f"{path}: {exc}")
    ms.extend(cm.busy_periods(instances_of(a)))
    return str(t.meta.get("backend") or "gloo")


def targets(text: Optional[str]) -> List[int]:
    from .predict import counts

    return counts(text, "model", "rank counts", 2)


def cost_model_report(paths: Sequence[str], to: Optional[str] = None, gpus_per_node: Optional[int] = None,
                      op: Optional[str] = None, network: Optional[str] = None):
    from .analyzers import replay as rp
    from .analyzers.report import cost_report

    ms, backend, sizes = load(paths, op)
    fixed = None
    if network:
        try:
            fixed, net_ppn = rp.network_terms(network)
        except ValueError as exc:
            raise UsageError(f"model: {exc}")
        gpus_per_node = gpus_per_node or net_ppn
    if not len(ms.usable()):
        raise UsageError("model: no collective with a time on >= 2 ranks in the inputs")
    try:
        model = cm.build(ms, backend, fixed, source="fitted")
    except ValueError as exc:
        raise UsageError(f"model: {exc}")
    model.gpus_per_node = gpus_per_node
    rows = cm.frame(model, ms, targets(to), sizes, gpus_per_node)
    notes = [f"Fitted to {len(ms.usable())} observations from {len(paths)} input(s) at ranks "
             f"{', '.join(str(n) for n in sorted(set(ms.obs_ranks)))} "
             f"({', '.join(str(n) for n in sorted({int(x) for x in ms.nodes}))} node(s)); "
             f"predictions at {model._ppn(0)} ranks per node."]
    f = model.fits[model.best]
    if any(str(f.status.get(t, "")).startswith("assumed") for t in ("inter_bw", "intra_bw")):
        notes.append("Measured inside one node only (or across nodes only): the other scope's bandwidth is "
                     "assumed equal — give --network for what the measurements cannot see.")
    return cost_report(model, rows, notes)
