"""Run and rank metadata.

Every rank writes a metadata dict (rank, world size, host, pid, clock
anchors, models, run info such as framework and loader). A trace file keeps
the list of its ranks' dicts and one run-level dict derived from them in
its Parquet footer, under the keys below, as JSON."""
from __future__ import annotations

import json
import statistics
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .schema import SCHEMA_VERSION, TraceFormatError

META_VERSION = b"commprof.schema_version"
META_RUN = b"commprof.run"
META_RANKS = b"commprof.ranks"

#: Run-info keys whose most common value over the ranks becomes the run's.
RUN_KEYS = ("torch", "cuda", "backend", "framework", "loader", "loader_workers", "model",
            "batch_size", "image_size", "dataset_size", "kernel_window", "zero_stage", "horovod",
            "deepspeed", "dali")


def encode_meta(run: Dict[str, Any], ranks: Iterable[Dict[str, Any]]) -> Dict[bytes, bytes]:
    return {
        META_VERSION: str(SCHEMA_VERSION).encode(),
        META_RUN: json.dumps(run, sort_keys=True, default=str).encode(),
        META_RANKS: json.dumps(list(ranks), sort_keys=True, default=str).encode(),
    }


def decode_meta(meta: Optional[Dict[bytes, bytes]]) -> Tuple[int, Dict[str, Any], List[Dict[str, Any]]]:
    """Return (schema_version, run metadata, per-rank metadata)."""
    if not meta or META_VERSION not in meta:
        raise TraceFormatError("no commprof metadata (not a commprof trace)")
    try:
        version = int(meta[META_VERSION].decode())
    except ValueError as exc:
        raise TraceFormatError("unreadable schema version") from exc
    try:
        run = json.loads(meta.get(META_RUN, b"{}").decode())
        ranks = json.loads(meta.get(META_RANKS, b"[]").decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError("unreadable commprof metadata") from exc
    return version, run, ranks


def batch_size(items: Iterable[Any]) -> Optional[int]:
    """The per-rank batch size implied by per-step sample counts: the median
    of the known, positive counts (None when there is none)."""
    vals = [float(v) for v in items if v is not None and v == v and v > 0]
    return int(statistics.median(vals)) if vals else None


def run_metadata(ranks: List[Dict[str, Any]], base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run-level metadata derived from the ranks' metadata."""
    run: Dict[str, Any] = dict(base or {})
    if not ranks:
        return run
    run.setdefault("run_id", ranks[0].get("run_id"))
    run.setdefault("launcher", ranks[0].get("launcher"))
    run["world_size"] = max(int(r.get("world_size") or 1) for r in ranks)
    run["ranks_recorded"] = len(ranks)
    run["hosts"] = sorted({r.get("host") for r in ranks if r.get("host")})
    run["salvaged_ranks"] = sorted(r.get("rank") for r in ranks if r.get("status") == "salvaged")
    ended = [dict(r["end"], rank=r.get("rank"), host=r.get("host"), pid=r.get("pid"), steps=r.get("steps"))
             for r in ranks if r.get("end")]
    if ended:  # how every rank ended (trace/ends.py), by rank
        exit_code = (run.get("job_exit") or {}).get("code")
        failed = any(e.get("how") != "exit" for e in ended) or exit_code not in (None, 0)
        for e in ended:
            if not failed:  # the rings' last collectives matter only where a job failed
                e.pop("last", None)
        run["ends"] = sorted(ended, key=lambda e: (e["rank"] is None, e["rank"] or 0))
    for key in RUN_KEYS:
        values = [r.get(key) for r in ranks if r.get(key) is not None]
        if values:
            counts = Counter(json.dumps(v, sort_keys=True) for v in values)
            run.setdefault(key, json.loads(counts.most_common(1)[0][0]))
    models: Dict[str, int] = {}
    for r in ranks:
        for name, n in (r.get("models") or {}).items():
            models[name] = max(models.get(name, 0), int(n))
    if models:
        top = max(models.items(), key=lambda kv: kv[1])[0]
        # "DistributedDataParallel(ResNet)" -> "ResNet"
        run.setdefault("model", top[top.index("(") + 1:-1] if top.endswith(")") and "(" in top else top)
        run.setdefault("model_params", max(models.values()))
    labels: Dict[str, str] = {}
    for r in ranks:
        labels.update(r.get("labels") or {})
    if labels:
        run["labels"] = {**labels, **(run.get("labels") or {})}
    run["schema_version"] = SCHEMA_VERSION
    return run
