"""Clock alignment of hosts from the collectives themselves.

Every rank stamps events with its host's CLOCK_MONOTONIC; hosts' clocks
differ by arbitrary offsets. The wall clock at start (``wall - mono`` in each
rank's metadata) gives a first guess, good to the hosts' NTP error — often
milliseconds, as large as the arrival skews users look for. The trace then
corrects it, the way Scalasca corrects timestamps from message semantics:

- **Causality** (hard bounds): a collective cannot complete on any rank
  before the last rank issued it. For hosts A (reference) and B with offset
  o (B's clock + o = A's clock), every instance both take part in gives
  ``o >= max_issue_A - min_end_B`` and ``o <= min_end_A - max_issue_B``:
  an interval, like NTP's, that narrows with every collective.
- **Synchronous completion** (estimate): a blocking collective (and, less
  tightly, any collective) completes on all ranks at nearly the same
  instant, so ``o ~ median(end_A - end_B)`` over the instances; the
  estimate is clipped into the causality interval.

A clock domain is a (host name, boot id) pair: ranks on one host share a
clock. The reference is the domain of the lowest rank. Per domain the
report states the offset, the wall-clock guess, the correction, the
uncertainty (standard error of the median), the causality interval
(``feasible_lo_ms``..``feasible_hi_ms``: every offset in it violates no
collective) and the residual causality violations after alignment.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from .codes import str_codes

#: at most about this many collective calls are read for the alignment: past it, every k-th instance
#: (by sequence number, all its ranks together), which the table's method column states
MAX_ALIGN_CALLS = 1_000_000

ALIGN_COLUMNS = ["host", "ranks", "offset_ms", "wall_guess_ms", "correction_ms", "uncertainty_ms",
                 "feasible_lo_ms", "feasible_hi_ms", "instances", "violations", "method"]


def domains(rank_metas: List[dict]) -> Dict[int, Tuple[str, str]]:
    """rank -> clock domain (host, boot id)."""
    out = {}
    for m in rank_metas:
        if "rank" not in m:
            continue
        c = m.get("clock") or {}
        out[int(m["rank"])] = (str(m.get("host") or "?"), str(c.get("boot_id") or ""))
    return out


def wall_offsets(rank_metas: List[dict]) -> Dict[int, int]:
    """Per rank, ns to add to its monotonic times (wall-clock guess),
    relative to the lowest rank's domain."""
    out = {}
    for m in rank_metas:
        c = m.get("clock") or {}
        if "wall_ns_at_start" in c and "mono_ns_at_start" in c and "rank" in m:
            out[int(m["rank"])] = int(c["wall_ns_at_start"]) - int(c["mono_ns_at_start"])
    if out:
        base = out[min(out)]
        out = {r: v - base for r, v in out.items()}
    return out


def align(comm: Optional[pd.DataFrame], rank_metas: List[dict]) -> Tuple[Dict[int, int], pd.DataFrame]:
    """Offsets per rank (ns to add to its times) and the per-host table.

    ``comm``: one row per collective call with rank, group, seq, t_start,
    t_end (completion: device time where measured) and blocking. With one
    clock domain nothing is shifted and the table is empty."""
    dom = domains(rank_metas)
    names = sorted(set(dom.values()))
    if len(names) <= 1:
        return {}, pd.DataFrame(columns=ALIGN_COLUMNS)
    wall = wall_offsets(rank_metas)
    ref = dom[min(dom)]
    dom_wall: Dict[tuple, int] = {}
    for r, d in sorted(dom.items()):
        dom_wall.setdefault(d, wall.get(r, 0))
    rows = []
    dom_off: Dict[tuple, int] = {ref: dom_wall.get(ref, 0)}
    code = {d: i for i, d in enumerate(names)}
    pairs = _instances(comm, dom, code) if comm is not None and len(comm) else None
    estimates = _estimates(pairs, code[ref]) if pairs is not None else {}
    for d in names:
        ranks = sorted(r for r, x in dom.items() if x == d)
        guess = dom_wall.get(d, 0)
        if d == ref:
            rows.append(_row(d, ranks, guess, guess, 0.0, (0.0, 0.0), 0, "reference"))
            continue
        est = estimates.get(code[d])
        if est is None:
            dom_off[d] = guess
            rows.append(_row(d, ranks, guess, guess, float("nan"), (float("nan"),) * 2, 0,
                             "wall clock (no shared collective)"))
            continue
        off, unc, feasible, n, method = est
        stride = pairs.attrs.get("stride", 1) if pairs is not None else 1
        if comm is not None:                # a sample of the run's calls (analyzers/run.py) or of these
            stride *= comm.attrs.get("stride", 1)
        if stride > 1 and comm is not None:
            method += f"; one instance in {stride} (of {comm.attrs.get('calls', len(comm)):,} calls)"
        dom_off[d] = off
        rows.append(_row(d, ranks, off, guess, unc, feasible, n, method))
    offsets = {r: dom_off[d] for r, d in dom.items()}
    table = pd.DataFrame(rows, columns=ALIGN_COLUMNS)
    if pairs is not None:
        table["violations"] = _violations(pairs, np.array([dom_off.get(d, 0) for d in names], np.int64), len(names))
    return offsets, table


