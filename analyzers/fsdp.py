"""Sharded data parallel (FSDP2, FSDP1): per layer, its gathers and
reduce-scatters, how long each took and how much of that the rank waited.

Input: the fine grain's events (analyzers/buckets.py: the sampled steps'
compute, comm, data and wait rows) of collectives FSDP issued (source
``fsdp``, detail ``"<phase> <layer>"``, see commprof/record/instruments/fsdp.py).

*Busy* (a layer's gather ms, reduce ms) is the union of the intervals of its
collectives of that kind and of the waits for them, per step.
*Exposed* is the breakdown's exposed communication (analyzers/breakdown.py),
split over the collectives that cause it: an instant of a step is exposed
communication when no data wait covers it and either the thread waits for a
collective (a synchronous call, FSDP's unshard wait) or a collective is in
flight while no compute runs. Each exposed instant goes to one collective:
the one the thread waits for (the latest issued of them), else the latest
issued in flight. So the layers' exposed times add up to the breakdown's
exposed comm of FSDP's collectives, and an asynchronous gather hidden under
the previous layer's compute (prefetch) shows an exposed time of about 0.
A wait for an asynchronous gather counts for that gather.

Phases group into *forward gathers* (``forward``, ``forward_prefetch``,
``unshard``), *backward re-gathers* (``backward``, ``backward_prefetch``)
and *reductions* (``reduce``: reduce-scatter, HSDP's all-reduce).
*After backward* is the part of a reduction that runs after the step's
backward has returned (what delays the optimizer). *Step end waits for*:
the share of (rank, step) pairs whose last exposed communication instant
belongs to this layer's collective of that kind: the critical path's last
link. Pure: pandas in, tables out."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import pandas as pd

#: the sources of sharded data parallel's collectives: FSDP's, ZeRO-3's
SOURCES = ("fsdp", "zero3")
#: phase (the detail's first word) -> kind
KIND = {"forward": "gather", "forward_prefetch": "gather", "unshard": "gather",
        "backward": "regather", "backward_prefetch": "regather", "reduce": "reduce"}
PREFETCH = ("forward_prefetch", "backward_prefetch")
ROW_COLUMNS = ["rank", "step", "layer", "phase", "op", "calls", "bytes", "busy_ns", "exposed_ns",
               "after_bwd_ns", "last", "first_ns"]
#: the fine grain of at most this many ranks is read (the first ones)
MAX_RANKS = 64

_DATA, _COMPUTE, _BLOCK, _ASYNC = 0, 1, 2, 3


def is_sharded(ev: pd.DataFrame) -> bool:
    """Whether any of these events is one of FSDP's collectives."""
    return bool(len(ev)) and bool(ev["source"].astype(str).isin(SOURCES).any())


