"""The fine grain: per gradient bucket, how backprop, reduction and the
weight update interleave; the critical path across ranks; the delays
between weight updates.

*Gradient collectives* are the collectives a rank issues between the start
of its backward and the start of its optimizer step (DDP's buckets, Horovod's
tensors or fused groups, DeepSpeed's gradient all-reduces / ZeRO
reduce-scatters), in issue order: bucket k of a step is the k-th of them.
FSDP's collectives are not buckets: analyzers/fsdp.py reads them per layer.
Times are on aligned clocks (the per-rank offsets of :mod:`.clocks`), so
"waiting for peers" is the latest issue minus this rank's issue and
"transfer" the mean completion minus the latest issue.

Critical path of a step: the last gradient collective's completion decides
when the optimizer can run; walking back, a collective started either when
its last rank had the bucket ready (the gate is that rank: its data wait,
forward or backward, whichever exceeds the median rank's most) or when the
previous collective finished (the gate moves to that one's transfer). A
step whose slowest backward ends after the last collective is gated by that
rank's compute. Pure: pandas in, tables out."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

#: at most this many measured steps per rank are kept for the fine grain
MAX_STEPS = 200

PHASE_COLUMNS = ["rank", "step", "s0", "s1", "data_ns", "fwd_ns", "b0", "b1", "o0", "o1", "wait_ns"]
GRAD_COLUMNS = ["rank", "step", "k", "op", "source", "detail", "bytes", "issue", "end", "blocking"]


def _union_ns(df: pd.DataFrame) -> pd.Series:
    """Per (rank, step): length of the union of [t_start, t_end]."""
    if df.empty:
        return pd.Series(dtype=np.float64)
    d = df.sort_values(["rank", "step", "t_start"])
    ends = d.groupby(["rank", "step"])["t_end"].cummax()
    prev = ends.groupby([d["rank"], d["step"]]).shift(1)
    start = np.maximum(d["t_start"].to_numpy(np.float64), prev.fillna(-np.inf).to_numpy(np.float64))
    length = np.clip(d["t_end"].to_numpy(np.float64) - start, 0, None)
    return pd.Series(length, index=pd.MultiIndex.from_arrays([d["rank"], d["step"]])).groupby(level=[0, 1]).sum()


def sampled_steps(steps: pd.DataFrame, max_steps: int = MAX_STEPS) -> pd.DataFrame:
    """The measured steps the fine grain reads: an even sample of at most
    ``max_steps`` per rank (every stride-th in step order). Columns rank,
    step, s0, s1 (the step's start and end)."""
    st = steps[["rank", "step", "t_start", "t_end"]].rename(columns={"t_start": "s0", "t_end": "s1"})
    if st.empty:
        return st
    return st.iloc[_sampled_rows(st["rank"].to_numpy(), st["step"].to_numpy(), max_steps)]


def _sampled_rows(rank: np.ndarray, step: np.ndarray, max_steps: int) -> np.ndarray:
    """:func:`sampled_steps`'s rows (positions), by rank, then step."""
    order = np.lexsort((step, rank))        # by rank, then step (stable)
    rank = rank[order]
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    n = np.diff(np.r_[first, len(rank)])                                   # steps per rank
    pos = np.arange(len(rank)) - np.repeat(first, n)
    stride = np.maximum(np.ceil(np.repeat(n, n) / max_steps).astype(np.int64), 1)
    return order[pos % stride == 0]


def sampled_of(steps: Dict[str, np.ndarray], max_steps: int = MAX_STEPS) -> pd.DataFrame:
    """:func:`sampled_steps` of steps given as arrays (rank, step, t_start,
    t_end), the same rows and columns (its own index)."""
    rows = _sampled_rows(steps["rank"], steps["step"], max_steps) if len(steps["rank"]) else np.zeros(0, np.int64)
    return pd.DataFrame({"rank": steps["rank"][rows], "step": steps["step"][rows],
                         "s0": steps["t_start"][rows], "s1": steps["t_end"][rows]})


def in_steps(rank: np.ndarray, step: np.ndarray, st: pd.DataFrame) -> np.ndarray:
    """Mask of the events whose (rank, step) is one of ``st``'s rows: a
    lookup in a table of the chunk's (rank, step) pairs, else one sorted
    search of int64 keys (no per-row Python, no string columns)."""
    if st.empty or not len(rank):
        return np.zeros(len(rank), bool)
    sr, ss = st["rank"].to_numpy(np.int64), st["step"].to_numpy(np.int64)
    r0, s0 = int(min(sr.min(), rank.min())), int(min(ss.min(), step.min()))
    width = int(max(ss.max(), step.max())) - s0 + 1
    size = (int(max(sr.max(), rank.max())) - r0 + 1) * width
    if size <= max(4 * len(rank), 1 << 20):     # a chunk's ranks and steps: one table of (rank, step)
        table = np.zeros(size, bool)
        table[(sr - r0) * width + (ss - s0)] = True
        return table[(rank.astype(np.int64) - r0) * width + (step.astype(np.int64) - s0)]
    return _in_steps_sorted(rank, step, st)


def _in_steps_sorted(rank: np.ndarray, step: np.ndarray, st: pd.DataFrame) -> np.ndarray:
    """:func:`in_steps` by a sorted search (ranks and steps too far apart
    for a table)."""
    lo = int(min(st["step"].min(), step.min()))
    keys = np.sort((st["rank"].to_numpy(np.int64) << 32) | (st["step"].to_numpy(np.int64) - lo))
    ek = (rank.astype(np.int64) << 32) | (step.astype(np.int64) - lo)
    pos = np.minimum(np.searchsorted(keys, ek), len(keys) - 1)
    return keys[pos] == ek


def rank_rows(ev: pd.DataFrame, steps: pd.DataFrame, max_steps: int = MAX_STEPS,
              sampled: Optional[pd.DataFrame] = None):
    """(phases, grads) of the measured steps of the ranks in ``ev`` (events:
    rank, step, category, name, source, t_start, t_end, bytes, blocking;
    ``steps``: the measured (rank, step) pairs, ``t_start``/``t_end``).
    Events of steps outside :func:`sampled_steps` (``sampled`` where the
    caller has it) are ignored; a caller with big chunks filters them first
    with :func:`in_steps`."""
    key = ["rank", "step"]
    st = sampled if sampled is not None else sampled_steps(steps, max_steps)
    if st.empty:
        return pd.DataFrame(columns=PHASE_COLUMNS), pd.DataFrame(columns=GRAD_COLUMNS)
    ev = ev.merge(st[key], on=key, how="inner").reset_index(drop=True)
    # compared as they come (categorical or object): no string conversion of every row
    cat = ev["category"]
    comp = ev[(cat == "compute").to_numpy(bool)]
    cname = comp["name"]
    bw = comp[(cname == "backward").to_numpy(bool)].groupby(key).agg(b0=("t_start", "min"), b1=("t_end", "max"))
    opt = comp[(cname == "optimizer").to_numpy(bool)].groupby(key).agg(o0=("t_start", "min"), o1=("t_end", "max"))
    fwd = _union_ns(comp[(cname == "forward").to_numpy(bool)]).rename("fwd_ns")
    data = _union_ns(ev[(cat == "data").to_numpy(bool)]).rename("data_ns")
    wait = _union_ns(ev[(cat == "wait").to_numpy(bool)]).rename("wait_ns")
    ph = st.set_index(key).join([bw, opt, fwd, data, wait], how="left")
    ph = ph[ph["b0"].notna()]
    for c in ("fwd_ns", "data_ns", "wait_ns"):
        ph[c] = ph[c].fillna(0.0)
    ph["o0"] = ph["o0"].fillna(ph["s1"])
    ph["o1"] = ph["o1"].fillna(ph["s1"])
    # FSDP's gathers and reduce-scatters are per layer, not buckets (analyzers/fsdp.py)
    is_comm = (cat == "comm").to_numpy(bool) & ~ev["source"].isin(("fsdp", "zero3")).to_numpy(bool)
    comm = ev[is_comm].join(ph[["b0", "o0"]], on=key, how="inner").reset_index(drop=True)
    comm = comm[(comm["t_start"] >= comm["b0"]) & (comm["t_start"] < comm["o0"])]
    comm = comm.sort_values(key + ["t_start"])
    grads = pd.DataFrame({
        "rank": comm["rank"].astype(np.int64), "step": comm["step"].astype(np.int64),
        "k": comm.groupby(key).cumcount().astype(np.int64), "op": comm["name"].astype(str),
        "source": comm["source"].astype(str), "detail": comm["detail"].astype(str),
        "bytes": comm["bytes"].astype(np.float64),
        "issue": comm["t_start"].astype(np.int64), "end": comm["t_end"].astype(np.int64),
        "blocking": comm["blocking"].fillna(True).astype(bool)})
    ph = ph.reset_index()[PHASE_COLUMNS]
    return ph, grads.reset_index(drop=True)


def shifted(phases: pd.DataFrame, grads: pd.DataFrame, offsets: Dict[int, int]):
    """Both frames with each rank's clock offset added (aligned clocks)."""
    if not offsets:
        return phases, grads
    ph, gr = phases.copy(), grads.copy()
    for frame, cols in ((ph, ("s0", "s1", "b0", "b1", "o0", "o1")), (gr, ("issue", "end"))):
        off = frame["rank"].map(offsets).fillna(0).to_numpy(np.int64)
        for c in cols:
            frame[c] = frame[c].to_numpy(np.float64) + off
    return ph, gr


def complete_instances(grads: pd.DataFrame, n_ranks: int) -> pd.DataFrame:
    """Only (step, k) seen on every rank, and steps whose bucket count is the
    usual one (the same model every step)."""
    if grads.empty:
        return grads
    per = grads.groupby(["rank", "step"])["k"].max() + 1
    usual = int(per.mode().iloc[0])
    ok = per[per == usual].reset_index()[["rank", "step"]]
    g = grads.merge(ok, on=["rank", "step"])
    seen = g.groupby(["step", "k"])["rank"].transform("nunique")
    return g[seen == n_ranks]


BUCKET_COLUMNS = ["bucket", "op", "source", "bytes", "ready_ms", "ready_spread_ms", "issue_to_done_ms", "wait_ms",
                  "transfer_ms", "tail_ms", "last_rank", "last_pct", "samples", "params"]


def params_label(modules: Sequence[str], limit: int = 3) -> str:
    """A bucket's modules in short: 'layer4.1.conv2, layer4.1.bn2 ... fc (12 modules)'."""
    mods = [m for m in modules if m]
    if len(mods) <= limit:
        return ", ".join(mods)
    return f"{', '.join(mods[:2])} ... {mods[-1]} ({len(mods)} modules)"


def bucket_table(phases: pd.DataFrame, grads: pd.DataFrame, n_ranks: int,
                 names: Optional[Dict[str, Sequence[str]]] = None,
                 complete: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Per bucket index: size, when it became ready after the backward's
    start (median), the spread of that instant across ranks, issue to
    completion, waiting for peers vs transferring (means), the exposed tail
    after each rank's backward ended, the rank most often last ready, and
    what the bucket holds: DDP's module names where the recorder saw them
    (``names``: bucket index -> modules), else the collective's tensor name
    (Horovod). ``complete``: :func:`complete_instances` of the same grads and
    ranks, where the caller has it (read, not changed)."""
    g = complete_instances(grads, n_ranks) if complete is None else complete
    if g.empty:
        return pd.DataFrame(columns=BUCKET_COLUMNS)
    g = g.merge(phases[["rank", "step", "b0", "b1"]], on=["rank", "step"])
    inst = g.groupby(["step", "k"]).agg(last=("issue", "max"), first=("issue", "min"), done=("end", "mean"))
    g = g.join(inst, on=["step", "k"])
    last_rank = g.loc[g.groupby(["step", "k"])["issue"].idxmax(), ["step", "k", "rank"]]
    rows = []
    for k, d in g.groupby("k"):
        lr = last_rank[last_rank["k"] == k]["rank"]
        mode = int(lr.mode().iloc[0]) if len(lr) else -1
        i = inst.xs(k, level="k")
        rows.append({
            "bucket": int(k), "op": d["op"].mode().iloc[0], "source": d["source"].mode().iloc[0],
            "bytes": float(d["bytes"].median()),
            "ready_ms": float(((d["issue"] - d["b0"]) / 1e6).median()),
            "ready_spread_ms": float(((i["last"] - i["first"]) / 1e6).mean()),
            "issue_to_done_ms": float(((d["end"] - d["issue"]) / 1e6).median()),
            "wait_ms": float(((d["last"] - d["issue"]) / 1e6).mean()),
            "transfer_ms": float(((i["done"] - i["last"]) / 1e6).clip(lower=0).mean()),
            "tail_ms": float(((d["end"] - d["b1"]) / 1e6).clip(lower=0).mean()),
            "last_rank": mode if n_ranks > 1 else np.nan,
            "last_pct": 100.0 * float((lr == mode).mean()) if len(lr) and n_ranks > 1 else np.nan,
            "samples": int(len(d)), "params": _holds(k, d, names)})
    return pd.DataFrame(rows, columns=BUCKET_COLUMNS)


def _holds(k: int, d: pd.DataFrame, names: Optional[Dict[str, Sequence[str]]]) -> str:
    if names and str(k) in names:
        return params_label(names[str(k)])
    detail = d["detail"].mode().iloc[0] if "detail" in d and len(d) else ""
    return "" if detail in ("default", "None", "nan", "") or detail.startswith("_") else str(detail)


PATH_COLUMNS = ["step", "gate", "gate_rank", "gate_bucket", "gate_phase", "path", "tail_ms", "margin_ms"]


def critical_paths(phases: pd.DataFrame, grads: pd.DataFrame, n_ranks: int,
                   complete: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """One row per measured step seen on every rank: the gate (what the
    step's end waited for, walking back from the last gradient collective)
    and the whole chain as text. Per-step statistics come from one grouped
    pass each (no pandas call per step). ``complete``: as
    :func:`bucket_table` takes it."""
    g = complete_instances(grads, n_ranks) if complete is None else complete
    if phases.empty:
        return pd.DataFrame(columns=PATH_COLUMNS)
    ph = phases.sort_values(["step", "rank"], kind="stable")
    count = ph.groupby("step")["rank"].size()
    full = set(count.index[count.to_numpy() >= n_ranks].tolist())
    steps = sorted(full & set(g["step"].tolist())) if len(g) else sorted(full)
    if not steps:
        return pd.DataFrame(columns=PATH_COLUMNS)
    ph = ph[ph["step"].isin(steps)]
    lateness = _Lateness(ph)
    by = ph.groupby("step", sort=True)
    bwd_end = by["b1"].max()
    slow = ph.loc[by["b1"].idxmax(), ["step", "rank"]].set_index("step")["rank"]
    bwd_margin = _margins(ph["step"].to_numpy(np.int64), np.zeros(len(ph), np.int64),
                          ph["b1"].to_numpy(np.float64))[1]
    inst = _instances_per_step(g, ph, steps) if len(g) else {}
    rows = []
    for s_ in steps:
        bwd_e, slow_bwd = float(bwd_end[s_]), int(slow[s_])
        # no collective, or the slowest backward ends after every collective: compute gates
        if s_ not in inst or bwd_e > float(inst[s_][2][-1]):
            rows.append(_gate_row(s_, "compute", slow_bwd, None, lateness.why(s_, slow_bwd, None),
                                  [f"rank {slow_bwd} backward", "optimizer"], 0.0, bwd_margin.get(s_, np.nan)))
            continue
        rows.append(_bucket_gate(s_, inst[s_], bwd_e, lateness))
    return pd.DataFrame(rows, columns=PATH_COLUMNS)


class _Lateness:
    """Why a rank was late in a step: its data wait, forward, backward (up to
    a bucket, or whole) or start, whichever exceeds the median rank's most."""

    def __init__(self, ph: pd.DataFrame):
        by = ph.groupby("step", sort=True)
        med = by[["data_ns", "fwd_ns", "s0", "b0"]].median()
        self.pos = {(int(st_), int(r)): i for i, (st_, r) in enumerate(zip(ph["step"], ph["rank"]))}
        self.cols = {c: ph[c].to_numpy(np.float64) for c in ("data_ns", "fwd_ns", "s0", "b0", "b1")}
        self.meds = {c: med[c].to_dict() for c in ("data_ns", "fwd_ns", "s0", "b0")}
        self.bw_med = (ph["b1"] - ph["b0"]).groupby(ph["step"]).median().to_dict()

    def why(self, step: int, rank: int, ready_at: Optional[float], ready_rel_med: Optional[float] = None) -> str:
        cols, meds = self.cols, self.meds
        i = self.pos[(step, rank)]
        data_x = cols["data_ns"][i] - meds["data_ns"][step]
        fwd_x = cols["fwd_ns"][i] - meds["fwd_ns"][step]
        if ready_at is not None and ready_rel_med is not None:
            # its backward up to this bucket vs the median rank's (each rank's ready - its b0)
            bw_x = (ready_at - cols["b0"][i]) - ready_rel_med
        elif ready_at is not None:
            bw_x = (ready_at - cols["b0"][i]) - (ready_at - meds["b0"][step])
        else:
            bw_x = (cols["b1"][i] - cols["b0"][i]) - self.bw_med[step]
        start_x = cols["s0"][i] - meds["s0"][step]
        best = max((data_x, "data wait"), (fwd_x, "forward"), (bw_x, "backward"), (start_x, "late start"))
        return best[1] if best[0] > 0 else "backward"


def _margins(step: np.ndarray, k: np.ndarray, t: np.ndarray):
    """Per (step, k), sorted: the latest ``t`` minus the second latest, in
    ms (NaN where one rank alone has it); also as {step: margin} for k = 0."""
    order = np.lexsort((t, k, step))
    s, kk, tt = step[order], k[order], t[order]
    ends = np.append(np.flatnonzero((np.diff(s) != 0) | (np.diff(kk) != 0)) + 1, len(s))
    starts = np.insert(ends[:-1], 0, 0)
    margin = np.full(len(ends), np.nan)
    two = ends - starts >= 2
    margin[two] = (tt[ends[two] - 1] - tt[ends[two] - 2]) / 1e6
    return margin, {int(s[e - 1]): float(m) for e, m in zip(ends, margin)}


def _instances_per_step(g: pd.DataFrame, ph: pd.DataFrame, steps) -> Dict[int, tuple]:
    """Per step: its buckets' (k, latest issue, mean completion, latest
    issuer, op, median issue relative to each rank's backward start, margin
    of the latest issue over the second latest in ms)."""
    gg = g[g["step"].isin(steps)]
    b0_of = ph.set_index(["step", "rank"])["b0"]
    b0 = b0_of.reindex(pd.MultiIndex.from_arrays([gg["step"], gg["rank"]])).to_numpy(np.float64)
    gg = gg.assign(rel=gg["issue"].to_numpy(np.float64) - b0)
    grouped = gg.groupby(["step", "k"], sort=True)
    agg = grouped.agg(last=("issue", "max"), done=("end", "mean"), rel=("rel", "median"))
    who = gg.loc[grouped["issue"].idxmax().to_numpy(), "rank"].to_numpy()
    op = gg.groupby("step")["op"].first().to_dict()
    st_arr = agg.index.get_level_values("step").to_numpy()
    ks_arr = agg.index.get_level_values("k").to_numpy()
    last_arr, done_arr = agg["last"].to_numpy(np.float64), agg["done"].to_numpy(np.float64)
    rel_arr = agg["rel"].to_numpy(np.float64)
    margin = _margins(gg["step"].to_numpy(np.int64), gg["k"].to_numpy(np.int64),
                      gg["issue"].to_numpy(np.int64))[0]      # same (step, k) order as agg
    cuts = np.flatnonzero(np.diff(st_arr)) + 1
    inst: Dict[int, tuple] = {}
    for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(st_arr)]])):
        inst[int(st_arr[a])] = (ks_arr[a:b], last_arr[a:b], done_arr[a:b], who[a:b], op[int(st_arr[a])],
                                rel_arr[a:b], margin[a:b])
    return inst


