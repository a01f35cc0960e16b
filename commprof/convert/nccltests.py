"""nccl-tests' text format: write commprof bench results as nccl-tests
prints them, and read nccl-tests logs (``all_reduce_perf`` & co.) into the
same form (``commprof import nccl-tests LOG...``).

Columns (nccl-tests 2.x): size (B), count (elements), type, redop, root,
then out-of-place and in-place time (µs), algbw (GB/s), busbw (GB/s),
#wrong (``N/A`` when run with ``-c 0``: not checked; before nccl-tests 2.10
the largest error instead of a count). algbw = S / t with GB = 1e9 bytes;
busbw = algbw x factor(n), the factors of :mod:`commprof.trace.ops`
(all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n with S
the full array; broadcast, reduce 1), the same as the report's.

Logs are read as launchers leave them: Open MPI's ``--tag-output`` tags
(``[1,0]<stdout>:``, also mid-line where ranks' output interleaves), srun
``--label`` and pdsh prefixes; several tests in one file; ``-g`` / ``-t``
(several GPUs per process: one "Rank" line per GPU); the nodes from the
"Rank N ... on HOST device D" lines (ranks per node = the most on one
host)."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from ..trace.ops import bus_factor, canonical
from ..trace.schema import TraceFormatError

_BINARIES = {"all_reduce_perf": "all_reduce", "reduce_scatter_perf": "reduce_scatter",
             "all_gather_perf": "all_gather", "broadcast_perf": "broadcast", "alltoall_perf": "all_to_all",
             "reduce_perf": "reduce", "gather_perf": "gather", "scatter_perf": "scatter",
             "sendrecv_perf": "sendrecv", "hypercube_perf": "hypercube"}


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
        key = (r["op"], r["dtype"], r.get("ranks") or n)
        if key != last:
            lines += ["#", f"# {r['op']} ({r['dtype']}, {r.get('ranks') or n} ranks)",
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
            alg, bus = bandwidths(r["op"], r["bytes"], m["time_us"], r.get("ranks") or n)
            wrong = m.get("wrong")
            cells.append(f"{m['time_us']:8.2f} {alg:7.2f} {bus:7.2f} "
                         + (f"{wrong:6d}" if wrong is not None else f"{'N/A':>6}"))
        lines.append(f"{r['bytes']:12d} {r['count']:13d} {r['dtype']:>9} {r['redop']:>7} {r['root']:>7} "
                     + " ".join(cells))
    busbws = [bandwidths(r["op"], r["bytes"], (r.get("out_of_place") or r.get("in_place"))["time_us"],
                         r.get("ranks") or n)[1]
              for r in doc.get("rows", []) if (r.get("out_of_place") or r.get("in_place"))]
    checks = [(r.get(m) or {}).get("wrong") for r in doc.get("rows", []) for m in ("out_of_place", "in_place")
              if r.get(m)]
    wrong = sum(w for w in checks if w is not None)
    verdict = ("N/A (not checked)" if checks and all(w is None for w in checks)
               else f"{wrong} {'OK' if wrong == 0 else 'FAILED'}")
    lines += [f"# Out of bounds values : {verdict}",
              f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f}" if busbws else "# Avg bus bandwidth    : -",
              "#"]
    return "\n".join(lines) + "\n"


#: an MPI launcher's output tag: Open MPI --tag-output ``[1,0]<stdout>:``, srun --label ``0: ``,
#: pdsh ``host: ``, Intel MPI / MPICH -prepend-rank ``[0] ``
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_LINE_TAGS = (re.compile(r"^\s*\d+:\s(?=\s*[#\d])"), re.compile(r"^\[\d+\]\s(?=\s*[#\d])"),
              re.compile(r"^[A-Za-z0-9_.-]+:\s(?=\s*#|\s+\d+\s+\d+\s)"))
_ROW = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z]\w*\s")
_DEVICE = re.compile(r"^#\s+Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+(\d+)")


def untag(text: str) -> List[str]:
    """The lines of ``text`` with launcher tags removed. Open MPI tags every
    chunk it forwards, so a line one rank printed in two writes comes back
    as two tagged pieces, with other ranks' output between them: pieces are
    joined per stream (the tag) and a stream's line ends where its piece
    ends a physical line."""
    if "<stdout>:" not in text and "<stderr>:" not in text:
        out = []
        for ln in text.splitlines():
            for tag in _LINE_TAGS:
                ln = tag.sub("", ln, count=1)
            out.append(ln)
        return out
    buffers: Dict[str, str] = {}
    out: List[str] = []
    last = ""
    for phys in text.splitlines():
        parts = _TAG.split(phys)
        tags = _TAG.findall(phys)
        # text before the first tag continues the stream of the last piece
        pieces = [(last, parts[0])] if parts[0] else []
        pieces += list(zip(tags, parts[1:]))
        for k, (tag, piece) in enumerate(pieces):
            buffers[tag] = buffers.get(tag, "") + piece
            if k == len(pieces) - 1:          # the physical line ends this stream's line
                out.append(buffers.pop(tag))
            last = tag
    out.extend(b for b in buffers.values() if b)
    return out


def _mode(fields: List[str], name: str, no: int):
    t, alg, bus, wrong = fields
    if t == "N/A":
        return None
    m: Dict[str, Any] = {"time_us": float(t), "algbw": float(alg), "busbw": float(bus)}
    if wrong == "N/A":                 # validation off (-c 0): unchecked, not correct
        m["wrong"] = None
    elif wrong.isdigit():
        m["wrong"] = int(wrong)
    else:                              # nccl-tests before 2.10 printed the largest error, not a count
        m["wrong"] = None
        m["error"] = float(wrong)
    return m


def _forced_algorithm(lines: List[str]) -> Optional[str]:
    """``ring`` / ``tree`` where the run set NCCL_ALGO to exactly one of them."""
    for ln in lines:
        m = re.search(r"NCCL_ALGO\s*(?:=|set by environment to)\s*([A-Za-z,^]+)", ln)
        if m:
            v = m.group(1).strip().lower()
            return v if v in ("ring", "tree") else None
    return None


def _forced_protocol(lines: List[str]) -> Optional[str]:
    """``LL`` / ``LL128`` / ``Simple`` where the run set NCCL_PROTO to exactly one of them."""
    for ln in lines:
        m = re.search(r"NCCL_PROTO\s*(?:=|set by environment to)\s*([A-Za-z0-9,^]+)", ln)
        if m:
            v = m.group(1).strip().lower()
            return {"ll": "LL", "ll128": "LL128", "simple": "Simple"}.get(v)
    return None


def _section_op(lines: List[str], name: str, op: Optional[str]) -> Optional[str]:
    if op is not None:
        return canonical(op)
    for ln in lines:
        m = re.search(r"Collective test starting:\s*(\w+)", ln)
        if m:
            return _BINARIES.get(m.group(1), canonical(m.group(1)))
        for binary, o in _BINARIES.items():
            if re.search(rf"(^|[/\s]){binary}(\s|$)", ln):
                return o
    return None


def _file_op(base: str) -> Optional[str]:
    """The collective a file's name says (``all_reduce_perf.log``, ``allreduce_16gpu.txt``)."""
    for binary, o in _BINARIES.items():
        if binary in base:
            return o
    for tok in re.split(r"[^A-Za-z]+", base.lower()):
        o = canonical(tok)
        if o in _BINARIES.values() and o != tok or tok in ("all_reduce", "broadcast", "reduce"):
            return o
    for o in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        if o in base.lower():
            return o
    return None