def rank_rows(ev: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step, layer, phase, op): calls, bytes, busy, exposed and
    after-backward ns, ``last`` (1 where the step's last exposed instant is
    this one's), ``first_ns`` (first issue after the step's start).
    ``ev``: fine-grain events; ``steps``: the sampled steps (rank, step,
    s0, s1: start and end, analyzers/buckets.py)."""
    src = ev["source"].astype(str).to_numpy()
    if not np.isin(src, SOURCES).any():
        return pd.DataFrame(columns=ROW_COLUMNS)
    ranks = np.unique(ev["rank"].to_numpy())[:MAX_RANKS]
    out: List[dict] = []
    for r in ranks:
        er = ev[ev["rank"].to_numpy() == r]
        sr = steps[steps["rank"].to_numpy() == r]
        out.extend(_one_rank(int(r), er, sr))
    if not out:
        return pd.DataFrame(columns=ROW_COLUMNS)
    rows = pd.DataFrame(out)
    return rows.groupby(["rank", "step", "layer", "phase", "op"], as_index=False, sort=False).agg(
        calls=("calls", "sum"), bytes=("bytes", "sum"), busy_ns=("busy_ns", "sum"),
        exposed_ns=("exposed_ns", "sum"), after_bwd_ns=("after_bwd_ns", "sum"), last=("last", "max"),
        first_ns=("first_ns", "min"))[ROW_COLUMNS]


def _one_rank(rank: int, er: pd.DataFrame, sr: pd.DataFrame) -> List[dict]:
    cat = er["category"].astype(str).to_numpy()
    src = er["source"].astype(str).to_numpy()
    t0 = er["t_start"].to_numpy(np.int64)
    t1 = np.maximum(er["t_end"].to_numpy(np.int64), t0)
    blocking = er["blocking"].fillna(True).to_numpy(bool) if "blocking" in er else np.ones(len(er), bool)
    kind = np.full(len(er), -1)
    kind[cat == "data"] = _DATA
    kind[cat == "compute"] = _COMPUTE
    kind[(cat == "wait") | ((cat == "comm") & blocking)] = _BLOCK
    kind[(cat == "comm") & ~blocking] = _ASYNC
    use = kind >= 0
    if not use.any():
        return []
    bounds = np.unique(np.concatenate([t0[use], t1[use]]))
    nseg = len(bounds) - 1
    if nseg <= 0:
        return []
    cover = np.zeros((4, nseg + 1), np.int64)
    for k in range(4):
        m = kind == k
        np.add.at(cover[k], np.searchsorted(bounds, t0[m]), 1)
        np.add.at(cover[k], np.searchsorted(bounds, t1[m]), -1)
    on = np.cumsum(cover, axis=1)[:, :nseg] > 0
    exposed = ~on[_DATA] & (on[_BLOCK] | (~on[_COMPUTE] & on[_ASYNC]))
    seglen = np.diff(bounds)
    # the owner of each segment: the latest issued collective the thread waits
    # for, else the latest issued in flight (comm rows of every source, so that
    # another framework's collective keeps its own instants)
    owner = np.full(nseg, -1, np.int64)
    comm_rows = np.flatnonzero((kind == _BLOCK) | (kind == _ASYNC))
    s_idx = np.searchsorted(bounds, t0)
    e_idx = np.searchsorted(bounds, t1)
    for pri in (_ASYNC, _BLOCK):
        for i in comm_rows[np.argsort(t0[comm_rows], kind="stable")]:
            if kind[i] == pri:
                owner[s_idx[i]:e_idx[i]] = i
    exp_owner = np.where(exposed, owner, -1)
    per_event = np.zeros(len(er), np.int64)
    m = exp_owner >= 0
    np.add.at(per_event, exp_owner[m], seglen[m])
    # the steps: which segment is each step's last exposed one, backward ends
    st0 = sr["s0"].to_numpy(np.int64)
    st1 = sr["s1"].to_numpy(np.int64)
    snum = sr["step"].to_numpy(np.int64)
    step_of_row = er["step"].to_numpy(np.int64)
    last_rows = set()
    exp_at = np.flatnonzero(m)
    for a, b in zip(st0, st1):
        lo, hi = np.searchsorted(bounds[exp_at], a, "left"), np.searchsorted(bounds[exp_at], b, "left")
        if hi > lo:
            last_rows.add(int(exp_owner[exp_at[hi - 1]]))
    bwd = (cat == "compute") & (er["name"].astype(str).to_numpy() == "backward")
    bwd_end: Dict[int, int] = {}
    for s, e in zip(step_of_row[bwd], t1[bwd]):
        bwd_end[int(s)] = max(bwd_end.get(int(s), 0), int(e))
    start_of = dict(zip(snum.tolist(), st0.tolist()))
    names = er["name"].astype(str).to_numpy()
    details = er["detail"].astype(str).to_numpy()
    nbytes = er["bytes"].to_numpy(np.float64) if "bytes" in er else np.zeros(len(er))
    out = []
    for i in np.flatnonzero(np.isin(src, SOURCES)):
        if kind[i] not in (_BLOCK, _ASYNC):
            continue
        phase, _, layer = details[i].partition(" ")
        if phase not in KIND:
            continue
        s = int(step_of_row[i])
        be = bwd_end.get(s)
        after = max(0, int(t1[i]) - max(int(t0[i]), be)) if be is not None and phase == "reduce" else 0
        is_wait = cat[i] == "wait"
        out.append({"rank": rank, "step": s, "layer": layer or "?", "phase": phase,
                    "op": "wait" if is_wait else names[i], "calls": 0 if is_wait else 1,
                    "bytes": 0.0 if is_wait or np.isnan(nbytes[i]) else float(nbytes[i]),
                    "busy_ns": 0, "exposed_ns": int(per_event[i]),
                    "after_bwd_ns": after, "last": int(i in last_rows),
                    "first_ns": int(t0[i] - start_of.get(s, int(t0[i]))), "_t": (int(t0[i]), int(t1[i]))})
    # busy: per (step, layer, kind) the union of its collectives' and waits'
    # intervals (a wait may outlast the completion its collective's callback
    # saw), on the group's first row
    first: Dict[tuple, int] = {}
    spans: Dict[tuple, list] = {}
    for k, row in enumerate(out):
        key = (row["step"], row["layer"], KIND[row["phase"]])
        first.setdefault(key, k)
        spans.setdefault(key, []).append(row.pop("_t"))
    for key, iv in spans.items():
        iv.sort()
        total, cur0, cur1 = 0, iv[0][0], iv[0][1]
        for a, b in iv[1:]:
            if a > cur1:
                total += cur1 - cur0
                cur0, cur1 = a, b
            else:
                cur1 = max(cur1, b)
        out[first[key]]["busy_ns"] = total + cur1 - cur0
    return out


TABLE_COLUMNS = ["layer", "params MiB", "dtype", "gathers/step", "gather ms", "gather exposed ms",
                 "prefetched %", "regathers/step", "regather ms", "regather exposed ms", "regathers prefetched %",
                 "reduce op",
                 "reduce ms", "reduce exposed ms", "after backward ms", "step end waits %"]


def layer_table(rows: pd.DataFrame, groups: Optional[dict] = None) -> pd.DataFrame:
    """One row per layer (forward order): per measured (rank, step), the
    forward gathers' count, time and exposed time, the share issued ahead
    (prefetch), the backward re-gathers', the reductions' (and their part
    after backward), and how often the step's end waited last for one of
    this layer's collectives. ``groups``: the ranks' FSDP metadata
    (unpadded bytes, dtypes)."""
    if rows is None or rows.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    groups = groups or {}
    n = max(1, len(rows[["rank", "step"]].drop_duplicates()))
    rows = rows.assign(kind=rows["phase"].map(KIND))
    order = rows[rows["kind"] == "gather"].groupby("layer")["first_ns"].median()
    layers = list(order.sort_values().index) + sorted(set(rows["layer"]) - set(order.index))
    out = []
    for layer in layers:
        d = rows[rows["layer"] == layer]
        g, rg, rd = (d[d["kind"] == k] for k in ("gather", "regather", "reduce"))
        meta = groups.get(layer, {})
        gathers = g["calls"].sum()
        ops = sorted(set(rd[rd["calls"] > 0]["op"]))
        out.append({
            "layer": layer,
            "params MiB": (meta.get("bytes") / 2**20) if meta.get("bytes") else np.nan,
            "dtype": _dtypes(meta),
            "gathers/step": gathers / n,
            "gather ms": g["busy_ns"].sum() / n / 1e6,
            "gather exposed ms": g["exposed_ns"].sum() / n / 1e6,
            "prefetched %": 100.0 * g[g["phase"].isin(PREFETCH)]["calls"].sum() / max(1, gathers),
            "regathers/step": rg["calls"].sum() / n,
            "regather ms": rg["busy_ns"].sum() / n / 1e6,
            "regather exposed ms": rg["exposed_ns"].sum() / n / 1e6,
            "regathers prefetched %": 100.0 * rg[rg["phase"].isin(PREFETCH)]["calls"].sum()
            / max(1, rg["calls"].sum()) if len(rg) else np.nan,
            "reduce op": "+".join(ops) if ops else "-",
            "reduce ms": rd["busy_ns"].sum() / n / 1e6,
            "reduce exposed ms": rd["exposed_ns"].sum() / n / 1e6,
            "after backward ms": rd["after_bwd_ns"].sum() / n / 1e6,
            "step end waits %": 100.0 * _last_share(d, n),
        })
    return pd.DataFrame(out, columns=TABLE_COLUMNS)


def _last_share(d: pd.DataFrame, n: int) -> float:
    return float(d[d["last"] > 0][["rank", "step"]].drop_duplicates().shape[0]) / n


def _dtypes(meta: dict) -> str:
    p, r = meta.get("param_dtype") or "", meta.get("reduce_dtype") or ""
    if not p and not r:
        return ""
    return p if p == r else f"{p}/{r} reduce"


def summary(rows: pd.DataFrame, steps_ns: float, groups: Optional[dict] = None) -> Dict[str, object]:
    """What the findings read: per kind, time and exposed time per step (ns),
    the exposed share of the step (``steps_ns``: mean step time), calls
    per step, the gathers issued ahead, the groups' sizes and dtypes, the
    step end's most frequent last wait."""
    if rows is None or rows.empty:
        return {}
    n = max(1, len(rows[["rank", "step"]].drop_duplicates()))
    rows = rows.assign(kind=rows["phase"].map(KIND))
    by = rows.groupby("kind")
    res: Dict[str, object] = {"n": n}
    for k in ("gather", "regather", "reduce"):
        if k in by.groups:
            d = by.get_group(k)
            res[k] = {"calls": float(d["calls"].sum() / n), "busy_ns": float(d["busy_ns"].sum() / n),
                      "exposed_ns": float(d["exposed_ns"].sum() / n),
                      "exposed_pct": 100.0 * float(d["exposed_ns"].sum() / n) / steps_ns if steps_ns else 0.0,
                      "prefetched": float(d[d["phase"].isin(PREFETCH)]["calls"].sum() / n),
                      "after_bwd_ns": float(d["after_bwd_ns"].sum() / n)}
    last = rows[rows["last"] > 0].groupby(["layer", "kind"])[["rank", "step"]].apply(
        lambda x: len(x.drop_duplicates()))
    if len(last):
        (layer, kind), cnt = last.idxmax(), int(last.max())
        res["last"] = {"layer": layer, "kind": kind, "pct": 100.0 * cnt / n}
    res["groups"] = groups or {}
    return res


