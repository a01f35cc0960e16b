"""Per-node views of a multi-host run.

- ``per_host``: one row per host: its ranks, mean step time, exposed comm /
  data / compute shares (time-weighted over its ranks' measured steps), the
  mean "work" per step (step time minus exposed communication: what the
  other hosts wait for), the mean arrival lateness of its ranks at the
  collectives, and how often one of its ranks was the last to arrive.
- ``scope_table``: collectives split by scope: *intra-node* (every rank of
  the group on one host) or *inter-node* (the group spans hosts).
- ``slow_host``: the host to name when one host is behind beyond chance:
  per step, the mean work of its ranks exceeds the other hosts' median more often
  than a fair coin gives (sign test, Bonferroni over the hosts, at the
  rule's share of the report's 5 % false-accusation budget) by at least
  0.25 ms and 2 % (analyzers/evidence.py). Slowed ranks show as extra work. A slowed *link* slows every
  rank of a ring collective alike, so collective timings alone cannot say
  whose link it is (the per-host inter-node busbw column shows the drop;
  which node needs point-to-point tests).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from ..trace.ops import bus_factor
from .codes import distinct, host_codes as _host_codes, str_codes as _str_codes
from .evidence import format_p
from .stragglers import sign_tests, wide_of

HOST_COLUMNS = ["host", "ranks", "step_ms", "work_ms", "comm_pct", "data_pct", "compute_pct",
                "lateness_ms", "last_pct", "inter_busbw_GBps", "late_steps", "steps", "excess_ms", "p", "needed",
                "accused"]
SCOPE_COLUMNS = ["op", "scope", "calls", "bytes_per_call", "lat_ms_p50", "busbw_GBps"]


def _ranges(ranks) -> str:
    from .clocks import _ranges as r

    return r(sorted(int(x) for x in ranks))


def group_scope(comm: Optional[pd.DataFrame], hosts: Dict[int, str]) -> Dict[str, str]:
    """group name -> 'intra-node' | 'inter-node' (from the ranks seen in it)."""
    if comm is None or comm.empty:
        return {}
    gcodes, gnames = _str_codes(comm["group"])
    hcode = _host_codes(comm["rank"].to_numpy(), hosts)
    width = int(hcode.max()) + 1 if len(hcode) else 1
    pairs = distinct(gcodes.astype(np.int64) * width + hcode)
    n_hosts = np.bincount(pairs // width, minlength=len(gnames))
    return {g: ("inter-node" if n_hosts[i] > 1 else "intra-node") for i, g in enumerate(gnames)
            if n_hosts[i] > 0}


def scope_table(comm: Optional[pd.DataFrame], hosts: Dict[int, str],
                scope: Optional[Dict[str, str]] = None) -> pd.DataFrame:
    """Per (op, scope): calls, bytes, median latency and busbw (nccl-tests
    factors). ``scope``: :func:`group_scope` of the same calls where the
    caller has it."""
    if comm is None or comm.empty or "name" not in comm:
        return pd.DataFrame(columns=SCOPE_COLUMNS)
    if scope is None:
        scope = group_scope(comm, hosts)
    gcodes, gnames = _str_codes(comm["group"])
    codes = {"intra-node": 0, "inter-node": 1}
    scope_of = np.array([codes.get(scope.get(g) or "", -1) for g in gnames], np.int64)
    sc = scope_of[gcodes]
    ocodes, onames = _str_codes(comm["name"])
    keep = sc >= 0
    lat = (comm["t_end"].to_numpy(np.float64) - comm["t_start"].to_numpy(np.float64)) / 1e9
    nbytes = comm["bytes"].to_numpy(np.float64)
    gsize = comm["group_size"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(lat > 0, nbytes / lat / 1e9, np.nan)
    key = ocodes * 2 + sc
    rows = []
    order = sorted(((onames[k // 2], ("intra-node", "inter-node")[k % 2]), k) for k in distinct(key[keep]).tolist())
    for (op, sc_name), k in order:
        sel = keep & (key == k)
        calls = int(sel.sum())
        if calls == len(sel):   # one (op, scope), the usual sample: no copies of its columns
            sel = slice(None)
        bus = algbw[sel] * bus_factor(op, gsize[sel])
        rows.append({"op": op, "scope": sc_name, "calls": calls,
                     "bytes_per_call": float(np.nanmean(nbytes[sel])) if np.isfinite(nbytes[sel]).any() else np.nan,
                     "lat_ms_p50": float(np.median(lat[sel] * 1e3)),
                     "busbw_GBps": float(np.nanmedian(bus)) if np.isfinite(bus).any() else np.nan})
    return pd.DataFrame(rows, columns=SCOPE_COLUMNS)


def with_counts(scope: pd.DataFrame, counts: pd.DataFrame, hosts: Dict[int, str],
                comm: Optional[pd.DataFrame], scopes: Optional[Dict[str, str]] = None) -> pd.DataFrame:
    """The scope table with its calls and bytes per call from exact counts
    per (op, group) (``counts``), where its medians come from a sample of
    the calls (``comm``; ``scopes``: its :func:`group_scope` where the
    caller has it)."""
    if scope.empty or counts.empty:
        return scope
    sc = scopes if scopes is not None else group_scope(comm, hosts)
    c = counts.assign(scope=counts["group"].map(sc))
    per = c.groupby(["op", "scope"])[["calls", "bytes_sum", "bytes_n"]].sum()
    out = scope.copy()
    for i, row in out.iterrows():
        key = (row["op"], row["scope"])
        if key in per.index:
            calls, b_sum, b_n = per.loc[key]
            out.at[i, "calls"] = int(calls)
            out.at[i, "bytes_per_call"] = float(b_sum) / float(b_n) if b_n else np.nan
    return out


def per_host(steps: pd.DataFrame, lateness: pd.DataFrame, hosts: Dict[int, str],
             comm: Optional[pd.DataFrame] = None, scope: Optional[Dict[str, str]] = None) -> pd.DataFrame:
    """``scope``: :func:`group_scope` of ``comm`` where the caller has it."""
    if steps.empty or len(set(hosts.values())) <= 1:
        return pd.DataFrame(columns=HOST_COLUMNS)
    names = sorted(set(hosts.values()) | {"?"})
    present = distinct(steps["rank"].to_numpy())
    hc = _host_codes(steps["rank"].to_numpy(), hosts)   # integer codes in name order: no string keys
    n_h = len(names)
    rows_n = np.bincount(hc, minlength=n_h)

    def total(v):
        return np.bincount(hc, weights=v, minlength=n_h)

    # one float64 column of the steps at a time (a run's steps are ranks x steps rows)
    tot = {c: total(steps[c].to_numpy(np.float64)) for c in ("step_time", "comm", "data", "compute")}
    work_ns = steps["step_time"].to_numpy(np.float64, copy=True)
    work_ns -= steps["comm"].to_numpy(np.float64)
    work_tot = total(work_ns)
    late = lateness.assign(host=lateness["rank"].map(lambda r: hosts.get(int(r), "?"))) \
        if len(lateness) else pd.DataFrame(columns=["host", "lateness_ms", "last_pct"])
    busbw = _host_busbw(comm, hosts, scope)
    # a host's ranks at one step averaged by sign_tests (stragglers.wide)
    tests = sign_tests(wide_of(hc, steps["step"].to_numpy(), work_ns)).set_index("unit")
    del work_ns
    pairs = np.asarray(_host_codes(present, hosts), np.int64) << 32 | present.astype(np.int64)
    rows = []
    for code in np.flatnonzero(rows_n):
        h = names[code]
        t = tot["step_time"][code]
        pct = {c: 100.0 * tot[c][code] / t if t > 0 else np.nan for c in ("comm", "data", "compute")}
        lh = late[late["host"] == h]
        rows.append({
            "host": h, "ranks": _ranges(pairs[(pairs >> 32) == code] & 0xFFFFFFFF),
            "step_ms": float(t / rows_n[code]) / 1e6,
            "work_ms": float(work_tot[code] / rows_n[code]) / 1e6,
            "comm_pct": pct["comm"], "data_pct": pct["data"], "compute_pct": pct["compute"],
            "lateness_ms": float(lh["lateness_ms"].mean()) if len(lh) else np.nan,
            "last_pct": float(lh["last_pct"].sum()) if len(lh) else np.nan,
            "inter_busbw_GBps": busbw.get(h, np.nan),
            **{c: tests.loc[code, c] for c in ("late_steps", "steps", "excess_ms", "p", "needed", "accused")},
        })
    return pd.DataFrame(rows, columns=HOST_COLUMNS)


def _host_busbw(comm, hosts, scope: Optional[Dict[str, str]] = None) -> Dict[str, float]:
    """Per host: the median busbw of its ranks' inter-node all_reduce calls
    (one pass over the calls: host and group as integer codes)."""
    if comm is None or comm.empty:
        return {}
    if scope is None:
        scope = group_scope(comm, hosts)
    gcodes, gnames = _str_codes(comm["group"])
    inter = np.array([scope.get(g) == "inter-node" for g in gnames], bool)
    ncodes, nnames = _str_codes(comm["name"])
    is_ar = np.array([n == "all_reduce" for n in nnames], bool)
    sel = inter[gcodes] & is_ar[ncodes]
    if not sel.any():
        return {}
    def col(name):      # the calls taken, then converted (the same values)
        return comm[name].to_numpy()[sel].astype(np.float64)

    lat = (col("t_end") - col("t_start")) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(lat > 0, col("bytes") / lat / 1e9, np.nan) * bus_factor("all_reduce", col("group_size"))
    names = sorted(set(hosts.values()) | {"?"})
    hc = _host_codes(comm["rank"].to_numpy()[sel], hosts)
    fin = np.isfinite(bw)
    hc, bw = hc[fin], bw[fin]
    small = np.int16 if len(names) < (1 << 15) else np.int64   # int16: numpy's radix sort
    order = np.argsort(hc.astype(small), kind="stable")         # per host, each median by partition
    hc, bw = hc[order], bw[order]
    out = {}
    first = np.flatnonzero(np.r_[True, hc[1:] != hc[:-1]]) if len(hc) else np.zeros(0, np.int64)
    for lo, hi in zip(first.tolist(), np.r_[first[1:], len(hc)].tolist()):     # each host's run of calls
        code = int(hc[lo])
        if names[code] != "?" or "?" in hosts.values():
            out[names[code]] = float(np.median(bw[lo:hi]))
    return out


def slow_host(table: pd.DataFrame) -> Optional[dict]:
    """The host behind the others beyond chance (its per-step work above the
    median host's, sign test over the hosts: analyzers/evidence.py), with
    the evidence, or None."""
    if len(table) < 2 or "accused" not in table:
        return None
    best = None
    for _, row in table[table["accused"].astype(bool)].iterrows():
        others = table[table["host"] != row["host"]]
        med = float(others["work_ms"].median())
        extra = row["work_ms"] - med
        cand = {"host": row["host"], "ranks": row["ranks"], "kind": "work",
                "evidence": f"work per step {row['work_ms']:.1f} ms vs {med:.1f} ms on the other hosts "
                            f"(+{extra:.1f} ms); above the median of the other hosts in {int(row['late_steps'])} of "
                            f"{int(row['steps'])} steps (sign test p = {format_p(row['p'])} corrected over "
                            f"{len(table)} hosts)", "score": extra}
        if best is None or cand["score"] > best["score"]:
            best = cand
    return best
