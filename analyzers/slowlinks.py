"""Which node or link is slow *in communication*, from the collectives a
training trace already holds.

A collective's *transfer time* is what it takes once every rank has
arrived: the duration of the last rank to arrive, which waits for nobody
(the smallest duration over the ranks of one instance; no clock alignment
needed). A rank that computes slowly arrives late and makes the others wait,
but its transfers are as fast as anyone's; a slow link or NIC makes the
transfers of every group that crosses it slower, whoever arrives last.

From the transfer times alone (``group_speeds``): per inter-node group, the
median bus bandwidth of its instances (nccl-tests bus factors) and its upper
quartile. Groups are compared within a *class* (same op, sizes within a
factor of two); a class needs three or more inter-node groups, over node
sets that differ, for anything to be said (``attribute``):

- a node is slow in communication when more than half of its groups (two or
  more) have an upper quartile below ``SLOW`` x the median of the groups it
  is not in (the rule of ``commprof bench --pairs``, analyzers/pairs.py);
- a group of nodes that are not slow is slow when its upper quartile is
  below ``SLOW`` x the median of the groups of normal nodes: a *link*
  between its two nodes, or somewhere among its nodes for a larger group;
- a run whose every inter-node collective goes over one group (a ring over
  all ranks: plain DDP) cannot tell: every rank waits for the slowest hop
  alike. ``commprof bench --pairs`` measures each pair alone.

A node slow in *compute* is the per-node rule's (analyzers/nodes.py: its
ranks' work per step against the other hosts'), not this one's.

Pure: DataFrames in, tables out."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from ..trace.ops import bus_factor
from .codes import distinct, str_codes
from .pairs import SLOW, slow_members

GROUP_COLUMNS = ["class", "group", "op", "nodes", "n_nodes", "ranks", "calls", "bytes", "transfer_ms",
                 "busbw_GBps", "busbw_GBps_p75", "slow"]
NODE_COLUMNS = ["class", "host", "groups", "slow_groups", "busbw_GBps_median", "others_GBps_median", "verdict"]
#: fewest instances of a group for it to be compared
MIN_CALLS = 3


def group_speeds(comm: Optional[pd.DataFrame], hosts: Dict[int, str]) -> pd.DataFrame:
    """Per inter-node group and op: its node set, its instances' transfer
    time (median) and bus bandwidth (median and upper quartile)."""
    if comm is None or comm.empty or "seq" not in comm or "group" not in comm:
        return pd.DataFrame(columns=GROUP_COLUMNS)
    c = comm[comm["seq"].notna() & comm["group"].notna()]
    if c.empty:
        return pd.DataFrame(columns=GROUP_COLUMNS)
    gcodes, gnames = str_codes(c["group"])
    ocodes, onames = str_codes(c["name"])
    rank = c["rank"].to_numpy(np.int64)
    seq = c["seq"].to_numpy(np.int64)
    # one integer key per instance (group, op, seq); numpy sorts and reductions, no per-row Python
    go = gcodes * len(onames) + ocodes
    seq0 = seq - seq.min()
    key = go * (int(seq0.max()) + 1) + seq0
    order = np.argsort(key, kind="stable")
    ks = key[order]
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    dur = (c["t_end"].to_numpy(np.int64) - c["t_start"].to_numpy(np.int64))[order]
    inst_dur = np.minimum.reduceat(dur, starts)
    inst_bytes = np.maximum.reduceat(np.nan_to_num(c["bytes"].to_numpy(np.float64)[order]), starts)
    inst_gs = np.maximum.reduceat(np.nan_to_num(c["group_size"].to_numpy(np.float64)[order]), starts)
    inst_seen = np.diff(np.r_[starts, len(ks)])
    inst_go = go[order][starts]
    # an instance counts when every rank of the group recorded it (else its last arrival may be missing)
    ok = (inst_seen >= inst_gs) & (inst_dur > 0) & (inst_bytes > 0)
    # the node set of each group, from the ranks seen in it
    width = int(rank.max()) + 1
    gr = distinct(gcodes * width + rank)
    members: Dict[int, List[int]] = {}
    for v in gr.tolist():
        members.setdefault(v // width, []).append(v % width)
    rows = []
    for k in np.unique(inst_go[ok]).tolist():
        g, o = divmod(int(k), len(onames))
        node_set = tuple(sorted({hosts.get(int(r), "?") for r in members[g]}))
        sel = ok & (inst_go == k)
        if len(node_set) < 2 or sel.sum() < MIN_CALLS:
            continue
        op = onames[o]
        d, nb = inst_dur[sel], inst_bytes[sel]
        bw = nb * bus_factor(op, inst_gs[sel]) / (d / 1e9) / 1e9
        bw = bw[np.isfinite(bw)]
        if not len(bw):
            continue
        size = float(np.median(nb))
        rows.append({"class": "", "group": gnames[g], "op": op, "nodes": ", ".join(node_set),
                     "n_nodes": len(node_set), "ranks": len(members[g]), "calls": int(sel.sum()), "bytes": size,
                     "transfer_ms": float(np.median(d)) / 1e6, "busbw_GBps": float(np.median(bw)),
                     "busbw_GBps_p75": float(np.percentile(bw, 75)), "slow": False})
    out = pd.DataFrame(rows, columns=GROUP_COLUMNS)
    if len(out):
        out["class"] = _classes(out)
    return out


def with_counts(groups: pd.DataFrame, counts: pd.DataFrame) -> pd.DataFrame:
    """The groups' instance counts from exact calls per (op, group)
    (``counts``: the run's every call) where the table was built from a
    sample of the instances: calls / ranks of the group."""
    if groups.empty or counts.empty:
        return groups
    per = counts.set_index(["op", "group"])["calls"]
    out = groups.copy()
    for i, row in out.iterrows():
        key = (row["op"], row["group"])
        if key in per.index and row["ranks"]:
            out.at[i, "calls"] = int(per.loc[key]) // int(row["ranks"])
    return out


def _size(b: float) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):.3g} {unit}"
    return f"{b:.0f} B"


def _classes(groups: pd.DataFrame) -> List[str]:
    """Per group: its class, the op and the power of two its median size rounds to."""
    exp = np.round(np.log2(np.maximum(groups["bytes"].to_numpy(np.float64), 1))).astype(int)
    return [f"{op} ~{_size(float(2 ** int(e)))}" for op, e in zip(groups["op"], exp)]


def attribute(groups: pd.DataFrame) -> Tuple[pd.DataFrame, pd.DataFrame, List[dict]]:
    """The groups with their ``slow`` flag, per node and class a verdict,
    and the findings (slow node in communication, slow link or group; or
    that the run's groups cannot tell), each with evidence and a next step."""
    groups = groups.copy()
    tables, findings = [], []
    comparable = False
    for cls, g in groups.groupby("class", sort=False):
        if len(g) < 3 or len(set(g["nodes"])) < 3:
            continue
        comparable = True
        table, found, slow = _attribute_class(str(cls), g)
        groups.loc[g.index, "slow"] = slow
        tables.append(table)
        findings += found
    nodes = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=NODE_COLUMNS)
    if not comparable and len(groups):
        findings.append({"kind": "untold", "finding": "communication: which node or link is slow cannot be told "
                                                     "from this run's collectives",
                         "evidence": f"{len(groups)} inter-node group(s), none with two others of its kind over "
                                     "other nodes to compare with: in a ring every rank waits for the slowest "
                                     "hop alike",
                         "advice": ""})
    return groups, nodes, findings


def _sets(g: pd.DataFrame) -> List[set]:
    return [set(s.split(", ")) for s in g["nodes"]]


def _attribute_class(cls: str, g: pd.DataFrame):
    """One class's groups by the pairs bench's rule (pairs.slow_members)."""
    sets = _sets(g)
    per, healthy, ref, slow_group = slow_members(sets, g["busbw_GBps"].to_numpy(), g["busbw_GBps_p75"].to_numpy())
    slow_units = [u for u, *_x, slow in per if slow]
    table = pd.DataFrame([{"class": cls, "host": u, "groups": n, "slow_groups": k, "busbw_GBps_median": med,
                           "others_GBps_median": others, "verdict": "slow in communication" if slow else "normal"}
                          for u, n, k, med, _low, others, slow in per], columns=NODE_COLUMNS)
    findings = []
    for u in slow_units:
        r = table[table["host"] == u].iloc[0]
        findings.append({
            "kind": "node", "host": u,
            "finding": f"slow node in communication: {u}",
            "evidence": (f"{cls} transfers (after the last rank arrived) of the {r['groups']} groups over {u}: "
                         f"{r['busbw_GBps_median']:.3g} GB/s busbw median, {r['slow_groups']} below {SLOW:.0%} "
                         f"of the {r['others_GBps_median']:.3g} GB/s of the groups without it; its ranks arrive "
                         f"on time, its transfers are slow: {u}'s link or NIC, not its compute"),
            "advice": f"check {u}'s NIC and cable (ibstat / ethtool -S: negotiated rate, errors); confirm with "
                      f"`commprof bench --pairs` over the job's nodes"})
    for i in np.flatnonzero(slow_group & healthy):
        row = g.iloc[i]
        nodes = row["nodes"].split(", ")
        what = f"slow link: {nodes[0]} <-> {nodes[1]}" if len(nodes) == 2 else \
            f"slow group: {row['group']} ({row['nodes']})"
        findings.append({
            "kind": "link", "host": row["nodes"], "finding": what,
            "evidence": (f"{cls} transfers of group {row['group']}: {row['busbw_GBps']:.3g} GB/s busbw median "
                         f"(upper quartile {row['busbw_GBps_p75']:.3g}) vs {ref:.3g} GB/s median of the groups of "
                         f"normal nodes; its nodes' other groups normal: the path between them"),
            "advice": ("check the path between them (cables, switch ports, routing); confirm with "
                       f"`commprof bench --pairs` over {row['nodes']}")})
    return table, findings, slow_group


def pairs_command(hosts: Sequence[str], ranks_per_node: int) -> str:
    """The bench that measures every node pair of a job alone, on the job's nodes."""
    return (f"commprof bench --pairs -- srun -N {len(set(hosts))} --ntasks-per-node {max(1, ranks_per_node)} "
            "(or the job's own launcher)")
