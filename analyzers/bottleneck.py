"""Bottleneck report: which category bounds each configuration at each GPU
count, the evidence, and what a practitioner would try.

Rules (thresholds are shares of step time unless said otherwise):
- data-bound when exposed data wait >= 10 %: more DataLoader workers,
  pinned memory and prefetch, or DALI (GPU decoding); a DALI run that is
  still data-bound points at storage / the input pipeline itself;
- communication-bound when exposed communication >= 20 %; then
  * many small collectives (>= 8 calls per step with a median of < 1 MiB):
    raise DDP ``bucket_cap_mb`` / Horovod's fusion threshold;
  * low overlap (< 50 % of communication time runs under compute): DDP
    overlaps only within backward — check ``find_unused_parameters``,
    ``static_graph=True``, ``gradient_as_bucket_view=True``; for ZeRO,
    ``overlap_comm``;
  * large arrival skew (peers wait > 30 % of collective time): fix the
    imbalance first (see stragglers);
  * otherwise bandwidth-bound: fewer bytes (bf16/fp16 gradients, gradient
    compression hooks), a larger per-rank batch, or for DeepSpeed a lower
    ZeRO stage if memory allows;
- compute-bound when compute >= 60 %: scaling is efficient; speed up the
  model itself (AMP, channels_last, cuDNN benchmark mode, larger batch);
- "other" >= 20 %: time outside any recorded region (Python glue,
  logging, host-device syncs): profile the loop body;
- a broadcast every step costing >= 2 % of the median step after all
  ranks arrived (DDP's ``broadcast_buffers=True`` re-sends BatchNorm
  statistics from rank 0 before every forward):
  ``broadcast_buffers=False`` where ranks may keep their own statistics;
- persistent stragglers are always reported.
Trends: for each configuration, how each share changes from the smallest
to the largest GPU count.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from . import evidence as ev

DATA_BOUND, COMM_BOUND, COMPUTE_BOUND, OTHER_BOUND = 10.0, 20.0, 60.0, 20.0
STEP_BROADCAST = 2.0  # % of the median step


def _runs(r) -> int:
    """Runs behind a breakdown row (the collectives table has a row per run)."""
    return max(1, int(r.get("runs", 1) or 1))


def _step_broadcast(r, colls: pd.DataFrame, sk) -> Optional[dict]:
    """A finding for a Python-issued broadcast every step (DDP's buffer
    sync), costed by its transfer time (after the last rank arrived: the
    wait for late ranks would move elsewhere without it), or None."""
    if not len(colls):
        return None
    if _framework(r) not in ("ddp", ""):
        return None     # DDP's buffer broadcast: not in a job without DDP
    b = colls[(colls["config"] == r["config"]) & (colls["gpus"] == r["gpus"]) & (colls["op"] == "broadcast")
              & (colls["source"] == "torch.distributed")]
    per_step = float(b["calls_per_step"].sum()) / _runs(r) if len(b) else 0.0
    step_ms = r.get("step_ms_median", np.nan)
    if per_step < 0.9 or pd.isna(step_ms) or step_ms <= 0:
        return None
    lat = float(np.average(b["lat_ms_mean"], weights=b["calls"]))
    each = lat
    if sk is not None and len(sk) and (sk["op"] == "broadcast").any():
        each = min(lat, max(0.0, float(sk.loc[sk["op"] == "broadcast", "transfer_ms_mean"].mean())))
    cost = per_step * each
    share = 100.0 * cost / step_ms
    if share < STEP_BROADCAST:
        return None
    nbytes = float(np.average(b["bytes_per_call"], weights=b["calls"]))
    return {"finding": "a broadcast every step (DDP broadcast_buffers)",
            "evidence": f"{per_step:.1f} broadcasts/step of {nbytes:,.0f} B cost {cost:.2f} ms per step after "
                        f"all ranks arrived ({share:.1f} % of the median step, {step_ms:.2f} ms)",
            "advice": "DDP(..., broadcast_buffers=False) if each rank may keep its own BatchNorm statistics "
                      "(broadcast them once before evaluating or saving); SyncBatchNorm where they must be "
                      "global; for a broadcast of your own, issue it less often"}


def _fmt_pct(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.1f} %"


def _share(r, cat: str) -> str:
    """A share with its 95 % interval over steps ("12.3 % (95 %: 10.1-14.5
    over 29 steps)")."""
    v, lo, hi = r.get(f"{cat}_pct"), r.get(f"{cat}_pct_lo"), r.get(f"{cat}_pct_hi")
    if lo is None or pd.isna(lo) or pd.isna(hi):
        return _fmt_pct(v)
    n = r.get("share_steps")
    steps = f" over {int(n)} steps" if n is not None and not pd.isna(n) else ""
    return f"{_fmt_pct(v)} (95 %: {lo:.1f}-{hi:.1f}{steps})"


