"""Trace-driven prediction of a data-parallel job at GPU counts nobody ran.

From a measured run, every (rank, step) becomes a *sample* of the step's
structure: the time from the step's start to the backward's start (data
wait, forward, anything else before), the backward's compute time, the
instant each gradient bucket became ready (its all_reduce issued) relative
to the backward's start, the bucket sizes in order, blocking collectives
(their measured time taken out, their size kept), and what follows the
backward (optimizer, anything else). :func:`replay` rebuilds steps for N
ranks: each simulated rank draws its own sample every step (so the slowest
of N gets slower as N grows, as the measured per-rank jitter says), each
bucket's collective starts when the last rank has it ready *and* the
previous bucket is done (one communication stream), lasts the
communication model's time for its size at N, and a rank's step ends when
its backward and the last bucket are done, plus what follows. Exposed
communication is what the backward did not hide; weak scaling keeps the
per-rank batch, strong scaling shrinks per-rank data, forward and backward
time (and the ready instants) by N_measured / N.

Communication: every bucket's and blocking collective's time at N comes
from the one cost model of :mod:`commprof.analyzers.collmodel` (NCCL's
Ring / Tree with its protocols, gloo's ring; fitted to the measured
collectives' busy periods, to ``commprof bench`` results or nccl-tests
logs, or a network a user describes). The prediction interval is the
replay's spread over repetitions with the model's interval (its plausible
forms and the terms' standard errors) at both ends.

Pure: numpy / pandas in, arrays and DataFrames out."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from . import collmodel as cost
from .buckets import _union_ns

NS = 1e9


# -- step structure ---------------------------------------------------------------
@dataclass
class Structure:
    """Per (rank, step) samples of one measured run (times in seconds)."""
    world: int
    batch: float                   # per-rank batch
    pre: np.ndarray                # step start -> backward start (blocking comm taken out)
    data: np.ndarray
    forward: np.ndarray
    backward: np.ndarray           # backward compute (start -> end)
    post: np.ndarray               # after backward and comm -> step end (blocking comm taken out)
    optimizer: np.ndarray
    ready: np.ndarray              # (M, K) bucket ready instants from the backward's start
    sizes: np.ndarray              # (K,) bytes per bucket
    ops: List[str]                 # (K,) collective of each bucket
    comm_measured: np.ndarray      # (M, K) measured issue -> completion per bucket
    blocking: List[Tuple[str, float, str]]  # per step: (op, bytes, "pre" | "post") of blocking collectives
    step: np.ndarray               # measured step time of each sample
    label: str = ""

    @property
    def samples(self) -> int:
        return len(self.pre)

    @property
    def buckets(self) -> int:
        return len(self.sizes)


def structure(events: pd.DataFrame, world: int, batch: Optional[float], warmup: int = 1,
              label: str = "") -> Structure:
    """The step structure of one run from its events (columns: rank, step,
    category, name, t_start, t_end, bytes, blocking, op name in ``name``).
    ``warmup``: the first steps of every rank left out."""
    ev = events.copy()
    ev["category"] = ev["category"].astype(str)
    ev["name"] = ev["name"].astype(str)
    steps = ev[ev["category"] == "step"][["rank", "step", "t_start", "t_end"]]
    steps = steps.sort_values(["rank", "step"])
    first = steps.groupby("rank")["step"].transform("min")
    steps = steps[steps["step"] >= first + warmup]
    if steps.empty:
        raise ValueError(f"{label or 'run'}: no measured step (after {warmup} warm-up step(s))")
    key = ["rank", "step"]
    dur = (ev["t_end"] - ev["t_start"]).astype(np.float64)
    ev = ev.assign(dur=dur)
    comp = ev[ev["category"] == "compute"]
    bw = comp[comp["name"] == "backward"].groupby(key).agg(b0=("t_start", "min"), b1=("t_end", "max"))
    fwd = _union_ns(comp[comp["name"] == "forward"]).rename("forward")  # nested modules: union
    opt = comp[comp["name"] == "optimizer"].groupby(key)["dur"].sum().rename("optimizer")
    data = ev[ev["category"] == "data"].groupby(key)["dur"].sum().rename("data")
    s = steps.set_index(key).join([bw, fwd, opt, data], how="left")
    s = s[s["b0"].notna()]
    if s.empty:
        raise ValueError(f"{label or 'run'}: no backward pass recorded (the replay needs one per step)")
    s[["forward", "optimizer", "data"]] = s[["forward", "optimizer", "data"]].fillna(0.0)
    comm = ev[ev["category"] == "comm"].join(s[["b0", "b1", "t_start", "t_end"]].rename(
        columns={"t_start": "s0", "t_end": "s1"}), on=key, how="inner").reset_index(drop=True)
    blocking = comm["blocking"].fillna(True).astype(bool)
    in_bw = (~blocking) & (comm["t_start"] >= comm["b0"]) & (comm["t_start"] <= comm["b1"] + 1e6)
    buckets = comm[in_bw].sort_values(key + ["t_start"])
    blk = comm[blocking]
    counts = buckets.groupby(key).size()
    k_mode = int(counts.mode().iloc[0]) if len(counts) else 0
    if k_mode:
        good = counts[counts == k_mode].index
        s = s.loc[s.index.intersection(good)]
        buckets = buckets.set_index(key).loc[s.index].reset_index()
    else:
        s = s.loc[s.index.difference(counts.index)]
    m = len(s)
    ready = np.zeros((m, k_mode))
    cm = np.zeros((m, k_mode))
    sizes = np.zeros(k_mode)
    ops = []
    comm_end = s["b1"].to_numpy(np.float64)
    if k_mode:
        b = buckets.sort_values(key + ["t_start"])
        order = b.groupby(key).cumcount().to_numpy()
        pos = pd.Series(np.arange(m), index=s.index)
        rows = pos.loc[list(zip(b["rank"], b["step"]))].to_numpy()
        ready[rows, order] = (b["t_start"].to_numpy(np.float64) - s["b0"].to_numpy(np.float64)[rows])
        cm[rows, order] = b["dur"].to_numpy(np.float64)
        sizes = b.groupby(order)["bytes"].median().to_numpy(np.float64)
        ops = [str(x) for x in b.groupby(order)["name"].agg(lambda v: v.mode().iloc[0])]
        last_end = b.groupby(key)["t_end"].max().reindex(s.index).to_numpy(np.float64)
        comm_end = np.maximum(comm_end, last_end)
    # blocking collectives: measured time out of pre / post, sizes kept per step
    bpre = blk[blk["t_start"] < blk["b0"]].groupby(key)["dur"].sum().reindex(s.index).fillna(0).to_numpy()
    bpost = blk[blk["t_start"] >= blk["b1"]].groupby(key)["dur"].sum().reindex(s.index).fillna(0).to_numpy()
    per_step = blk.groupby(key).size()
    blocking_list: List[Tuple[str, float, str]] = []
    if len(per_step):
        typical = int(per_step.mode().iloc[0])
        ex = blk.set_index(key).loc[per_step[per_step == typical].index[:1]]
        blocking_list = [(str(o), float(nb) if nb == nb and nb else 0.0, "pre" if ts < b0_ else "post")
                         for o, nb, ts, b0_ in zip(ex["name"], ex["bytes"], ex["t_start"], ex["b0"])]
    s0, s1 = s["t_start"].to_numpy(np.float64), s["t_end"].to_numpy(np.float64)
    b0, b1 = s["b0"].to_numpy(np.float64), s["b1"].to_numpy(np.float64)
    pre = (b0 - s0) - bpre
    post = np.maximum(s1 - comm_end, 0.0) - bpost
    return Structure(world=int(world), batch=float(batch or 1), pre=pre / NS, data=s["data"].to_numpy() / NS,
                     forward=s["forward"].to_numpy() / NS, backward=(b1 - b0) / NS, post=np.maximum(post, 0) / NS,
                     optimizer=s["optimizer"].to_numpy() / NS, ready=ready / NS, sizes=sizes, ops=ops,
                     comm_measured=cm / NS, blocking=blocking_list, step=(s1 - s0) / NS, label=label)


# -- communication models ----------------------------------------------------------
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 1024.0, "mi": 1024.0 ** 2, "gi": 1024.0 ** 3,
           "ti": 1024.0 ** 4}
_TIMES = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def _rate(text: str) -> float:
    """Bytes per second from ``25GB/s``, ``200Gbit/s``, ``200Gb/s`` (b: bits,
    B: bytes), ``900MiB/s``."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]i?)?(bit|b|B)/s\s*", text)
    if not m:
        raise ValueError(f"bandwidth {text!r}: give a number and a unit, e.g. 25GB/s, 200Gbit/s or 200Gb/s")
    value = float(m.group(1)) * _PREFIX[(m.group(2) or "").lower()]
    return value if m.group(3) == "B" else value / 8


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*(ns|us|ms|s)\s*", text)
    if not m:
        raise ValueError(f"latency {text!r}: give a number and ns, us, ms or s, e.g. 5us")
    return float(m.group(1)) * _TIMES[m.group(2)]