def parse_all(text: str, name: str = "log", op: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every test in one nccl-tests log (several binaries' output may be
    concatenated): one ``commprof bench`` JSON document each. The collective
    comes from ``op``, the test's "Collective test starting" line, the
    binary's name on a command line before it, or the file name; the ranks
    and their nodes from its "Rank N ... on HOST device D" lines. A cut or
    garbled size row is an error naming the line."""
    lines = untag(text)
    starts = [i for i, ln in enumerate(lines) if re.match(r"^#\s*nThread\s", ln)] or [0]
    docs = []
    base = os.path.basename(name)
    file_op = _file_op(base)
    prev_end = 0
    for k, start in enumerate(starts):
        stop = starts[k + 1] if k + 1 < len(starts) else len(lines)
        # a test ends at its "Avg bus bandwidth" line; what follows up to the next test is that one's preamble
        end = next((i + 1 for i in range(start, stop) if lines[i].startswith("# Avg bus bandwidth")), stop)
        before = lines[prev_end:start]
        sec = lines[start:end]
        prev_end = end
        sop = _section_op(before + sec[:5], name, op) or _section_op(sec, name, None)
        doc = _parse_section(sec, start, name, sop, file_op if len(starts) == 1 else None)
        if doc is not None:
            algo = _forced_algorithm(before + sec)
            if algo:
                doc["algorithm"] = algo
                for r in doc["rows"]:
                    r["algorithm"] = algo
            proto = _forced_protocol(before + sec)
            if proto:
                doc["protocol"] = proto
                for r in doc["rows"]:
                    r["protocol"] = proto
            docs.append(doc)
    if not docs:
        raise TraceFormatError(f"{name}: no size rows: not an nccl-tests log")
    return docs


def _parse_section(lines: List[str], offset: int, name: str, op: Optional[str], file_op: Optional[str]):
    hosts: Dict[int, str] = {}
    header = next((ln for ln in lines if re.match(r"^#\s*nThread\s", ln)), "")
    rows: List[Dict[str, Any]] = []
    closed = False
    for no, ln in enumerate(lines, offset + 1):
        m = _DEVICE.match(ln)
        if m:
            hosts[int(m.group(1))] = m.group(2)
            continue
        if ln.startswith("# Avg bus bandwidth"):
            closed = True
            continue
        if ln.startswith("#") or not _ROW.match(ln):
            continue
        f = ln.split()
        # nccl-tests before 2.10 printed no redop column for the tests without one (all_gather, broadcast)
        no_redop = len(f) == 11 and _number(f[3])
        if len(f) not in (12, 13) and not no_redop:
            what = "truncated size row" if len(f) < 12 else "size row with extra columns"
            raise TraceFormatError(f"{name}:{no}: {what} ({len(f)} columns, expected 12, or 13 with root): "
                                   f"{ln.strip()[:80]}")
        has_root = len(f) == 13
        col = 3 if no_redop else 5 if has_root else 4
        try:
            rows.append({"bytes": int(f[0]), "count": int(f[1]), "dtype": f[2], "redop": "none" if no_redop else f[3],
                         "root": int(f[4]) if has_root else -1,
                         "out_of_place": _mode(f[col:col + 4], name, no),
                         "in_place": _mode(f[col + 4:col + 8], name, no)})
        except ValueError:
            raise TraceFormatError(f"{name}:{no}: unreadable size row: {ln.strip()[:80]}") from None
    if not rows:
        return None
    op = op or file_op
    if op is None:
        raise TraceFormatError(f"{name}:{offset + 1}: cannot tell which collective this nccl-tests log measured "
                               "(give --op)")
    if not closed:
        raise TraceFormatError(f"{name}: truncated log (no '# Avg bus bandwidth' line after "
                               f"{rows[-1]['bytes']} B)")
    complete = bool(hosts) and len(hosts) == max(hosts) + 1
    ranks = (max(hosts) + 1) if hosts else _ranks_from_bandwidths(op, rows)
    per_host: Dict[str, int] = {}
    for h in hosts.values():
        per_host[h] = per_host.get(h, 0) + 1
    # a log whose device lines were cut: the ranks from the highest rank, the nodes unknown
    ppn = max(per_host.values()) if per_host and complete else None
    g = re.search(r"nGpus\s+(\d+)", header)
    for r in rows:
        r.update({"op": op, "ranks": ranks, "ranks_per_node": ppn})
    return {"backend": "nccl-tests", "world_size": ranks, "nodes": len(per_host) if complete else None,
            "ranks_per_node": ppn,
            "gpus_per_process": int(g.group(1)) if g else None, "device": None, "source": os.path.basename(name),
            "op": op, "rows": rows}


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _ranks_from_bandwidths(op: str, rows: List[Dict[str, Any]]) -> Optional[int]:
    """The ranks that busbw / algbw = factor(n) implies, where the printed
    digits determine n (a log without its device lines)."""
    best = max((r["out_of_place"] for r in rows if r.get("out_of_place")), key=lambda m: m["algbw"], default=None)
    if not best or best["algbw"] < 1 or op not in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        return None
    ratio = best["busbw"] / best["algbw"]
    slack = 0.006 / best["algbw"] * ratio          # two printed decimals
    gap = (2.0 if op == "all_reduce" else 1.0) - ratio
    if gap <= slack:
        return None
    scale = 2.0 if op == "all_reduce" else 1.0
    lo, hi = scale / (gap + slack), scale / max(gap - slack, 1e-12)
    n = round(scale / gap)
    return n if lo - 0.5 <= n <= hi + 0.5 and hi - lo < 1 else None


def parse(text: str, name: str = "log", op: Optional[str] = None) -> Dict[str, Any]:
    """One nccl-tests log with one test (the first, where there are several)."""
    return parse_all(text, name, op)[0]


def import_logs(paths: List[str], op: Optional[str] = None) -> List[Dict[str, Any]]:
    out = []
    for p in paths:
        try:
            with open(p, errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise FileNotFoundError(f"{p}: {exc.strerror}") from None
        out.extend(parse_all(text, p, op))
    return out