def _claim(r, cat: str, threshold: float) -> Optional[str]:
    """None below the threshold; the suffix of the finding above it
    ("" when the interval clears it, " (near the threshold)" otherwise)."""
    c = ev.share_claim(r[f"{cat}_pct"], r.get(f"{cat}_pct_lo", np.nan), r.get(f"{cat}_pct_hi", np.nan), threshold)
    if c is None:
        return None
    return "" if c == "above" else f" (near the {threshold:.0f} % threshold)"


def _straggler_rows(base: dict, bound: str, st: Optional[pd.DataFrame], ranks: int) -> List[dict]:
    """Accused ranks with their test, or one line saying what was tested
    and that the data show no straggler (or too few steps to tell)."""
    if st is None or not len(st):
        return []
    rows = []
    for _, s in st[st["verdict"] == "straggler"].iterrows():
        rows.append({**base, "bound": bound, "finding": f"straggler: rank {int(s['rank'])} ({s['metric']})",
                     "evidence": _straggler_evidence(s, ranks),
                     "advice": "check that rank's host (thermal/clock throttling, noisy neighbours, "
                               "slower storage or data shard), its data pipeline and its GPU"})
    if rows:
        return rows
    work = st[st["metric"] == "work"]
    if not len(work):
        return []
    s = work.iloc[0]
    if s["verdict"] == "too few steps":
        return [{**base, "bound": "evidence", "finding": "stragglers: too few steps to tell",
                 "evidence": f"{int(s['steps'])} measured steps; with {ranks} ranks a rank slower than the "
                             f"others in every step is told from chance only after {int(s['needed'])} steps",
                 "advice": f"record at least {int(s['needed'])} steps after the warm-up"}]
    arr = st[st["metric"] == "arrival"]
    more = ""
    if len(arr):
        a = arr.iloc[0]
        more = (f"; last to arrive most often: rank {int(a['rank'])}, in {int(a['late_steps'])} of "
                f"{int(a['steps'])} steps (p = {ev.format_p(a['p'])})")
    return [{**base, "bound": "evidence", "finding": "no straggler",
             "evidence": f"most suspect in work: rank {int(s['rank'])}, above the median of the other ranks in "
                         f"{int(s['late_steps'])} of {int(s['steps'])} steps by {s['excess_ms']:.2f} ms "
                         f"(median; 95 %: {s['excess_lo_ms']:.2f} to {s['excess_hi_ms']:.2f}); "
                         f"p = {ev.format_p(s['p'])} corrected over {ranks} ranks: consistent with chance{more}",
             "advice": "no rank to fix: the slowest rank changes from step to step (jitter); "
                       "fewer host-side stalls (data, Python) even out the ranks"}]


def _straggler_evidence(s, ranks: int) -> str:
    if s["metric"] == "arrival":
        return (f"arrived last at the collectives in {int(s['late_steps'])} of {int(s['steps'])} steps "
                f"(chance {100 / ranks:.0f} % each; p = {ev.format_p(s['p'])} corrected over {ranks} ranks); "
                f"mean lateness {s['value_ms']:.2f} ms vs the others' median {s['median_ms']:.2f} ms")
    return (f"above the median of the other ranks in {int(s['late_steps'])} of {int(s['steps'])} steps (sign test p = "
            f"{ev.format_p(s['p'])} corrected over {ranks} ranks) by {s['excess_ms']:.2f} ms (median; 95 %: "
            f"{s['excess_lo_ms']:.2f} to {s['excess_hi_ms']:.2f}), +{s['excess_pct']:.0f} % "
            f"({s['value_ms']:.2f} vs the others' median {s['median_ms']:.2f} ms)")


_CAT = {"data": "data", "communication": "comm", "compute": "compute", "other": "other"}

#: parallel efficiency (%) above which a compute-bound configuration "scales well"
SCALES_WELL = 90.0


