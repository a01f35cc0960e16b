"""Point-to-point bandwidth between every pair of nodes (``commprof bench
--pairs``): the schedule and the attribution of a slow node or link.

Ring collectives hide where a slow part is (every rank waits for the
slowest hop); pairs measured one at a time do not. The schedule is a
round-robin tournament (the circle method): N - 1 rounds for N nodes (N
rounds for odd N, one node idle in each), every pair exactly once, no node
in two pairs in one round, so the pairs of a round share no link (on a
non-blocking switch). Inside a node the same schedule runs over its local
ranks, all nodes at once (their links are disjoint). A budget
(``max_pairs``) keeps whole rounds, chosen at random: every node is still
measured the same number of times, against different partners.

Attribution, from the pairs' bandwidths (bytes each way / exchange time,
per iteration; a pair's value is its median):

- a node is *slow* when more than half of its pairs have an upper
  quartile over iterations below ``SLOW`` x the median of the pairs it is
  not in (its best iterations too, so noise of single iterations does not
  count; and a slow node cannot drag its own reference down, even among
  three): its own link or NIC (a bad switch port looks the same);
- a pair is *slow* when its upper quartile is below ``SLOW`` x the median
  of the pairs between nodes that are not slow; a slow pair of two nodes
  that are not slow is a slow *link* between them (a cable, a route, a
  switch between the two);
- two nodes: one pair, nothing to compare: said so.

Pure: DataFrames in, tables out."""
from __future__ import annotations

import random
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import pandas as pd

#: a pair is slow below this fraction of the median pair (its upper quartile over iterations)
SLOW = 0.6

Round = List[Tuple[int, int]]