def network_terms(spec: str) -> Tuple[cost.Fixed, Optional[int]]:
    """A network a user describes: ``bw=25GB/s,latency=5us,gpus_per_node=8,
    intra_bw=150GB/s,intra_latency=2us,base=8us`` (bw: bus bandwidth per rank
    across nodes; latency: one ring step across nodes; intra_*: inside a
    node) as fixed terms of the cost model, and the ranks per node."""
    kv = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"--network: expected KEY=VALUE, got {part!r}")
        k, v = part.split("=", 1)
        kv[k.strip()] = v.strip()
    known = {"bw", "latency", "gpus_per_node", "intra_bw", "intra_latency", "base"}
    bad = sorted(set(kv) - known)
    if bad:
        raise ValueError(f"--network: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
    if "bw" not in kv:
        raise ValueError("--network needs bw=... (bus bandwidth per rank across nodes, e.g. bw=25GB/s)")
    values = {"inter_bw": _rate(kv["bw"])}
    if "latency" in kv:
        values["inter_lat"] = _duration(kv["latency"])
    if "intra_bw" in kv:
        values["intra_bw"] = _rate(kv["intra_bw"])
    if "intra_latency" in kv:
        values["intra_lat"] = _duration(kv["intra_latency"])
    if "base" in kv:
        values["base"] = _duration(kv["base"])
    try:
        ppn = int(kv["gpus_per_node"]) if "gpus_per_node" in kv else None
    except ValueError:
        raise ValueError(f"--network: gpus_per_node={kv['gpus_per_node']!r} is not a whole number")
    return cost.Fixed(values, "described"), ppn


def network_model(spec: str, backend: str = "nccl") -> cost.CostModel:
    """The cost model of a described network alone (latencies not described:
    NCCL's constants; intra-node bandwidth not described: the network's)."""
    fixed, ppn = network_terms(spec)
    return cost.described(fixed, backend, ppn or 1)


# -- what-ifs ----------------------------------------------------------------------
@dataclass
class WhatIf:
    bucket_cap_mb: Optional[float] = None
    bw_scale: float = 1.0
    lat_scale: float = 1.0
    overlap: bool = True
    name: str = ""


def parse_what_if(text: str) -> WhatIf:
    """``bucket_cap_mb=100``, ``bandwidth=2x``, ``latency=0.5x``, ``overlap=off``."""
    if "=" not in text:
        raise ValueError(f"--what-if expects KEY=VALUE, got {text!r}")
    k, v = (x.strip() for x in text.split("=", 1))
    w = WhatIf(name=f"{k}={v}")
    try:
        if k == "bucket_cap_mb":
            w.bucket_cap_mb = float(v)
            if w.bucket_cap_mb <= 0:
                raise ValueError
        elif k in ("bandwidth", "latency"):
            x = float(v[:-1] if v.endswith("x") else v)
            if x <= 0:
                raise ValueError
            if k == "bandwidth":
                w.bw_scale = x
            else:
                w.lat_scale = x
        elif k == "overlap":
            if v not in ("on", "off"):
                raise ValueError
            w.overlap = v == "on"
        else:
            raise KeyError(k)
    except KeyError:
        raise ValueError(f"--what-if {text!r}: unknown key {k!r}; known: bucket_cap_mb, bandwidth, latency, overlap")
    except ValueError:
        raise ValueError(f"--what-if {text!r}: bad value {v!r}")
    return w


def rebucket(st: Structure, cap_bytes: float) -> Structure:
    """The same backward with buckets of ``cap_bytes``: gradients are taken
    to appear at a constant rate between consecutive measured ready
    instants (bytes of bucket k between r_{k-1} and r_k), new bucket j is
    ready when j x cap bytes exist (the last one holds the rest)."""
    if not st.buckets:
        return st
    total = float(st.sizes.sum())
    k_new = max(1, int(math.ceil(total / cap_bytes)))
    targets = np.minimum(np.arange(1, k_new + 1) * cap_bytes, total)
    cum = np.concatenate([[0.0], np.cumsum(st.sizes)])
    ready = np.empty((st.samples, k_new))
    for i in range(st.samples):
        times = np.concatenate([[0.0], st.ready[i]])
        ready[i] = np.interp(targets, cum, times)
    sizes = np.diff(np.concatenate([[0.0], targets]))
    op = st.ops[0] if st.ops else "all_reduce"
    return replace(st, ready=ready, sizes=sizes, ops=[op] * k_new, comm_measured=np.zeros((st.samples, k_new)))


# -- replay ------------------------------------------------------------------------
@dataclass
class Replayed:
    n: int
    step_s: float                 # mean step time
    lo_s: float
    hi_s: float
    shares: Dict[str, float]      # exposed shares of step time, %
    batch: float                  # per-rank batch
    comm_lo: float = float("nan")  # exposed communication share at the interval's ends, %
    comm_hi: float = float("nan")
    algorithm: str = ""           # the collectives' algorithms at N


_COLS = ("pre", "bwd", "post", "data", "forward", "optimizer")


def replay(st: Structure, n: int, comm: "cost.CostModel | cost.NaiveModel", steps: int = 60, reps: int = 24,
           seed: int = 0, mode: str = "weak", what_if: Optional[WhatIf] = None, jitter: bool = True) -> Replayed:
    """Mean step time (and a 5-95 % interval) of ``st`` replayed on ``n``
    ranks. ``jitter=False`` replays every rank with the sample mean (no
    straggler effect)."""
    w = what_if or WhatIf()
    if w.bucket_cap_mb:
        st = rebucket(st, w.bucket_cap_mb * 1024 * 1024)
    scale = st.world / n if mode == "strong" else 1.0
    cm = replace(comm, bw_scale=comm.bw_scale * w.bw_scale, lat_scale=comm.lat_scale * w.lat_scale)
    est = [cm.estimate(op, s, n) for op, s in zip(st.ops, st.sizes)]
    blk = [(cm.estimate(op, s, n), where) for op, s, where in st.blocking]
    sim = _Sim(st, n, scale, est, blk, steps, jitter, w.overlap)
    means: List[float] = []
    sums: Optional[dict] = None
    for k in range(reps):
        m, s_ = sim.one("point", seed * 1000 + k)
        means.append(m)
        sums = s_ if sums is None else {c: sums[c] + s_[c] for c in _COLS}
    step = float(np.mean(means))
    assert sums is not None
    ends = {bound: [sim.one(bound, seed * 1000 + k) for k in range(max(4, reps // 3))] if n > 1 else []
            for bound in ("lo", "hi")}
    if ends["lo"]:
        lo = float(np.percentile([m for m, _ in ends["lo"]], 5))
        hi = float(np.percentile([m for m, _ in ends["hi"]], 95))
        comm_lo = float(np.mean([sim.comm_share(m, s_) for m, s_ in ends["lo"]]))
        comm_hi = float(np.mean([sim.comm_share(m, s_) for m, s_ in ends["hi"]]))
    else:
        lo, hi = float(np.percentile(means, 5)), float(np.percentile(means, 95))
        comm_lo = comm_hi = float("nan")
    shares = _shares(sums, step * reps * steps * n)
    comm_pct = shares["comm"]
    algos: Dict[str, int] = {}
    for e in est + [e for e, _w in blk]:
        algos[str(e["algorithm"])] = algos.get(str(e["algorithm"]), 0) + 1
    algorithm = ", ".join(f"{a} x{c}" if c > 1 else a for a, c in algos.items() if a != "-")
    return Replayed(n=n, step_s=step, lo_s=min(lo, step), hi_s=max(hi, step), shares=shares,
                    batch=st.batch * scale,
                    comm_lo=min(comm_lo, comm_pct) if comm_lo == comm_lo else comm_lo,
                    comm_hi=max(comm_hi, comm_pct) if comm_hi == comm_hi else comm_hi, algorithm=algorithm)


def _shares(sums: dict, total_time: float) -> Dict[str, float]:
    """Exposed shares (%) of the replayed time: communication is what the
    ranks' own phases leave."""
    data = sums["data"] / total_time * 100
    compute = (sums["forward"] + sums["bwd"] + sums["optimizer"]) / total_time * 100
    busy = (sums["pre"] + sums["bwd"] + sums["post"]) / total_time * 100
    return {"comm": max(0.0, 100 - busy), "data": data, "compute": compute, "other": max(0.0, busy - data - compute)}


class _Sim:
    """The replay of one configuration: per step, each rank's phases drawn
    from the measured samples (or their means), its buckets available as
    its backward reaches them, each bucket's collective after the previous
    one and after every rank has it."""

    def __init__(self, st: Structure, n: int, scale: float, est, blk, steps: int, jitter: bool, overlap: bool):
        key = {"point": "time_s", "lo": "lo_s", "hi": "hi_s"}
        self.st, self.n, self.steps, self.jitter, self.overlap = st, n, steps, jitter, overlap
        self.t_bucket = {b: np.array([e[k] for e in est]) for b, k in key.items()}
        self.t_pre = {b: sum(e[k] for e, where in blk if where == "pre") for b, k in key.items()}
        self.t_post = {b: sum(e[k] for e, where in blk if where != "pre") for b, k in key.items()}
        self.pre = (st.pre - st.data - st.forward) + (st.data + st.forward) * scale
        self.bwd, self.ready = st.backward * scale, st.ready * scale
        self.arrays = dict(pre=self.pre, bwd=self.bwd, post=st.post, data=st.data * scale,
                           forward=st.forward * scale, optimizer=st.optimizer)

    def one(self, bound: str, rep_seed: int):
        """(mean step time, summed phase times) of one repetition."""
        st, n, pre, bwd, ready = self.st, self.n, self.pre, self.bwd, self.ready
        r = np.random.default_rng(rep_seed)
        t = np.zeros(n)
        total = np.zeros(n)
        sums = dict.fromkeys(_COLS, 0.0)
        tb, tpre, tpost = self.t_bucket[bound], self.t_pre[bound], self.t_post[bound]
        for _ in range(self.steps):
            if self.jitter:
                idx = r.integers(0, st.samples, size=n)
                p, b, q = pre[idx], bwd[idx], st.post[idx]
                rd = ready[idx] if st.buckets else None
                for c in _COLS:
                    sums[c] += float(self.arrays[c][idx].sum())
            else:
                p, b, q = np.full(n, pre.mean()), np.full(n, bwd.mean()), np.full(n, st.post.mean())
                rd = np.repeat(ready.mean(axis=0, keepdims=True), n, axis=0) if st.buckets else None
                for c in _COLS:
                    sums[c] += float(self.arrays[c].mean() * n)
            bstart = t + p + tpre
            bend = bstart + b
            end = 0.0
            if st.buckets and n > 1:
                avail = (bstart[:, None] + rd).max(axis=0) if self.overlap else np.full(st.buckets, bend.max())
                for k in range(st.buckets):
                    end = max(avail[k], end) + tb[k]
            done = np.maximum(bend, end) if (st.buckets and n > 1) else bend
            t_next = done + q + tpost
            total += t_next - t
            t = t_next
        return total.sum() / (n * self.steps), sums

    def comm_share(self, mean_step: float, sums) -> float:
        busy = (sums["pre"] + sums["bwd"] + sums["post"]) / (mean_step * self.steps * self.n) * 100
        return max(0.0, 100 - busy)


def measured_row(st: Structure) -> Dict[str, float]:
    """The measured counterpart of :func:`replay`'s numbers, from the same
    samples: mean step time and exposed shares."""
    total = float(st.step.sum())
    data = float(st.data.sum()) / total * 100
    compute = float((st.forward + st.backward + st.optimizer).sum()) / total * 100
    busy = float((st.pre + st.backward + st.post).sum()) / total * 100
    return {"step_s": float(st.step.mean()), "comm": max(0.0, 100 - busy), "data": data, "compute": compute,
            "other": max(0.0, busy - data - compute)}


# -- prediction tables ---------------------------------------------------------------
PREDICT_COLUMNS = ["config", "gpus", "kind", "scenario", "step_ms", "step_ms_lo", "step_ms_hi", "samples_per_s",
                   "samples_per_s_lo", "samples_per_s_hi", "gain_pct",
                   "speedup", "efficiency_pct", "comm_pct", "comm_pct_lo", "comm_pct_hi", "data_pct", "compute_pct",
                   "other_pct", "batch_per_rank", "source_gpus", "algorithm", "comm_model",
                   "comm_pct_constant_busbw", "comm_pct_log2_nodes"]


def predict_table(runs: Sequence[Tuple[str, Structure]], targets: Sequence[int],
                  comm_for: Callable[[str], "cost.CostModel"],
                  mode: str = "weak", what_ifs: Sequence[WhatIf] = (), steps: int = 60, reps: int = 24,
                  seed: int = 0) -> pd.DataFrame:
    """Measured rows for each run, predicted rows for each target N (the
    replay of the configuration's largest measured run with buckets), and
    what-if rows. ``comm_for(config)`` gives the communication model."""
    rows = []
    by_config: Dict[str, List[Structure]] = {}
    for config, st in runs:
        by_config.setdefault(config, []).append(st)
    for config, sts in by_config.items():
        sts = sorted(sts, key=lambda s: s.world)
        comm = comm_for(config)
        base = sts[0]
        base_tput = base.world * base.batch / base.step.mean()
        for st in sts:
            m = measured_row(st)
            rows.append(_row(config, st.world, "measured", "", m["step_s"], m["step_s"], m["step_s"], st.batch,
                             m, base_tput, st.world, "", m["comm"], m["comm"], ""))
        src = next((s for s in reversed(sts) if s.buckets), sts[-1])
        for n in targets:
            for w in [None] + list(what_ifs):
                r = replay(src, n, comm, steps=steps, reps=reps, seed=seed, mode=mode, what_if=w)
                rows.append(_row(config, n, "predicted" if w is None else "what-if", w.name if w else "",
                                 r.step_s, r.lo_s, r.hi_s, r.batch, r.shares, base_tput, src.world,
                                 comm.describe(), r.comm_lo, r.comm_hi, r.algorithm))
                if w is None:
                    rows[-1].update(_naive_shares(src, n, comm, steps, max(4, reps // 3), seed, mode))
    out = pd.DataFrame(rows, columns=PREDICT_COLUMNS)
    # what-ifs: step time gained against the plain prediction at the same N
    base = out[out["kind"] == "predicted"].set_index(["config", "gpus"])["step_ms"]
    wi = out["kind"] == "what-if"
    if wi.any():
        ref = [base.get((c, g), np.nan) for c, g in zip(out.loc[wi, "config"], out.loc[wi, "gpus"])]
        out.loc[wi, "gain_pct"] = 100 * (np.array(ref) - out.loc[wi, "step_ms"].to_numpy()) / np.array(ref)
    return out


def _naive_shares(st: Structure, n: int, comm, steps: int, reps: int, seed: int, mode: str) -> Dict[str, float]:
    """The exposed communication share at N with each naive answer
    (:class:`collmodel.NaiveModel`) in the model's place: NaN where the
    answer cannot be given (one measured count of the target's scope) or
    the model has no measurements behind it."""
    out = {}
    for which in cost.BASELINES:
        naive = cost.NaiveModel(comm, which) if getattr(comm, "baselines", None) is not None else None
        ops = list(zip(st.ops, st.sizes)) + [(op, s) for op, s, _w in st.blocking]
        if naive is None or n <= 1 or not ops or not any(naive.available(op, s, n) for op, s in ops):
            out[f"comm_pct_{which}"] = float("nan")
            continue
        r = replay(st, n, naive, steps=steps, reps=reps, seed=seed, mode=mode)
        out[f"comm_pct_{which}"] = r.shares["comm"]
    return out


def _row(config, n, kind, scenario, step, lo, hi, batch, shares, base_tput, source_gpus, comm_desc, comm_lo,
         comm_hi, algorithm):
    tput = n * batch / step if step > 0 else float("nan")
    return {"config": config, "gpus": int(n), "kind": kind, "scenario": scenario, "step_ms": step * 1e3,
            "step_ms_lo": lo * 1e3, "step_ms_hi": hi * 1e3, "samples_per_s": tput,
            "samples_per_s_lo": n * batch / hi if hi > 0 else float("nan"),
            "samples_per_s_hi": n * batch / lo if lo > 0 else float("nan"), "gain_pct": float("nan"),
            "speedup": tput / base_tput if base_tput else float("nan"), "efficiency_pct": float("nan"),
            "comm_pct": shares["comm"], "comm_pct_lo": comm_lo, "comm_pct_hi": comm_hi,
            "data_pct": shares["data"], "compute_pct": shares["compute"],
            "other_pct": shares["other"], "batch_per_rank": batch, "source_gpus": int(source_gpus),
            "algorithm": algorithm, "comm_model": comm_desc, "comm_pct_constant_busbw": float("nan"),
            "comm_pct_log2_nodes": float("nan")}


def add_efficiency(table: pd.DataFrame, base: Dict[str, Tuple[int, float]]) -> pd.DataFrame:
    """Speedup and parallel efficiency vs each configuration's smallest
    measured run: base = {config: (gpus, samples/s)}."""
    t = table.copy()
    for config, (n0, tput0) in base.items():
        m = t["config"] == config
        t.loc[m, "speedup"] = t.loc[m, "samples_per_s"] / tput0
        t.loc[m, "efficiency_pct"] = 100 * t.loc[m, "speedup"] / (t.loc[m, "gpus"] / n0)
    return t


@dataclass
class Validation:
    rows: pd.DataFrame
    summary: Dict[str, float] = field(default_factory=dict)


VALIDATE_COLUMNS = ["config", "mode", "gpus", "from_gpus", "measured_ms", "predicted_ms", "step_err_pct",
                    "tput_err_pct", "comm_err_pp", "data_err_pp", "compute_err_pp", "coll_err_pct", "comm_model"]


def validate(runs: Sequence[Tuple[str, Structure, pd.DataFrame]],
             fit_for: Callable[[str, List[pd.DataFrame]], "cost.CostModel"], steps: int = 60, reps: int = 24,
             seed: int = 0) -> Validation:
    """Predict each measured size from the others: leave-one-out (structure
    from the nearest other run with buckets, the cost model fitted to the
    others' collectives by ``fit_for(config, instances)``) and from the
    smallest two runs only. ``runs``: (config, structure, collective
    instances) per run. ``coll_err_pct``: the median |error| of the cost
    model alone on the held-out run's busy periods."""
    rows = []
    by_config: Dict[str, List[Tuple[Structure, pd.DataFrame]]] = {}
    for config, st, inst in runs:
        by_config.setdefault(config, []).append((st, inst))
    for config, members in by_config.items():
        members = sorted(members, key=lambda x: x[0].world)
        plans = []
        for i, (st, _inst) in enumerate(members):
            if st.world < 2:  # N = 1 runs without communication (often without a framework): not a target
                continue
            others = [j for j in range(len(members)) if j != i]
            plans.append(("leave-one-out", i, others))
        if len(members) > 2:
            first_two = [0, 1]
            for i in range(2, len(members)):
                plans.append(("from smallest two", i, first_two))
        for mode, i, use in plans:
            target = members[i][0]
            srcs = [members[j][0] for j in use if members[j][0].buckets]
            insts = [members[j][1] for j in use if len(members[j][1])]
            if target.world > 1 and not srcs:
                continue
            if not srcs:
                srcs = [members[j][0] for j in use]
            src = min(srcs, key=lambda s: (abs(s.world - target.world), -s.world))
            try:
                comm = fit_for(config, insts)
            except ValueError:
                continue
            coll_err = float("nan")
            held = members[i][1]
            if len(held):
                periods = cost.busy_periods(held)
                if len(periods):
                    pred = cost.predict_obs(comm.fits[comm.best], periods)
                    meas = np.asarray(periods.time_s)
                    ok = meas > 0
                    if ok.any():
                        coll_err = float(np.median(np.abs(pred[ok] - meas[ok]) / meas[ok]) * 100)
            r = replay(src, target.world, comm, steps=steps, reps=reps, seed=seed)
            m = measured_row(target)
            tput_m = target.world * target.batch / m["step_s"]
            tput_p = target.world * r.batch / r.step_s
            rows.append({"config": config, "mode": mode, "gpus": target.world, "from_gpus": src.world,
                         "measured_ms": m["step_s"] * 1e3, "predicted_ms": r.step_s * 1e3,
                         "step_err_pct": 100 * (r.step_s - m["step_s"]) / m["step_s"],
                         "tput_err_pct": 100 * (tput_p - tput_m) / tput_m,
                         "comm_err_pp": r.shares["comm"] - m["comm"], "data_err_pp": r.shares["data"] - m["data"],
                         "compute_err_pp": r.shares["compute"] - m["compute"], "coll_err_pct": coll_err,
                         "comm_model": comm.describe()})
    t = pd.DataFrame(rows, columns=VALIDATE_COLUMNS)
    summary = {}
    if len(t):
        e = t["step_err_pct"].abs()
        summary = {"median_abs_step_err_pct": float(e.median()), "max_abs_step_err_pct": float(e.max()),
                   "median_coll_err_pct": float(t["coll_err_pct"].median()), "cases": int(len(t))}
    return Validation(t, summary)