def findings(breakdown: pd.DataFrame, colls: pd.DataFrame, skew: Dict[tuple, pd.DataFrame],
             straggler: Dict[tuple, pd.DataFrame], sharded: Optional[Dict[tuple, dict]] = None) -> pd.DataFrame:
    """One row per finding: config, gpus, bound, finding, evidence, advice.
    Per row of the breakdown: data, communication (FSDP's own where the
    run is sharded: ``sharded``, analyzers/fsdp.py's summary per
    configuration and GPU count), a per-step broadcast, compute, time
    outside regions, stragglers; "X dominates" when none applies; then the
    trends across GPU counts."""
    from .fsdp import findings as fsdp_rows

    rows: List[dict] = []
    sharded = sharded or {}
    for _, r in breakdown.iterrows():
        key = (r["config"], r["gpus"])
        base = {"config": r["config"], "gpus": int(r["gpus"])}
        shares = {"data": r["data_pct"], "communication": r["comm_pct"], "compute": r["compute_pct"],
                  "other": r["other_pct"]}
        bound = max(shares, key=lambda k: -1 if pd.isna(shares[k]) else shares[k])
        ev_shares = (f"step time: comm {_fmt_pct(r['comm_pct'])}, data {_fmt_pct(r['data_pct'])}, "
                     f"compute {_fmt_pct(r['compute_pct'])}, other {_fmt_pct(r['other_pct'])}")
        comm = fsdp_rows(r, sharded[key], _claim(r, "comm", COMM_BOUND), _share(r, "comm")) \
            if key in sharded else _comm_rows(r, colls, skew.get(key))
        found = _data_rows(r, ev_shares) + comm
        bc = _step_broadcast(r, colls, skew.get(key))
        if bc is not None:
            found.append(bc)
        found += _compute_rows(r, breakdown, ev_shares)
        claim = _claim(r, "other", OTHER_BOUND)
        if claim is not None:
            found.append({"finding": "time outside recorded regions" + claim,
                          "evidence": f"other {_share(r, 'other')}; {ev_shares}",
                          "advice": "profile the loop body: logging, .item()/host syncs, Python overheads"})
        rows += [{**base, "bound": bound, **f} for f in found]
        strag = _straggler_rows(base, bound, straggler.get(key), int(r["gpus"]))
        rows += [x for x in strag if x["bound"] != "evidence"]
        if not any(x["config"] == r["config"] and x["gpus"] == r["gpus"] for x in rows):
            rows.append({**base, "bound": bound, "finding": f"{bound} dominates",
                         "evidence": f"{bound} {_share(r, _CAT[bound])}; {ev_shares}",
                         "advice": "no single bottleneck above the thresholds"})
        rows += [x for x in strag if x["bound"] == "evidence"]
    rows += trends(breakdown)
    return pd.DataFrame(rows, columns=["config", "gpus", "bound", "finding", "evidence", "advice"])


def _data_rows(r, ev_shares: str) -> List[dict]:
    """Data loading stalls training (the advice by loader)."""
    claim = _claim(r, "data", DATA_BOUND)
    if claim is None:
        return []
    if str(r.get("loader") or "") == "dali":
        advice = ("the DALI pipeline itself cannot keep up: more DALI threads, prefetch queue depth, "
                  "faster storage or pre-resized data")
    else:
        w = r.get("loader_workers")
        wtxt = f" (now {int(w)})" if w is not None and not pd.isna(w) else ""
        advice = (f"more DataLoader workers{wtxt}, pin_memory=True, persistent_workers, a larger "
                  "prefetch_factor; or NVIDIA DALI to decode and augment on the GPU")
    return [{"finding": "data loading stalls training" + claim,
             "evidence": f"data wait {_share(r, 'data')}; {ev_shares}", "advice": advice}]