#: an FSDP collective kind's exposed time is a finding from this share of the step (%)
EXPOSED_FINDING = 5.0
#: wrapping: at least this many groups below this size are "many tiny groups"
TINY_GROUPS, TINY_BYTES = 8, 2**20
#: one group with at least this share of the parameters is "one huge group"
HUGE_SHARE = 0.5


def findings(r, summ: dict, claim: Optional[str], comm_share: str) -> List[dict]:
    """FSDP's own findings for a breakdown row ``r`` of a sharded run
    (``summ``: :func:`summary`; ``claim``: the comm-bound claim or None):
    exposed forward gathers (prefetch), backward re-gathers
    (reshard_after_forward), reductions (reduce_dtype), the wrapping
    granularity, the root's group, the step end's last wait. No DDP or
    Horovod advice."""
    out: List[dict] = []
    if str(summ.get("framework") or "") == "deepspeed":
        return _zero3_findings(summ, claim, comm_share)
    version = 1 if str(summ.get("framework") or "") == "fsdp1" else 2
    step_ms = float(r.get("step_ms_median") or 0.0)
    groups = summ.get("groups") or {}

    def ev(kind: str) -> str:
        k = summ.get(kind) or {}
        return (f"{k.get('calls', 0):.1f} {kind} collectives/step take {k.get('busy_ns', 0) / 1e6:.2f} ms, "
                f"{k.get('exposed_ns', 0) / 1e6:.2f} ms exposed ({k.get('exposed_pct', 0):.1f} % of step time), "
                f"{k.get('prefetched', 0):.1f}/step issued ahead; exposed comm {comm_share}")

    g = summ.get("gather") or {}
    if g.get("exposed_pct", 0) >= EXPOSED_FINDING:
        ahead = g.get("prefetched", 0) >= 0.5 * max(g.get("calls", 0), 1e-9)
        if ahead:
            advice = ("the gathers are issued ahead yet still waited for: each layer's compute is shorter than "
                      "the next one's gather; wrap coarser units (fewer, larger fully_shard groups), gather in "
                      "lower precision (MixedPrecisionPolicy(param_dtype=torch.bfloat16)), or a larger batch")
        elif version == 2:
            advice = ("prefetch: layer.set_modules_to_forward_prefetch([next_layer]) issues the next layer's "
                      "all-gather before this one's forward; with synchronous gathers (gloo on CPU) a prefetch "
                      "overlaps nothing until the unshard is asynchronous")
        else:
            advice = ("FSDP(..., forward_prefetch=True) issues the next all-gather before this forward; "
                      "limit_all_gathers=False where memory allows")
        out.append({"finding": "FSDP forward all-gathers are exposed", "evidence": ev("gather"),
                    "advice": advice})
    rg = summ.get("regather") or {}
    if rg.get("exposed_pct", 0) >= EXPOSED_FINDING:
        advice = ("fully_shard(..., reshard_after_forward=False) for the last layers keeps their parameters "
                  "gathered from forward to backward (no re-gather, more memory), or an int to reshard onto a "
                  "smaller mesh; set_modules_to_backward_prefetch issues the re-gathers earlier"
                  if version == 2 else
                  "ShardingStrategy.SHARD_GRAD_OP keeps parameters gathered between forward and backward; "
                  "backward_prefetch=BackwardPrefetch.BACKWARD_PRE issues the re-gathers earlier")
        out.append({"finding": "FSDP backward re-gathers are exposed", "evidence": ev("regather"),
                    "advice": advice})
    rd = summ.get("reduce") or {}
    if rd.get("exposed_pct", 0) >= EXPOSED_FINDING:
        dtypes = {str(m.get("reduce_dtype")) for m in groups.values() if m.get("reduce_dtype")}
        fp32 = dtypes == {"float32"}
        tail = rd.get("after_bwd_ns", 0) / 1e6
        advice = ("MixedPrecisionPolicy(reduce_dtype=torch.bfloat16) halves the reduce-scatter's bytes "
                  "(gradients reduced in bf16: check convergence); " if fp32 and version == 2 else
                  "MixedPrecision(reduce_dtype=torch.bfloat16) halves the reduce-scatter's bytes; " if fp32 else "")
        advice += ("with gradient accumulation, set_requires_gradient_sync(False) on all but the last "
                   "micro-batch" if version == 2 else "with gradient accumulation, no_sync() on all but the last "
                   "micro-batch")
        ev_r = ev("reduce") + (f"; {tail:.2f} ms/step of it after backward returned" if tail else "") \
            + (f"; reduce dtype {'/'.join(sorted(dtypes))}" if dtypes else "")
        out.append({"finding": "FSDP gradient reduce-scatters are exposed", "evidence": ev_r, "advice": advice})
    out += _wrapping(groups, version)
    last = summ.get("last")
    if last and step_ms:
        what = {"gather": "forward all-gather", "regather": "backward re-gather", "reduce": "reduction"}[last["kind"]]
        out.append({"finding": f"critical path: the step's last wait is {last['layer']}'s {what}",
                    "evidence": f"in {last['pct']:.0f} % of measured (rank, step) pairs the last exposed "
                                f"communication instant belongs to layer {last['layer']}'s {what}",
                    "advice": "that collective is what the step's end waits for: hide it first (see the FSDP "
                              "findings above and the per-layer table)"})
    if claim is not None:
        out.append({"finding": "communication-bound" + claim,
                    "evidence": f"exposed comm {comm_share}; " + "; ".join(
                        f"{k} {(summ.get(k) or {}).get('exposed_ns', 0) / 1e6:.2f} ms/step exposed"
                        for k in ("gather", "regather", "reduce") if summ.get(k)),
                    "advice": "FSDP sends every parameter twice and every gradient once per step: fewer bytes "
                              "(bf16 param_dtype / reduce_dtype), a larger per-rank batch (more compute per "
                              "gather), HSDP (a replicate dimension across nodes: only all-reduces cross them)"})
    return out