def _bucket_gate(step: int, inst: tuple, bwd_e: float, lateness: _Lateness) -> dict:
    """Walk back from the last collective: a bucket issued before the
    previous one completed waited for it; the first that did not is the
    gate, and its last-ready rank says why."""
    ks, last, done, whos, op_, rels, margins = inst
    last_done = float(done[-1])
    chain: List[str] = []
    j = len(ks) - 1
    while j > 0 and last[j] < done[j - 1]:
        chain.insert(0, f"bucket {ks[j]} {op_}")
        j -= 1
    k, who_j = ks[j], int(whos[j])
    rel_j = float(rels[j])
    phase = lateness.why(step, who_j, float(last[j]), rel_j if rel_j == rel_j else None)
    chain = [f"rank {who_j} {phase}", f"bucket {k} ready last on rank {who_j}", f"bucket {k} {op_}"] \
        + chain + ["optimizer"]
    return _gate_row(step, "bucket", who_j, int(k), phase, chain, (last_done - bwd_e) / 1e6, float(margins[j]))


def _gate_row(step, kind, rank, bucket, phase, chain, tail_ms, margin_ms):
    if kind == "compute":
        gate = f"rank {rank} {phase} (compute: the slowest backward ends after the last collective)"
    else:
        gate = f"bucket {bucket}, ready last on rank {rank} ({phase})"
    return {"step": int(step), "gate": gate, "gate_rank": int(rank), "gate_bucket": bucket, "gate_phase": phase,
            "path": " -> ".join(chain), "tail_ms": tail_ms, "margin_ms": margin_ms}