def _comm_rows(r, colls: pd.DataFrame, sk: Optional[pd.DataFrame]) -> List[dict]:
    """Communication-bound, and why: many small collectives, no overlap,
    waiting for late peers."""
    claim = _claim(r, "comm", COMM_BOUND)
    if claim is None:
        return []
    c = colls[(colls["config"] == r["config"]) & (colls["gpus"] == r["gpus"])] if len(colls) else colls
    calls_per_step = float(c["calls_per_step"].sum()) / _runs(r) if len(c) else 0.0
    med_bytes = (float(np.average(c["bytes_per_call"], weights=c["calls"]))
                 if len(c) and c["calls"].sum() else 0.0)
    overlap = r.get("overlap_pct", np.nan)
    wait = float(np.nanmax(sk["wait_pct"])) if sk is not None and len(sk) else np.nan
    evidence = (f"exposed comm {_share(r, 'comm')} of step time, overlap "
                f"{_fmt_pct(overlap)}, {calls_per_step:.1f} collectives/step averaging "
                f"{med_bytes / 2**20:.2f} MiB")
    out = []
    fw = _framework(r)
    if calls_per_step >= 8 and med_bytes < 2**20:
        out.append({"finding": "many small collectives", "evidence": evidence,
                    "advice": "fuse them: " + _by_framework(fw, {
                        "ddp": "raise DDP bucket_cap_mb (default 25)",
                        "horovod": "raise HOROVOD_FUSION_THRESHOLD",
                        "deepspeed": "raise DeepSpeed's reduce_bucket_size / allgather_bucket_size"})
                    + "; avoid per-parameter collectives"})
    if not pd.isna(overlap) and overlap < 50:
        out.append({"finding": "communication is not hidden behind compute", "evidence": evidence,
                    "advice": "overlap gradient reduction with backward: " + _by_framework(fw, {
                        "ddp": "DDP with static_graph=True and gradient_as_bucket_view=True, avoid "
                               "find_unused_parameters",
                        "deepspeed": "DeepSpeed overlap_comm=true",
                        "horovod": "Horovod backward_passes_per_step"})})
    if not pd.isna(wait) and wait > 30:
        out.append({"finding": "ranks wait for late peers in collectives",
                    "evidence": f"{evidence}; {wait:.0f} % of collective time is arrival skew",
                    "advice": "fix the imbalance before tuning the network (see stragglers)"})
    out.append({"finding": "communication-bound" + claim, "evidence": evidence,
                "advice": "send fewer bytes (fp16/bf16 gradients" + (" or a compression comm hook"
                                                                     if fw in ("ddp", "") else "")
                          + "), a larger per-rank batch, hierarchical/NCCL tuning"
                          + ("; DeepSpeed: the lowest ZeRO stage that fits in memory" if fw in ("deepspeed", "")
                             else "")})
    return out


def _framework(r) -> str:
    """The breakdown row's framework ("" where not known)."""
    fw = r.get("framework")
    return "" if fw is None or (isinstance(fw, float) and pd.isna(fw)) or fw == "none" else str(fw)


def _by_framework(fw: str, advice: Dict[str, str]) -> str:
    """The advice for this framework; every framework's where it is not
    known (never another framework's where it is)."""
    if fw in advice:
        return advice[fw]
    if fw:
        return "the framework's bucketing / fusion of gradients"
    return "; ".join(advice.values())


def _compute_rows(r, breakdown: pd.DataFrame, ev_shares: str) -> List[dict]:
    """Compute-bound; "scales well" only from a scaling measurement (>= 2
    GPU counts of the configuration and the efficiency at this one)."""
    claim = _claim(r, "compute", COMPUTE_BOUND)
    if claim is None:
        return []
    ev_compute = f"compute {_share(r, 'compute')}; {ev_shares}"
    mine = breakdown[breakdown["config"] == r["config"]]["gpus"]
    counts = mine.nunique()
    eff = r.get("efficiency_pct")
    if counts >= 2 and r["gpus"] > mine.min() and eff is not None and not pd.isna(eff):
        word = "compute-bound (scales well)" if eff >= SCALES_WELL else "compute-bound"
        text = f"{ev_compute}; parallel efficiency {eff:.0f} % (speedup {r.get('speedup', float('nan')):.2f})"
    else:
        word, text = "compute-bound", ev_compute + ("; one GPU count measured: nothing is known about "
                                                     "scaling" if counts < 2 else "")
    return [{"finding": word + claim, "evidence": text,
             "advice": "speed up the model itself: mixed precision, channels_last, cuDNN "
                       "benchmark mode, a larger batch per GPU"}]


