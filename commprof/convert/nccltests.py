"""nccl-tests' text format: write commprof bench results as nccl-tests
prints them, and read nccl-tests logs (``all_reduce_perf`` & co.) into the
same form (``commprof import nccl-tests LOG...``).

Columns (nccl-tests 2.x): size (B), count (elements), type, redop, root,
then out-of-place and in-place time (µs), algbw (GB/s), busbw (GB/s),
#wrong. algbw = S / t with GB = 1e9 bytes; busbw = algbw x factor(n):
all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n (S the
full array); broadcast, reduce 1 — the same factors as the report's."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from ..trace.schema import TraceFormatError

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
           "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
_BINARIES = {"all_reduce_perf": "all_reduce", "reduce_scatter_perf": "reduce_scatter",
             "all_gather_perf": "all_gather", "broadcast_perf": "broadcast", "alltoall_perf": "all_to_all",
             "reduce_perf": "reduce"}


def bus_factor(op: str, n: int) -> float:
    return FACTORS.get(op, lambda n: 1.0)(max(1, int(n)))


def bandwidths(op: str, nbytes: int, time_us: float, n: int):
    """(algbw, busbw) in GB/s."""
    if not time_us or time_us <= 0:
        return float("nan"), float("nan")
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * bus_factor(op, n)


def table(doc: Dict[str, Any]) -> str:
    """The results of one benchmark (``commprof bench`` JSON) as nccl-tests
    prints them, one block per collective and dtype."""
    n = int(doc.get("world_size") or 1)
    lines = [f"# commprof bench: backend {doc.get('backend')}, {n} ranks, device {doc.get('device')}, "
             f"warmup iters: {doc.get('warmup')} iters: {doc.get('iters')}; time = mean over iterations, "
             "max over ranks"]
    last = None
    for r in doc.get("rows", []):
        key = (r["op"], r["dtype"])
        if key != last:
            lines += ["#", f"# {r['op']} ({r['dtype']})",
                      f"#{'':>60}out-of-place{'':>23}in-place",
                      "#       size         count      type   redop    root     time   algbw   busbw #wrong"
                      "     time   algbw   busbw #wrong",
                      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)         "
                      "   (us)  (GB/s)  (GB/s)"]
            last = key
        cells = []
        for mode in ("out_of_place", "in_place"):
            m = r.get(mode)
            if not m:
                cells.append(f"{'N/A':>8} {'N/A':>7} {'N/A':>7} {'N/A':>6}")
                continue
            alg, bus = bandwidths(r["op"], r["bytes"], m["time_us"], n)
            wrong = m.get("wrong")
            cells.append(f"{m['time_us']:8.2f} {alg:7.2f} {bus:7.2f} "
                         + (f"{wrong:6d}" if wrong is not None else f"{'N/A':>6}"))
        lines.append(f"{r['bytes']:12d} {r['count']:13d} {r['dtype']:>9} {r['redop']:>7} {r['root']:>7} "
                     + " ".join(cells))
    busbws = [bandwidths(r["op"], r["bytes"], (r.get("out_of_place") or r.get("in_place"))["time_us"], n)[1]
              for r in doc.get("rows", []) if (r.get("out_of_place") or r.get("in_place"))]
    wrong = sum((r.get(m) or {}).get("wrong") or 0 for r in doc.get("rows", []) for m in ("out_of_place", "in_place"))
    lines += [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
              f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f}" if busbws else "# Avg bus bandwidth    : -",
              "#"]
    return "\n".join(lines) + "\n"


_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+")


def parse(text: str, name: str = "log", op: Optional[str] = None) -> Dict[str, Any]:
    """One nccl-tests log -> the ``commprof bench`` JSON form. The
    collective comes from ``op``, the log's "Collective test starting" line
    or the binary's name in the file name; the ranks from its "Rank N" device
    lines. A log cut short (no closing "Avg bus bandwidth" line, or a size row
    with missing columns) is an error naming the line."""
    lines = text.splitlines()
    if op is None:
        for ln in lines:
            m = re.search(r"Collective test starting:\s*(\w+)", ln)
            if m:
                op = _BINARIES.get(m.group(1), m.group(1))
                break
    if op is None:
        base = os.path.basename(name)
        for binary, o in _BINARIES.items():
            if binary in base or base.startswith(o):
                op = o
                break
    if op is None:
        raise TraceFormatError(f"{name}: cannot tell which collective this nccl-tests log measured "
                               "(give --op)")
    ranks = sum(1 for ln in lines if re.match(r"^#\s+Rank\s+\d+", ln)) or None
    rows: List[Dict[str, Any]] = []
    closed = False
    for no, ln in enumerate(lines, 1):
        if ln.startswith("# Avg bus bandwidth"):
            closed = True
            continue
        if ln.startswith("#") or not _ROW.match(ln):
            continue
        f = ln.split()
        has_root = len(f) >= 13
        need = 13 if has_root else 12
        if len(f) < need or len(f) not in (12, 13):
            raise TraceFormatError(f"{name}:{no}: truncated size row ({len(f)} columns, expected 12 or 13)")
        base = 5 if has_root else 4

        def mode(k):
            t, alg, bus, wrong = f[base + 4 * k: base + 4 * k + 4]
            if t == "N/A":
                return None
            return {"time_us": float(t), "wrong": int(wrong) if wrong.isdigit() else 0,
                    "algbw": float(alg), "busbw": float(bus)}
        try:
            rows.append({"op": op, "bytes": int(f[0]), "count": int(f[1]), "dtype": f[2], "redop": f[3],
                         "root": int(f[4]) if has_root else -1, "ranks": ranks,
                         "out_of_place": mode(0), "in_place": mode(1)})
        except ValueError:
            raise TraceFormatError(f"{name}:{no}: unreadable size row: {ln.strip()}") from None
    if not rows:
        raise TraceFormatError(f"{name}: no size rows: not an nccl-tests log")
    if not closed:
        raise TraceFormatError(f"{name}: truncated log (no '# Avg bus bandwidth' line after "
                               f"{rows[-1]['bytes']} B)")
    return {"backend": "nccl-tests", "world_size": ranks, "device": None, "source": os.path.basename(name),
            "rows": rows}


def import_logs(paths: List[str], op: Optional[str] = None) -> List[Dict[str, Any]]:
    out = []
    for p in paths:
        try:
            with open(p, errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise FileNotFoundError(f"{p}: {exc.strerror}") from None
        out.append(parse(text, p, op))
    return out