def _wrapping(groups: dict, version: int) -> List[dict]:
    """Wrapping granularity and the root's group, from the groups' bytes."""
    sizes = {k: float(m.get("bytes") or 0) for k, m in groups.items()}
    total = sum(sizes.values())
    if not sizes or total <= 0:
        return []
    out = []
    unit = "fully_shard" if version == 2 else "the auto_wrap_policy"
    tiny = [k for k, b in sizes.items() if b < TINY_BYTES]
    if len(sizes) >= TINY_GROUPS and len(tiny) >= 0.75 * len(sizes):
        out.append({"finding": f"many tiny FSDP groups ({len(tiny)} of {len(sizes)} below "
                               f"{TINY_BYTES / 2**20:.0f} MiB)",
                    "evidence": f"median group {np.median(list(sizes.values())) / 2**20:.2f} MiB of "
                                f"{total / 2**20:.1f} MiB in {len(sizes)} groups",
                    "advice": f"wrap coarser with {unit}: a block (attention + MLP), not each layer: each group "
                              "pays a collective's latency twice in forward and backward"})
    big, bb = max(sizes.items(), key=lambda kv: kv[1])
    root = sizes.get("(root)", 0.0)
    if len(sizes) >= 1 and bb >= HUGE_SHARE * total and big != "(root)" and total >= TINY_BYTES:
        out.append({"finding": f"one FSDP group holds {100 * bb / total:.0f} % of the parameters ({big})",
                    "evidence": f"{bb / 2**20:.1f} of {total / 2**20:.1f} MiB in group {big}",
                    "advice": f"wrap finer with {unit}: its gather and reduce-scatter have nothing to overlap "
                              "with and its unsharded parameters peak the memory"})
    if root >= 0.25 * total and total >= TINY_BYTES:
        out.append({"finding": f"the root's FSDP group holds {100 * root / total:.0f} % of the parameters",
                    "evidence": f"{root / 2**20:.1f} of {total / 2**20:.1f} MiB are in modules no inner group "
                                "wraps (embeddings, the head): the root gathers them first in forward with nothing "
                                "to hide behind",
                    "advice": f"wrap those modules separately with {unit} (the root keeps only what is left)"})
    return out


