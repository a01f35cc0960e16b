"""Per-node views of a multi-host run.

- ``per_host``: one row per host: its ranks, mean step time, exposed comm /
  data / compute shares (time-weighted over its ranks' measured steps), the
  mean "work" per step (step time minus exposed communication: what the
  other hosts wait for), the mean arrival lateness of its ranks at the
  collectives, and how often one of its ranks was the last to arrive.
- ``scope_table``: collectives split by scope: *intra-node* (every rank of
  the group on one host) or *inter-node* (the group spans hosts).
- ``slow_host``: the host to name when one host is persistently behind: its
  work per step exceeds the other hosts' median by > 10 % and 1 ms, or its
  ranks arrive last at > 50 % of the collectives and its mean lateness is
  > 1 ms. Slowed ranks show as extra work. A slowed *link* slows every
  rank of a ring collective alike, so collective timings alone cannot say
  whose link it is (the per-host inter-node busbw column shows the drop;
  which node needs point-to-point tests).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from ..trace.ops import bus_factor

HOST_COLUMNS = ["host", "ranks", "step_ms", "work_ms", "comm_pct", "data_pct", "compute_pct",
                "lateness_ms", "last_pct", "inter_busbw_GBps"]
SCOPE_COLUMNS = ["op", "scope", "calls", "bytes_per_call", "lat_ms_p50", "busbw_GBps"]


def _ranges(ranks) -> str:
    from .clocks import _ranges as r

    return r(sorted(int(x) for x in ranks))


def group_scope(comm: Optional[pd.DataFrame], hosts: Dict[int, str]) -> Dict[str, str]:
    """group name -> 'intra-node' | 'inter-node' (from the ranks seen in it)."""
    if comm is None or comm.empty:
        return {}
    out = {}
    for g, ranks in comm.groupby(comm["group"].astype(str))["rank"]:
        hs = {hosts.get(int(r), "?") for r in ranks.unique()}
        out[g] = "inter-node" if len(hs) > 1 else "intra-node"
    return out


def scope_table(comm: Optional[pd.DataFrame], hosts: Dict[int, str]) -> pd.DataFrame:
    """Per (op, scope): calls, bytes, median latency and busbw (nccl-tests factors)."""
    if comm is None or comm.empty or "name" not in comm:
        return pd.DataFrame(columns=SCOPE_COLUMNS)
    scope = group_scope(comm, hosts)
    c = comm.assign(scope=comm["group"].astype(str).map(scope), op=comm["name"].astype(str))
    c = c[c["scope"].notna()]
    lat = (c["t_end"] - c["t_start"]).astype(np.float64) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(lat > 0, c["bytes"].astype(np.float64) / lat / 1e9, np.nan)
    c = c.assign(lat_ms=lat * 1e3, algbw=algbw)
    rows = []
    for (op, sc), g in c.groupby(["op", "scope"]):
        bus = g["algbw"].to_numpy() * bus_factor(op, g["group_size"].astype(np.float64).to_numpy())
        rows.append({"op": op, "scope": sc, "calls": len(g), "bytes_per_call": float(g["bytes"].mean()),
                     "lat_ms_p50": float(g["lat_ms"].median()),
                     "busbw_GBps": float(np.nanmedian(bus)) if np.isfinite(bus).any() else np.nan})
    return pd.DataFrame(rows, columns=SCOPE_COLUMNS)


def per_host(steps: pd.DataFrame, lateness: pd.DataFrame, hosts: Dict[int, str],
             comm: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    if steps.empty or len(set(hosts.values())) <= 1:
        return pd.DataFrame(columns=HOST_COLUMNS)
    s = steps.assign(host=steps["rank"].map(lambda r: hosts.get(int(r), "?")))
    late = lateness.assign(host=lateness["rank"].map(lambda r: hosts.get(int(r), "?"))) \
        if len(lateness) else pd.DataFrame(columns=["host", "lateness_ms", "last_pct"])
    rows = []
    for h, g in s.groupby("host"):
        total = float(g["step_time"].sum())
        pct = {c: 100.0 * float(g[c].sum()) / total if total > 0 else np.nan for c in ("comm", "data", "compute")}
        lh = late[late["host"] == h]
        rows.append({
            "host": h, "ranks": _ranges(g["rank"].unique()),
            "step_ms": float(g["step_time"].mean()) / 1e6,
            "work_ms": float((g["step_time"] - g["comm"]).mean()) / 1e6,
            "comm_pct": pct["comm"], "data_pct": pct["data"], "compute_pct": pct["compute"],
            "lateness_ms": float(lh["lateness_ms"].mean()) if len(lh) else np.nan,
            "last_pct": float(lh["last_pct"].sum()) if len(lh) else np.nan,
            "inter_busbw_GBps": _host_busbw(comm, hosts, h),
        })
    return pd.DataFrame(rows, columns=HOST_COLUMNS)


def _host_busbw(comm, hosts, h) -> float:
    """Median busbw of this host's ranks' inter-node all_reduce calls."""
    if comm is None or comm.empty:
        return np.nan
    scope = group_scope(comm, hosts)
    c = comm[(comm["group"].astype(str).map(scope) == "inter-node")
             & (comm["name"].astype(str) == "all_reduce")
             & (comm["rank"].map(lambda r: hosts.get(int(r)) == h))]
    if c.empty:
        return np.nan
    lat = (c["t_end"] - c["t_start"]).astype(np.float64) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(lat > 0, c["bytes"].astype(np.float64) / lat / 1e9, np.nan) \
            * bus_factor("all_reduce", c["group_size"].astype(np.float64).to_numpy())
    return float(np.nanmedian(bw)) if np.isfinite(bw).any() else np.nan


def slow_host(table: pd.DataFrame, rel: float = 0.10, abs_ms: float = 1.0) -> Optional[dict]:
    """The host persistently behind the others, with the evidence, or None."""
    if len(table) < 2:
        return None
    best = None
    for _, row in table.iterrows():
        others = table[table["host"] != row["host"]]
        med = float(others["work_ms"].median())
        extra = row["work_ms"] - med
        if extra > max(abs_ms, rel * med):
            cand = {"host": row["host"], "ranks": row["ranks"], "kind": "work",
                    "evidence": f"work per step {row['work_ms']:.1f} ms vs {med:.1f} ms on the other hosts "
                                f"(+{extra:.1f} ms)", "score": extra}
            if best is None or cand["score"] > best["score"]:
                best = cand
    if best is not None:
        return best
    for _, row in table.iterrows():
        if row["last_pct"] == row["last_pct"] and row["last_pct"] > 50 and row["lateness_ms"] > abs_ms:
            return {"host": row["host"], "ranks": row["ranks"], "kind": "arrival",
                    "evidence": f"its ranks arrive last at {row['last_pct']:.0f} % of the collectives, "
                                f"{row['lateness_ms']:.1f} ms late on average", "score": row["lateness_ms"]}
    return None