def node_findings(node_tables: Dict[tuple, pd.DataFrame], mismatches: Dict[tuple, pd.DataFrame],
                  breakdown: pd.DataFrame, link_tables: Optional[Dict[tuple, pd.DataFrame]] = None) -> pd.DataFrame:
    """A slow node, in compute (its ranks' work per step, analyzers/nodes.py)
    or in communication (its groups' transfers, analyzers/slowlinks.py), a
    slow link; collectives the ranks disagree on."""
    from .nodes import slow_host
    from .slowlinks import attribute, pairs_command

    rows = []
    for (config, gpus), t in node_tables.items():
        slow = slow_host(t)
        if slow is not None:
            rows.append({"config": config, "gpus": int(gpus), "bound": "node",
                         "finding": f"slow node in compute: {slow['host']} (ranks {slow['ranks']})",
                         "evidence": slow["evidence"],
                         "advice": "check that node: its GPUs and CPUs (throttling, other jobs), its data path; "
                                   "exclude it from the allocation to confirm"})
    for (config, gpus), t in (link_tables or {}).items():
        _groups, _nodes, found = attribute(t)
        hosts = node_tables.get((config, gpus))
        for f in found:
            if f["kind"] == "untold":
                share = breakdown[(breakdown["config"] == config) & (breakdown["gpus"] == gpus)]["comm_pct"]
                if not len(share) or not float(share.max()) >= COMM_BOUND:
                    continue       # communication is not what limits the run: nothing to localise
                ppn = _ranks_per_node(hosts)
                f = dict(f, evidence=f"{f['evidence']}; communication {float(share.max()):.1f} % of step time",
                         advice=f"measure every node pair alone: `{pairs_command(list(hosts['host']), ppn)}`"
                         if hosts is not None else "measure every node pair alone: `commprof bench --pairs`")
            rows.append({"config": config, "gpus": int(gpus), "bound": "node", "finding": f["finding"],
                         "evidence": f["evidence"], "advice": f["advice"]})
    for (config, gpus), t in mismatches.items():
        first = t.iloc[0]
        rows.append({"config": config, "gpus": int(gpus), "bound": "correctness",
                     "finding": f"collective mismatch: {first['kind']} at {first['group']} #{first['seq']}",
                     "evidence": f"{first['op']}: {first['detail']}; {len(t)} such instance(s)",
                     "advice": "the ranks' collective sequences diverged (a rank skipped or added a collective, "
                               "or shapes differ by rank): such jobs hang or reduce the wrong tensors; "
                               "make every rank issue the same collectives in the same order"})
    return pd.DataFrame(rows, columns=["config", "gpus", "bound", "finding", "evidence", "advice"])


def _count_ranks(spec: str) -> int:
    """How many ranks a range list ("0-3,8") names."""
    n = 0
    for part in str(spec).split(","):
        a, _, b = part.partition("-")
        n += (int(b) - int(a) + 1) if b else 1
    return n


def _ranks_per_node(hosts: Optional[pd.DataFrame]) -> int:
    """The most ranks on one host of a per-node table."""
    if hosts is None or not len(hosts):
        return 1
    try:
        return max(_count_ranks(r) for r in hosts["ranks"])
    except ValueError:
        return 1


def _pm(r, col: str) -> str:
    """"12.3 % (±1.1)": a share and the half-width of its 95 % interval."""
    lo, hi = r.get(f"{col}_lo", np.nan), r.get(f"{col}_hi", np.nan)
    if lo is None or pd.isna(lo) or pd.isna(hi):
        return f"{r[col]:.1f} %"
    return f"{r[col]:.1f} % (±{(hi - lo) / 2:.1f})"


def _direction(a, b, col: str) -> str:
    """grows / falls, or "does not change measurably" when the two 95 %
    intervals overlap."""
    alo, ahi, blo, bhi = (a.get(f"{col}_lo", np.nan), a.get(f"{col}_hi", np.nan),
                          b.get(f"{col}_lo", np.nan), b.get(f"{col}_hi", np.nan))
    if not any(pd.isna(x) for x in (alo, ahi, blo, bhi)) and blo <= ahi and alo <= bhi:
        return "does not change measurably (intervals overlap)"
    return "grows" if b[col] > a[col] else "falls"


def trends(breakdown: pd.DataFrame) -> List[dict]:
    out = []
    for config, g in breakdown.groupby("config"):
        g = g.sort_values("gpus")
        if len(g) < 2:
            continue
        a, b = g.iloc[0], g.iloc[-1]
        parts = []
        for col, name in (("comm_pct", "communication"), ("data_pct", "data loading"),
                          ("compute_pct", "compute")):
            parts.append(f"{name} share {_direction(a, b, col)} from {_pm(a, col)} at "
                         f"{int(a['gpus'])} to {_pm(b, col)} at {int(b['gpus'])} GPUs")
        eff = b.get("efficiency_pct")
        if eff is not None and not pd.isna(eff):
            parts.append(f"parallel efficiency {eff:.0f} % at {int(b['gpus'])} GPUs")
        out.append({"config": config, "gpus": int(b["gpus"]), "bound": "trend", "finding": "scaling trend",
                    "evidence": "; ".join(parts), "advice": ""})
    return out