def _zero3_findings(summ: dict, claim: Optional[str], comm_share: str) -> List[dict]:
    """DeepSpeed ZeRO-3's counterparts of FSDP's findings (its config keys)."""
    out: List[dict] = []
    advice = {
        "gather": ("ZeRO-3 forward all-gathers are exposed",
                   "raise stage3_prefetch_bucket_size (parameters gathered ahead of their module); "
                   "overlap_comm=true; stage3_param_persistence_threshold keeps small parameters gathered"),
        "regather": ("ZeRO-3 backward re-gathers are exposed",
                     "raise stage3_max_reuse_distance / stage3_max_live_parameters (parameters kept gathered "
                     "from forward to backward, more memory); stage3_prefetch_bucket_size"),
        "reduce": ("ZeRO-3 gradient reduce-scatters are exposed",
                   "overlap_comm=true, a larger reduce_bucket_size; communication_data_type bf16 halves the "
                   "bytes (check convergence)"),
    }
    for kind, (finding, text) in advice.items():
        k = summ.get(kind) or {}
        if k.get("exposed_pct", 0) >= EXPOSED_FINDING:
            out.append({"finding": finding,
                        "evidence": f"{k.get('calls', 0):.1f} {kind} collectives/step take "
                                    f"{k.get('busy_ns', 0) / 1e6:.2f} ms, {k.get('exposed_ns', 0) / 1e6:.2f} ms "
                                    f"exposed ({k.get('exposed_pct', 0):.1f} % of step time); exposed comm "
                                    f"{comm_share}",
                        "advice": text})
    if claim is not None:
        out.append({"finding": "communication-bound" + claim, "evidence": f"exposed comm {comm_share}",
                    "advice": "ZeRO-3 gathers every parameter twice and reduces every gradient once per step: "
                              "the lowest ZeRO stage that fits in memory, bf16 communication, a larger per-rank "
                              "batch, hierarchical partitioning (zero_hpz_partition_size) across nodes"})
    return out