def _row(d, ranks, off, guess, unc, feasible, n, method):
    return {"host": d[0], "ranks": _ranges(ranks), "offset_ms": off / 1e6, "wall_guess_ms": guess / 1e6,
            "correction_ms": (off - guess) / 1e6, "uncertainty_ms": unc / 1e6,
            "feasible_lo_ms": feasible[0] / 1e6, "feasible_hi_ms": feasible[1] / 1e6,
            "instances": n, "violations": 0, "method": method}


def _ranges(ranks: List[int]) -> str:
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def _instances(comm: pd.DataFrame, dom: Dict[int, tuple], code: Dict[tuple, int]) -> pd.DataFrame:
    """Per (instance, domain): earliest/latest issue, earliest/latest/median
    completion. Groups and domains as integer codes (no string column is
    built per call)."""
    rank = comm["rank"].to_numpy(np.int64)
    lut = np.full(int(rank.max()) + 1 if len(rank) else 1, -1, np.int64)
    for r, d in dom.items():
        if 0 <= int(r) < len(lut):
            lut[int(r)] = code[d]
    dcode = lut[rank]
    gcodes, _names = str_codes(comm["group"])
    seq = comm["seq"]
    ok = (dcode >= 0) & seq.notna().to_numpy() & comm["group"].notna().to_numpy()
    blocking = comm["blocking"].fillna(False).to_numpy(bool) if "blocking" in comm else np.zeros(len(comm), bool)
    stride = 1
    if int(ok.sum()) > MAX_ALIGN_CALLS:      # a sample of whole instances: every stride-th sequence number
        stride = -(-int(ok.sum()) // MAX_ALIGN_CALLS)
        ok &= np.nan_to_num(seq.to_numpy(np.float64)) % stride == 0
    sel = slice(None) if ok.all() else ok       # every call, the usual sample: no copies of its columns
    grp, sq, dm = gcodes[sel], seq.to_numpy()[sel].astype(np.int64, copy=False), dcode[sel]
    t0 = comm["t_start"].to_numpy()[sel].astype(np.int64, copy=False)
    t1 = comm["t_end"].to_numpy()[sel].astype(np.int64, copy=False)
    blk = blocking[sel]
    cols = ["group", "seq", "dom", "min_start", "max_start", "min_end", "max_end", "med_end", "blocking"]
    if not len(grp):
        return pd.DataFrame(columns=cols)
    out = _reduce_instances(grp, sq, dm, t0, t1, blk, cols)
    out.attrs["stride"] = stride
    return out


def _by_key_then(key: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``np.lexsort((t, key))``: by key, then t, stable. Where both fit in
    one int64 (a key of at most 20 bits and times within 2**41 ns, as a
    trace's instances and completions do) one stable argsort of the two
    packed together: the calls arrive in long sorted runs, which it merges
    (0.9 M calls: 8 ms against lexsort's 46 ms)."""
    if len(key) and int(key.min()) >= 0:
        lo = int(t.min())
        bits = max(int(t.max()) - lo, 1).bit_length()
        if int(key.max()).bit_length() + bits <= 62:
            return np.argsort((key.astype(np.int64) << bits) | (t.astype(np.int64) - lo), kind="stable")
    return np.lexsort((t, key))


def _reduce_instances(grp, sq, dm, t0, t1, blk, cols) -> pd.DataFrame:
    # one sort by (group, seq, dom, completion): groups are runs, the median is read off each run's middle
    sq0 = sq - sq.min()
    n_dom = int(dm.max()) + 1
    key = (grp * (int(sq0.max()) + 1) + sq0) * n_dom + dm
    order = _by_key_then(key, t1)
    key, t0, t1, blk = key[order], t0[order], t1[order], blk[order]
    first = np.concatenate([[0], np.flatnonzero(key[1:] != key[:-1]) + 1])
    size = np.diff(np.concatenate([first, [len(key)]]))
    lo, hi = first + (size - 1) // 2, first + size // 2
    k = key[first]
    out = {
        "group": k // n_dom // (int(sq0.max()) + 1), "seq": k // n_dom % (int(sq0.max()) + 1) + sq.min(),
        "dom": k % n_dom,
        "min_start": np.minimum.reduceat(t0, first), "max_start": np.maximum.reduceat(t0, first),
        "min_end": t1[first], "max_end": t1[first + size - 1], "med_end": (t1[lo].astype(np.float64) + t1[hi]) / 2,
        "blocking": np.minimum.reduceat(blk.astype(np.uint8), first).astype(bool)}
    return pd.DataFrame({c: out[c] for c in cols}, copy=False)     # arrays of its own: not copied again


def _estimates(pairs: pd.DataFrame, ref: int) -> Dict[int, tuple]:
    """Per domain other than ``ref``: (offset, uncertainty, causal bounds,
    instances, method) from the instances it shares with ``ref``, each of
    its rows paired with the reference row of the same (group, seq) by one
    sorted lookup, the bounds by domain with ``reduceat``. Domains sharing
    no instance with ``ref`` are absent."""
    dom = pairs["dom"].to_numpy(np.int64)
    is_ref = dom == ref
    if not is_ref.any():
        return {}
    seq = pairs["seq"].to_numpy(np.int64)
    inst = pairs["group"].to_numpy(np.int64) * (int(seq.max()) - int(seq.min()) + 1) + (seq - int(seq.min()))
    order = np.argsort(inst[is_ref], kind="stable")
    ref_rows = np.flatnonzero(is_ref)[order]
    ref_inst = inst[ref_rows]
    pos = np.minimum(np.searchsorted(ref_inst, inst), len(ref_inst) - 1)
    rows = np.flatnonzero(~is_ref & (ref_inst[pos] == inst))
    if not len(rows):
        return {}
    rows = rows[np.argsort(dom[rows], kind="stable")]
    a = ref_rows[pos[rows]]
    d = dom[rows]
    col = {c: pairs[c].to_numpy() for c in ("max_start", "min_end", "med_end", "blocking")}
    lo_v = col["max_start"][a] - col["min_end"][rows]
    hi_v = col["min_end"][a] - col["max_start"][rows]
    diff_all = (col["med_end"][a] - col["med_end"][rows]).astype(np.float64)
    both = col["blocking"][a].astype(bool) & col["blocking"][rows].astype(bool)
    first = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    ends = np.r_[first[1:], len(d)]
    los, his = np.maximum.reduceat(lo_v, first), np.minimum.reduceat(hi_v, first)
    out = {}
    for k, (s0, s1) in enumerate(zip(first.tolist(), ends.tolist())):
        sync = both[s0:s1]
        use_sync = int(sync.sum()) >= 3
        diff = diff_all[s0:s1][sync] if use_sync else diff_all[s0:s1]
        out[int(d[s0])] = _offset(diff, float(los[k]), float(his[k]), s1 - s0, "blocking" if use_sync else "all")
    return out


def _offset(diff: np.ndarray, lo: float, hi: float, n: int, kind: str) -> tuple:
    """(offset, uncertainty, causal bounds, instances, method) from the
    paired completions' differences and the causality bounds."""
    est = float(np.median(diff))
    # standard error of a median: 1.2533 sigma / sqrt(n), sigma from the MAD
    mad = float(np.median(np.abs(diff - est))) * 1.4826
    unc = 1.2533 * mad / np.sqrt(len(diff))
    if lo <= hi:
        off = min(max(est, lo), hi)
        method = f"collectives ({kind} completions, within causality bounds)"
    else:
        off = est
        method = f"collectives ({kind} completions; causality bounds conflict)"
    return int(round(off)), unc, (lo, hi), int(n), method


def _violations(pairs: pd.DataFrame, dom_off: np.ndarray, n_domains: int) -> List[int]:
    """Per domain: instances in which one of its ranks completes, after
    alignment, before the last issuer (of any domain) issued."""
    d = pairs["dom"].to_numpy(np.int64)
    off = dom_off[d]
    s = pairs["max_start"].to_numpy(np.float64) + off
    e = pairs["min_end"].to_numpy(np.float64) + off
    key = pairs.groupby(["group", "seq"], sort=False).ngroup().to_numpy()
    last = np.full(key.max() + 1 if len(key) else 0, -np.inf)
    np.maximum.at(last, key, s)
    multi = np.bincount(key, minlength=len(last))[key] > 1
    bad = (e < last[key]) & multi
    return np.bincount(d[bad], minlength=n_domains).astype(int).tolist()