GATE_COLUMNS = ["gate", "bucket", "bytes", "rank", "steps", "steps_pct", "phase", "tail_ms", "example"]


def gate_table(paths: pd.DataFrame, buckets_t: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """How often each gate (a bucket made late by one rank, or one rank's
    compute) decides the step: share of measured steps, the phase that made
    the rank late most often, the mean exposed tail after the slowest
    backward, an example chain."""
    if paths.empty:
        return pd.DataFrame(columns=GATE_COLUMNS)
    p = paths.assign(b=paths["gate_bucket"].fillna(-1).astype(int))
    sizes = {} if buckets_t is None or buckets_t.empty else dict(zip(buckets_t["bucket"], buckets_t["bytes"]))
    rows = []
    for (b, r), d in p.groupby(["b", "gate_rank"]):
        gate = f"bucket {b}, ready last on rank {r}" if b >= 0 else f"rank {r} compute (backward ends last)"
        rows.append({"gate": gate, "bucket": b if b >= 0 else np.nan, "bytes": sizes.get(b, np.nan),
                     "rank": int(r), "steps": int(len(d)), "steps_pct": 100.0 * len(d) / len(p),
                     "phase": d["gate_phase"].mode().iloc[0], "tail_ms": float(d["tail_ms"].mean()),
                     "example": d["path"].iloc[0]})
    out = pd.DataFrame(rows, columns=GATE_COLUMNS)
    return out.sort_values(["steps", "gate"], ascending=[False, True]).reset_index(drop=True)


def gate_summary(paths: pd.DataFrame) -> Dict[str, Any]:
    """The most frequent gating bucket and rank, with their shares of steps."""
    if paths.empty:
        return {}
    b = paths["gate_bucket"].fillna(-1).astype(int)
    top_b = int(b.mode().iloc[0])
    top_r = int(paths["gate_rank"].mode().iloc[0])
    return {"bucket": top_b, "bucket_pct": 100.0 * float((b == top_b).mean()), "rank": top_r,
            "rank_pct": 100.0 * float((paths["gate_rank"] == top_r).mean()), "steps": int(len(paths))}


UPDATE_COLUMNS = ["ranks", "updates", "delay_ms_p50", "delay_ms_p95", "delay_ms_max", "data_ms", "forward_ms",
                  "backward_ms", "waiting_ms", "other_ms", "idle_ms_p50"]


def update_delays(phases: pd.DataFrame) -> pd.DataFrame:
    """Time from the end of one optimizer step to the start of the next on
    each rank (the delay between two updates of the same weights): its
    distribution, what fills it (means: data wait, forward, backward,
    waiting for communication, the rest), and the median longest single
    wait per step (data or communication) — a background job that short
    fits into the waits for free."""
    if phases.empty:
        return pd.DataFrame(columns=UPDATE_COLUMNS)
    p = phases.sort_values(["rank", "step"]).copy()
    p["prev_o1"] = p.groupby("rank")["o1"].shift(1)
    p = p[p["prev_o1"].notna() & (p["step"] == p.groupby("rank")["step"].shift(1).add(1).fillna(-1))]
    if p.empty:
        return pd.DataFrame(columns=UPDATE_COLUMNS)
    delay = (p["o0"] - p["prev_o1"]) / 1e6
    bwd = (p["b1"] - p["b0"]) / 1e6
    data, fwd, wait = p["data_ns"] / 1e6, p["fwd_ns"] / 1e6, p["wait_ns"] / 1e6
    other = (delay - data - fwd - bwd - wait).clip(lower=0)
    idle = np.maximum(data, wait)
    return pd.DataFrame([{
        "ranks": int(p["rank"].nunique()), "updates": int(len(p)),
        "delay_ms_p50": float(delay.median()), "delay_ms_p95": float(np.percentile(delay, 95)),
        "delay_ms_max": float(delay.max()), "data_ms": float(data.mean()), "forward_ms": float(fwd.mean()),
        "backward_ms": float(bwd.mean()), "waiting_ms": float(wait.mean()), "other_ms": float(other.mean()),
        "idle_ms_p50": float(idle.median())}], columns=UPDATE_COLUMNS)


def run_tables(phases: pd.DataFrame, grads: pd.DataFrame, n_ranks: int, ddp_buckets=None) -> dict:
    """One run's fine-grain tables: its update delays (None without
    phases), bucket table (None without gradients' collectives), critical
    paths and gate table (None on one rank). Computed beside the rest of
    the analysis (analyzers/run.py) or by the report where a run lacks
    them."""
    out: dict = {"updates": None, "buckets": None, "paths": None, "gates": None}
    if phases is None or phases.empty:
        return out
    out["updates"] = update_delays(phases)
    if grads is None or grads.empty:
        return out
    complete = complete_instances(grads, n_ranks)       # read by both, found once
    out["buckets"] = bucket_table(phases, grads, n_ranks, ddp_buckets, complete=complete)
    if n_ranks > 1:
        out["paths"] = critical_paths(phases, grads, n_ranks, complete=complete)
        out["gates"] = gate_table(out["paths"], out["buckets"])
    return out


def gantt(phases: pd.DataFrame, grads: pd.DataFrame, steps: int = 3, ranks: int = 4) -> pd.DataFrame:
    """Bars for a per-bucket Gantt of a few steps of a few ranks: rank,
    lane (backward / bucket k), start_ms, dur_ms, name (times relative to
    the first shown step's earliest start)."""
    if phases.empty:
        return pd.DataFrame(columns=["rank", "lane", "start_ms", "dur_ms", "name"])
    show_r = sorted(phases["rank"].unique())[:ranks]
    mid = sorted(phases["step"].unique())
    show_s = mid[len(mid) // 2: len(mid) // 2 + steps] if len(mid) > steps else mid
    ph = phases[phases["rank"].isin(show_r) & phases["step"].isin(show_s)]
    gr = grads[grads["rank"].isin(show_r) & grads["step"].isin(show_s)]
    t0 = float(ph["s0"].min())
    bars = []
    for _, r in ph.iterrows():
        bars.append({"rank": int(r["rank"]), "lane": "backward", "start_ms": (r["b0"] - t0) / 1e6,
                     "dur_ms": (r["b1"] - r["b0"]) / 1e6, "name": f"step {int(r['step'])} backward"})
        bars.append({"rank": int(r["rank"]), "lane": "optimizer", "start_ms": (r["o0"] - t0) / 1e6,
                     "dur_ms": (r["o1"] - r["o0"]) / 1e6, "name": f"step {int(r['step'])} optimizer"})
    for _, r in gr.iterrows():
        bars.append({"rank": int(r["rank"]), "lane": f"bucket {int(r['k'])}", "start_ms": (r["issue"] - t0) / 1e6,
                     "dur_ms": (r["end"] - r["issue"]) / 1e6,
                     "name": f"step {int(r['step'])} bucket {int(r['k'])} {r['op']} {r['bytes'] / 2 ** 20:.1f} MiB"})
    return pd.DataFrame(bars, columns=["rank", "lane", "start_ms", "dur_ms", "name"])