def tournament(n: int) -> List[Round]:
    """Rounds of disjoint pairs (i < j) over 0..n-1 covering every pair once:
    the circle method (one unit fixed, the others rotate)."""
    if n < 2:
        return []
    units: List[Optional[int]] = list(range(n)) + ([None] if n % 2 else [])
    m = len(units)
    rounds: List[Round] = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = units[k], units[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        units = [units[0], units[-1]] + units[1:-1]
    return rounds


def plan(hosts: Sequence[str], max_pairs: Optional[int] = None, seed: int = 0,
         intra: bool = True) -> List[Round]:
    """The rounds of rank pairs for ranks on ``hosts`` (host name per rank):
    node pairs first (each node by its lowest rank), then the pairs inside
    every node, all nodes at once. ``max_pairs`` keeps whole node rounds at
    random until the budget is spent (at least one round)."""
    nodes: Dict[str, List[int]] = {}
    for r, h in enumerate(hosts):
        nodes.setdefault(str(h), []).append(r)
    leaders = [ranks[0] for ranks in nodes.values()]
    rounds = [[(leaders[a], leaders[b]) for a, b in rnd] for rnd in tournament(len(leaders))]
    if max_pairs is not None and sum(len(r) for r in rounds) > max_pairs:
        keep: List[int] = []
        total = 0
        for i in random.Random(seed).sample(range(len(rounds)), len(rounds)):
            if keep and total + len(rounds[i]) > max_pairs:
                break
            keep.append(i)
            total += len(rounds[i])
        rounds = [rounds[i] for i in sorted(keep)]
    if intra:
        local = [tournament(len(ranks)) for ranks in nodes.values()]
        for k in range(max((len(t) for t in local), default=0)):
            rnd = [(ranks[a], ranks[b]) for ranks, t in zip(nodes.values(), local) if k < len(t) for a, b in t[k]]
            if rnd:
                rounds.append(sorted(rnd))
    return rounds


PAIR_COLUMNS = ["a", "b", "host_a", "host_b", "scope", "bytes", "iters", "bw_GBps", "bw_GBps_p25", "bw_GBps_p75",
                "lat_us", "slow"]


def pair_table(samples: pd.DataFrame) -> pd.DataFrame:
    """Per pair: bandwidth (median and quartiles over iterations, GB/s each
    way) and latency (median of the small exchanges, us). ``samples``: one
    row per iteration with a, b, host_a, host_b, kind ('bw' | 'lat'), bytes,
    seconds (the exchange's time: both directions at once)."""
    rows = []
    for (a, b), g in samples.groupby(["a", "b"], sort=True):
        bw = g[g["kind"] == "bw"]
        lat = g[g["kind"] == "lat"]
        per = (bw["bytes"] / bw["seconds"]).to_numpy(np.float64) / 1e9
        h_a, h_b = str(g["host_a"].iloc[0]), str(g["host_b"].iloc[0])
        rows.append({"a": int(a), "b": int(b), "host_a": h_a, "host_b": h_b,
                     "scope": "intra-node" if h_a == h_b else "inter-node",
                     "bytes": int(bw["bytes"].iloc[0]) if len(bw) else 0, "iters": len(per),
                     "bw_GBps": float(np.median(per)) if len(per) else float("nan"),
                     "bw_GBps_p25": float(np.percentile(per, 25)) if len(per) else float("nan"),
                     "bw_GBps_p75": float(np.percentile(per, 75)) if len(per) else float("nan"),
                     "lat_us": float(lat["seconds"].median() * 1e6) if len(lat) else float("nan"),
                     "slow": False})
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


NODE_COLUMNS = ["host", "pairs", "slow_pairs", "bw_GBps_median", "bw_GBps_min", "others_GBps_median", "verdict"]


def attribute(pairs: pd.DataFrame) -> Tuple[pd.DataFrame, pd.DataFrame, List[dict]]:
    """Per node (inter-node pairs; per rank inside a node when one node was
    measured): its pairs' median bandwidth against the median of the pairs
    it is not in, and a verdict; the pairs with their ``slow`` flag; and the
    findings (slow nodes, slow links), each with its evidence and a next
    step."""
    pairs = pairs.copy()
    inter = pairs["scope"] == "inter-node"
    if inter.any():
        df = pairs[inter].assign(ua=lambda d: d["host_a"], ub=lambda d: d["host_b"])
        table, findings, slow = _attribute(df, "node", _NODE_ADVICE, _LINK_ADVICE)
        pairs.loc[inter, "slow"] = slow
        intra = pairs[~inter]
        if len(intra) >= 3:        # inside the nodes: each pair against the intra-node median
            pairs.loc[~inter, "slow"] = intra["bw_GBps_p75"] < SLOW * float(intra["bw_GBps"].median())
            for p in pairs[~inter & pairs["slow"]].itertuples():
                findings.append({"finding": f"slow intra-node pair: ranks {p.a} <-> {p.b} on {p.host_a}",
                                 "evidence": f"{_bw(p.bw_GBps)} vs {_bw(float(intra['bw_GBps'].median()))} "
                                             f"median of the {len(intra)} intra-node pairs",
                                 "advice": _RANK_LINK_ADVICE.format(a=f"rank {p.a}", b=f"rank {p.b}")})
        return pairs, table, findings
    df = pairs.assign(ua=lambda d: "rank " + d["a"].astype(str) + " (" + d["host_a"] + ")",
                      ub=lambda d: "rank " + d["b"].astype(str) + " (" + d["host_b"] + ")")
    table, findings, slow = _attribute(df, "rank", _RANK_ADVICE, _RANK_LINK_ADVICE)
    pairs["slow"] = slow
    return pairs, table, findings


_NODE_ADVICE = ("check {u}'s NIC (negotiated rate, errors: ibstat / ethtool -S), its cable and switch port; drain "
                "{u} and rerun `commprof bench --pairs` to confirm")
_LINK_ADVICE = ("check the path between {a} and {b} (cables, switch ports, routing / adaptive routing); until "
                "fixed, keep the two out of one job")
_RANK_ADVICE = "check {u}'s device and its placement (nvidia-smi topo -m, PCIe / NVLink errors, NUMA binding)"
_RANK_LINK_ADVICE = "check the link between {a} and {b} (nvidia-smi topo -m, NVLink errors)"


def slow_members(sets: Sequence[Set], bw: np.ndarray, p75: np.ndarray):
    """The attribution rule of the pairs bench and of a trace's inter-node
    groups (analyzers/slowlinks.py). Members (nodes or ranks) first: one is
    slow when more than half (>= 2) of the sets it is in have an upper
    quartile below ``SLOW`` x the median of the sets without it (so a slow
    member cannot drag its own reference down, even among three). Then
    every set against the median of the sets of members that are not slow.
    Returns per member (member, sets, slow sets, own median, own minimum,
    the others' median, slow), the healthy-set mask, that reference median
    and the slow-set mask."""
    bw, p75 = np.asarray(bw, np.float64), np.asarray(p75, np.float64)
    per, slow_units = [], set()
    for u in sorted(set().union(*sets)) if len(sets) else []:
        mine = np.array([u in s for s in sets], bool)
        others = float(pd.Series(bw[~mine]).median()) if (~mine).any() else float("nan")
        n_slow = int((p75[mine] < SLOW * others).sum()) if np.isfinite(others) else 0
        slow = bool(mine.sum() >= 2 and n_slow * 2 > mine.sum())
        if slow:
            slow_units.add(u)
        own = pd.Series(bw[mine])
        per.append((u, int(mine.sum()), n_slow, float(own.median()), float(own.min()), others, slow))
    healthy = np.array([not (s & slow_units) for s in sets], bool)
    ref = float(pd.Series(bw[healthy] if healthy.any() else bw).median())
    return per, healthy, ref, p75 < SLOW * ref


def _attribute(df: pd.DataFrame, unit: str, unit_advice: str, link_advice: str):
    """Slow units (nodes or ranks) and slow pairs by :func:`slow_members`."""
    units = sorted(set(df["ua"]) | set(df["ub"]))
    per, healthy_arr, ref, slow_arr = slow_members([{a, b} for a, b in zip(df["ua"], df["ub"])],
                                                   df["bw_GBps"].to_numpy(), df["bw_GBps_p75"].to_numpy())
    slow_units = [u for u, *_x, slow in per if slow]
    table = pd.DataFrame([{"host": u, "pairs": n, "slow_pairs": k, "bw_GBps_median": med, "bw_GBps_min": low,
                           "others_GBps_median": others, "verdict": f"slow {unit}" if slow else "normal"}
                          for u, n, k, med, low, others, slow in per], columns=NODE_COLUMNS)
    healthy = pd.Series(healthy_arr, index=df.index)
    slow_pair = pd.Series(slow_arr, index=df.index) & (len(df) >= 3)
    findings = []
    for u in slow_units:
        r = table[table["host"] == u].iloc[0]
        rest = df[(df["ua"] != u) & (df["ub"] != u)]
        findings.append({
            "finding": f"slow {unit}: {u}",
            "evidence": (f"{u} <-> any: {_bw(r['bw_GBps_median'])} median over its {r['pairs']} pairs "
                         f"({r['slow_pairs']} below {SLOW:.0%} of the others), vs {_bw(r['others_GBps_median'])} "
                         f"between the other {unit}s ({len(rest)} pairs): {u}'s own link, not the "
                         f"{'network' if unit == 'node' else 'fabric'} between the others"),
            "advice": unit_advice.format(u=u)})
    for p in df[slow_pair & healthy].itertuples():
        findings.append({
            "finding": f"slow link: {p.ua} <-> {p.ub}",
            "evidence": (f"{_bw(p.bw_GBps)} (quartiles {_bw(p.bw_GBps_p25)}-{_bw(p.bw_GBps_p75)}) vs {_bw(ref)} "
                         f"median of the pairs between normal {unit}s; both {unit}s' other links normal: the path "
                         f"between them, not either {unit}"),
            "advice": link_advice.format(a=p.ua, b=p.ub)})
    if len(units) == 2:
        findings.append({"finding": f"two {unit}s: not attributable",
                         "evidence": f"one {unit} pair ({_bw(ref)}), nothing to compare it with",
                         "advice": f"measure with a third {unit}: `commprof bench --pairs` over 3 or more"})
    elif len(units) > 2 and not findings:
        findings.append({"finding": f"no slow {unit} or link",
                         "evidence": (f"{len(df)} {unit} pairs, median {_bw(ref)}; no pair's upper quartile "
                                      f"below {SLOW:.0%} of it"),
                         "advice": ""})
    return table, findings, slow_pair.to_numpy()


SAMPLE_COLUMNS = ["round", "a", "b", "host_a", "host_b", "kind", "iteration", "bytes", "seconds"]


def samples_from_events(ev: pd.DataFrame, hosts: Dict[int, str]) -> pd.DataFrame:
    """The samples of a pairs bench from its trace (``commprof bench --pairs
    -o DIR``): one event per rank and exchange (step = round, group ``pair
    A-B``, detail bw / lat, seq = iteration); per exchange the slower side,
    as the bench itself takes it."""
    c = ev[ev["group"].astype(str).str.startswith("pair ")]
    if c.empty:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    d = pd.DataFrame({"round": c["step"].to_numpy(np.int64), "group": c["group"].astype(str).to_numpy(),
                      "kind": c["detail"].astype(str).to_numpy(), "iteration": c["seq"].to_numpy(np.int64),
                      "bytes": c["bytes"].to_numpy(np.int64),
                      "seconds": (c["t_end"].to_numpy(np.int64) - c["t_start"].to_numpy(np.int64)) / 1e9})
    d = d.groupby(["round", "group", "kind", "iteration"], as_index=False).agg(bytes=("bytes", "max"),
                                                                              seconds=("seconds", "max"))
    ab = d["group"].str.slice(5).str.split("-", expand=True).astype(np.int64)
    d["a"], d["b"] = ab[0], ab[1]
    d["host_a"] = [hosts.get(int(r), "?") for r in d["a"]]
    d["host_b"] = [hosts.get(int(r), "?") for r in d["b"]]
    return d[SAMPLE_COLUMNS].sort_values(["round", "a", "b", "kind", "iteration"], ignore_index=True)


def matrix(pairs: pd.DataFrame) -> pd.DataFrame:
    """Node x node median bandwidth (GB/s each way) of the inter-node pairs;
    rank x rank where only one node was measured."""
    inter = pairs[pairs["scope"] == "inter-node"]
    if len(inter):
        ua, ub = inter["host_a"].astype(str), inter["host_b"].astype(str)
    else:
        inter = pairs
        ua, ub = "rank " + inter["a"].astype(str), "rank " + inter["b"].astype(str)
    units = sorted(set(ua) | set(ub), key=lambda x: (len(x), x))
    m = pd.DataFrame(np.nan, index=units, columns=units)
    for x, y, v in zip(ua, ub, inter["bw_GBps"]):
        m.loc[x, y] = m.loc[y, x] = v
    m.index.name = "host"
    return m.reset_index()


def _bw(gbps: float) -> str:
    if not np.isfinite(gbps):
        return "-"
    return f"{gbps:.3g} GB/s" if gbps >= 1 else f"{gbps * 1e3:.3g} MB/s"
