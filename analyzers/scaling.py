"""The table scaling studies build by hand, across runs: one row per GPU
count (world size), grouped by configuration, with the breakdown, step
time, throughput, speedup and parallel efficiency; plus collectives,
arrival skew, stragglers and the study-shaped side-by-side table.

A configuration is the tuple of run-metadata values named by ``group_by``
(default: framework, loader, model, batch_size, then any user labels).

Scaling: within a configuration the smallest GPU count measured, N0, is the
baseline. speedup(N) = throughput(N) / throughput(N0); efficiency(N) =
speedup(N) / (N / N0). The mode is *weak* when the per-rank batch is the
same at every count (the global batch grows), *strong* when the global
batch is the same (with fixed total work, time-to-solution scales as
1/throughput, so the same formulas hold). Epoch time = dataset size /
samples/s when the dataset size is known.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import breakdown, buckets, clocks, kernels, nodes, slowlinks, stragglers, throughput
from .collectives import CollectiveStats
from ..trace.metadata import batch_size as infer_batch_size
from ..trace.schema import CAT
from .events import Events
from .timeline import timeline

DEFAULT_GROUP_BY = ("framework", "loader", "model", "batch_size")
_COMPACT = {"step_time": np.float32, "data": np.float32, "comm": np.float32, "compute": np.float32,
            "other": np.float32, "comm_busy": np.float32, "data_busy": np.float32,
            "compute_busy": np.float32, "overlap": np.float32, "items": np.float32,
            "rank": np.int32, "step": np.int32}


@dataclass
class RunAnalysis:
    label: str
    meta: dict
    world_size: int
    steps: pd.DataFrame            # measured per-step rows (compact dtypes)
    colls: CollectiveStats
    batch_size: Optional[int]
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    telemetry: pd.DataFrame = field(default_factory=pd.DataFrame)       # per rank (GPU metrics)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)          # Horovod timeline phases
    kernel_shares: pd.DataFrame = field(default_factory=pd.DataFrame)   # per rank
    gpu_breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)   # per rank (HTA definitions)
    clocks: pd.DataFrame = field(default_factory=pd.DataFrame)          # per host: clock alignment
    offsets: Dict[int, int] = field(default_factory=dict)               # per rank: ns added to its times
    hosts: Dict[int, str] = field(default_factory=dict)                 # per rank: host name
    nodes: pd.DataFrame = field(default_factory=pd.DataFrame)           # per host (multi-host runs)
    scope: pd.DataFrame = field(default_factory=pd.DataFrame)           # collectives intra / inter node
    links: pd.DataFrame = field(default_factory=pd.DataFrame)           # inter-node groups' transfer speeds
    #: the fine grain (analyzers/buckets.py), aligned clocks, <= buckets.MAX_STEPS steps per rank
    fine_phases: pd.DataFrame = field(default_factory=pd.DataFrame)     # per (rank, step)
    fine_grads: pd.DataFrame = field(default_factory=pd.DataFrame)      # per (rank, step, bucket)
    #: seconds spent per analysis stage (``commprof report --timings``)
    timings: Dict[str, float] = field(default_factory=dict)

    @property
    def n_steps(self) -> int:
        return int(self.steps.groupby("rank").size().max()) if not self.steps.empty else 0

    @property
    def n_ranks(self) -> int:
        return int(self.steps["rank"].nunique()) if not self.steps.empty else 0


def config_label(meta: dict, group_by: Optional[Sequence[str]] = None) -> str:
    keys = list(group_by) if group_by else list(DEFAULT_GROUP_BY) + sorted((meta.get("labels") or {}))
    parts = []
    for k in keys:
        v = meta.get(k)
        if v is None:
            v = (meta.get("labels") or {}).get(k)
        if v is None:
            continue
        parts.append(f"bs={v}" if k == "batch_size" else str(v))
    return " / ".join(parts) if parts else "run"


def analyze_chunks(chunks, meta: dict, rank_metas: List[dict], warmup: int = 1,
                   batch_size: Optional[int] = None, group_by: Optional[Sequence[str]] = None) -> RunAnalysis:
    """Analyse a run given an iterable of Arrow tables, each holding whole ranks."""
    parts: List[pd.DataFrame] = []
    colls = CollectiveStats()
    comms: List = []
    # several hosts: the collectives are kept until the clocks are aligned;
    # one host: folded as they come (memory bounded by one chunk)
    multi_host = len(set(clocks.domains(rank_metas).values())) > 1
    tl = pd.DataFrame()
    kshares: List[pd.DataFrame] = []
    kbreak: List[pd.DataFrame] = []
    teles: List[pd.DataFrame] = []
    phases: List[pd.DataFrame] = []
    fine_ph: List[pd.DataFrame] = []
    fine_gr: List[pd.DataFrame] = []
    tl_src = None

    spent: Dict[str, float] = {}
    t_start = time.perf_counter()
    lock = threading.Lock()

    def work(chunk):
        c0 = time.thread_time()
        try:
            return _work(chunk)
        finally:
            with lock:
                key = "per-chunk sweep, CPU in the workers"
                spent[key] = spent.get(key, 0.0) + time.thread_time() - c0

    def _work(chunk):
        ev = Events.of(chunk)
        steps = breakdown.measured(breakdown.per_step(ev), warmup)
        if steps.empty:
            return steps, (None, None, None, None, None)
        comm = None
        is_comm = ev.cat == CAT["comm"]
        if is_comm.any():
            span = steps.groupby("rank")["step"].agg(["min", "max"])
            ranks = span.index.to_numpy(np.int64)
            pos = np.clip(np.searchsorted(ranks, ev.rank), 0, len(ranks) - 1)
            keep = is_comm & (ranks[pos] == ev.rank) & (ev.step >= span["min"].to_numpy()[pos]) \
                & (ev.step <= span["max"].to_numpy()[pos])
            comm = chunk.filter(pa_mask(keep))
            if multi_host:      # kept until the clocks are aligned: only what the folds read
                comm = comm.select([c for c in COMM_COLUMNS if c in comm.column_names and not (
                    c.startswith("dev_") and comm.column(c).null_count == comm.num_rows)])
        kern = None
        is_kernel = ev.cat == CAT["kernel"]
        if is_kernel.any():
            kt = chunk.filter(pa_mask(is_kernel | (ev.cat == CAT["step"]))).select(
                ["rank", "step", "category", "name", "detail", "t_start", "t_end"]).to_pandas()
            kern = kernels.kernel_views(kt, hta_window=True)
        tele = None
        is_metric = ev.cat == CAT["metric"]
        if is_metric.any():
            m = chunk.filter(pa_mask(is_metric)).select(["rank", "name", "value"]).to_pandas()
            m = m[m["name"].astype(str).str.startswith("gpu.")]
            if len(m):
                tele = telemetry_per_rank(m)
        fine = None
        keep_fine = (ev.cat == CAT["compute"]) | (ev.cat == CAT["comm"]) | (ev.cat == CAT["data"]) | \
            (ev.cat == CAT["wait"])
        sampled = buckets.sampled_steps(steps)
        if keep_fine.any():     # only the sampled steps' events become pandas rows
            keep_fine &= buckets.in_steps(ev.rank, ev.step, sampled)
        if keep_fine.any():
            fe = chunk.filter(pa_mask(keep_fine)).select(
                ["rank", "step", "category", "name", "source", "detail", "t_start", "t_end", "bytes",
                 "blocking"]).to_pandas()
            fine = buckets.rank_rows(fe, steps, sampled=sampled)
        phase = None
        is_phase = ev.cat == CAT["phase"]
        if is_phase.any():
            ph = chunk.filter(pa_mask(is_phase)).select(["name", "detail", "t_start", "t_end"]).to_pandas()
            phase = ph[ph["name"].astype(str) != "ready"].assign(
                name=lambda d: d["name"].astype(str), ms=lambda d: (d["t_end"] - d["t_start"]) / 1e6)
        return steps.drop(columns=["t_start", "t_end"]).astype(_COMPACT), (comm, kern, tele, phase, fine)

    # Two chunks in flight: numpy's sorts and scans release the GIL, so the
    # sweep of one chunk runs beside the decoding / folding of another.
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending: deque = deque()
        chunks = iter(chunks)
        done = False
        while pending or not done:
            while not done and len(pending) < 2:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    done = True
                    break
                pending.append((chunk, pool.submit(work, chunk)))
            if not pending:
                break
            chunk, fut = pending.popleft()
            steps, (comm, kern, tele, phase, fine) = fut.result()
            if steps.empty:
                continue
            parts.append(steps)
            if tele is not None:
                teles.append(tele)
            if phase is not None:
                phases.append(phase)
            if fine is not None:
                fine_ph.append(fine[0])
                fine_gr.append(fine[1])
            if kern is not None:
                kshares.append(kern[0])
                kbreak.append(kern[1])
            if comm is not None:
                if multi_host:      # the sketches need no offsets: folded while the workers sweep
                    colls.add_calls_of(comm)
                    comms.append(comm)
                else:
                    colls.add(comm)
            if tl.empty and tl_src is None:
                if multi_host:  # drawn once the hosts' clocks are aligned
                    tl_src = (_small_window(chunk, steps), steps)
                else:
                    tl = timeline(_small_window(chunk, steps), steps)
            del chunk
    spent["read and per-chunk sweep (wall)"] = time.perf_counter() - t_start
    # hosts' clocks are aligned from all ranks' collectives before the
    # cross-rank statistics (arrival skew) are folded
    t0 = time.perf_counter()
    cframe = _align_frame(comms) if multi_host else None
    offsets, clock_table = clocks.align(cframe, rank_metas)
    spent["clock alignment"] = time.perf_counter() - t0
    hosts = {r: d[0] for r, d in clocks.domains(rank_metas).items()}
    several = len(set(hosts.values())) > 1
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) as pool:
        # the per-scope and per-link tables read the aligned frame only:
        # built beside the fold of the instances
        side = pool.submit(lambda: (nodes.scope_table(cframe, hosts), slowlinks.group_speeds(cframe, hosts))
                           if several else (pd.DataFrame(), pd.DataFrame()))
        while comms:                    # each chunk freed once folded
            colls.add_instances_of(comms.pop(0), offsets)
        scope, links = side.result()
    if multi_host:
        spent["collectives folded; scope and link tables"] = time.perf_counter() - t0
    if tl_src is not None:
        win = tl_src[0].copy()
        off = win["rank"].map(offsets).fillna(0).astype(np.int64)
        win["t_start"] = win["t_start"] + off
        win["t_end"] = win["t_end"] + off
        tl = timeline(win, tl_src[1])
    steps = pd.concat(parts, ignore_index=True) if parts else \
        pd.DataFrame(columns=[c for c in breakdown.STEP_COLUMNS if c not in ("t_start", "t_end")])
    del parts
    meta = dict(meta)
    if batch_size is not None:
        meta["batch_size"] = batch_size
    elif "batch_size" not in meta and len(steps):
        inferred = infer_batch_size(steps["items"].tolist())
        if inferred is not None:
            meta["batch_size"] = inferred
    world = int(meta.get("world_size") or 1)
    if meta.get("framework") is None and world == 1:
        meta["framework"] = "none"
    fph = pd.concat(fine_ph, ignore_index=True) if fine_ph else pd.DataFrame(columns=buckets.PHASE_COLUMNS)
    fgr = pd.concat(fine_gr, ignore_index=True) if fine_gr else pd.DataFrame(columns=buckets.GRAD_COLUMNS)
    fph, fgr = buckets.shifted(fph, fgr, offsets)
    flops = model_flops(rank_metas)
    if flops:
        meta["fwd_flops_per_sample"] = flops
    names = next((m.get("ddp_buckets") for m in sorted(rank_metas, key=lambda r: r.get("rank", 0))
                  if m.get("ddp_buckets")), None)
    if names:
        meta["ddp_buckets"] = names
    t0 = time.perf_counter()
    per_host = nodes.per_host(steps, colls.rank_lateness(), hosts, cframe)
    spent["per-host table"] = time.perf_counter() - t0
    return RunAnalysis(config_label(meta, group_by), meta, world, steps, colls, batch_size, tl,
                       pd.concat(teles, ignore_index=True) if teles else pd.DataFrame(),
                       pd.concat(phases, ignore_index=True) if phases else pd.DataFrame(),
                       pd.concat(kshares, ignore_index=True) if kshares else pd.DataFrame(),
                       pd.concat(kbreak, ignore_index=True) if kbreak else pd.DataFrame(),
                       clock_table, offsets, hosts, per_host, scope, links, fph, fgr, timings=spent)


def model_flops(rank_metas: List[dict]) -> Optional[float]:
    """Forward FLOPs per sample of the model, counted by the recorder on the
    first batch (torch.utils.flop_counter; the largest root module, rank
    0 first)."""
    for m in sorted(rank_metas, key=lambda r: r.get("rank", 0)):
        mf = m.get("model_flops") or {}
        best = max(mf.values(), key=lambda v: v.get("flops", 0), default=None)
        if best and best.get("flops") and best.get("items"):
            return float(best["flops"]) / float(best["items"])
    return None


#: the columns of the collectives a multi-host run keeps until its clocks
#: are aligned (CollectiveStats, clock alignment, per-scope and link tables)
COMM_COLUMNS = ["rank", "name", "source", "group", "group_size", "seq", "dtype", "t_start", "t_end",
                "dev_start", "dev_end", "bytes", "blocking"]


def _align_frame(comms) -> Optional[pd.DataFrame]:
    """The columns clock alignment needs, completion on the device where measured."""
    if not comms:
        return None
    from .events import device_times

    frames = []
    for c in comms:
        cols = [x for x in ("rank", "name", "group", "group_size", "seq", "t_start", "t_end", "blocking", "bytes")
                if x in c.column_names]
        f = c.select(cols).to_pandas()
        dev = device_times(c)
        if dev is not None:
            d0, d1, has = dev
            f["t_end"] = np.where(has, d1, f["t_end"].to_numpy())
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def pa_mask(mask: np.ndarray):
    return pa.array(mask, type=pa.bool_())


def _small_window(chunk, steps: pd.DataFrame) -> pd.DataFrame:
    """The events of the chunk's first 8 ranks, as pandas, for the timeline."""
    ranks = sorted(steps["rank"].unique())[:8]
    sub = chunk.filter(pc.is_in(chunk.column("rank"), value_set=pa.array(ranks, pa.int32())))
    return sub.select([c for c in ("rank", "step", "category", "name", "t_start", "t_end")
                       if c in sub.column_names]).to_pandas()


def _groups(runs: List[RunAnalysis]) -> Dict[tuple, List[RunAnalysis]]:
    groups: Dict[tuple, List[RunAnalysis]] = {}
    for r in runs:
        groups.setdefault((r.label, r.world_size), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])))


def _steps_of(members: List[RunAnalysis]) -> pd.DataFrame:
    if len(members) == 1:
        return members[0].steps
    frames = []
    for i, r in enumerate(members):
        s = r.steps.copy()
        s["rank"] = s["rank"].astype(np.int64) + i * 1_000_000  # keep runs apart
        frames.append(s)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=breakdown.STEP_COLUMNS)


def _nanmean(values) -> float:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(v.mean()) if len(v) else float("nan")


def adopt_baselines(runs: List[RunAnalysis], group_by: Optional[Sequence[str]] = None) -> List[RunAnalysis]:
    """The 1-GPU baseline: a single-process run without a framework
    (``framework`` "none") becomes the N = 1 row of every configuration it
    matches on the other keys (loader, model, batch size, labels), so that
    the scaling table has its 1 -> N rows. Only with the default grouping
    (a user's ``group_by`` is taken as given); a baseline that matches no
    multi-GPU configuration stays as it is."""
    if group_by:
        return runs
    out: List[RunAnalysis] = []
    others = [r for r in runs if not (r.world_size == 1 and r.meta.get("framework") == "none")]

    def key(meta):
        keys = [k for k in DEFAULT_GROUP_BY if k != "framework"]
        return tuple(str(meta.get(k)) for k in keys) + tuple(sorted((meta.get("labels") or {}).items()))

    for r in runs:
        if r.world_size == 1 and r.meta.get("framework") == "none":
            frameworks = sorted({str(o.meta.get("framework")) for o in others
                                 if key(o.meta) == key(r.meta) and o.meta.get("framework") not in (None, "none")})
            if frameworks:
                for fw in frameworks:
                    meta = dict(r.meta, framework=fw, baseline_of=fw)
                    out.append(replace(r, label=config_label(meta), meta=meta))
                continue
        out.append(r)
    return out


def breakdown_table(runs: List[RunAnalysis]) -> pd.DataFrame:
    rows = []
    for (label, gpus), members in _groups(runs).items():
        steps = _steps_of(members)
        if steps.empty:
            continue
        sh = breakdown.shares(steps)
        iv = breakdown.share_intervals(steps)
        tps = [throughput.throughput(r.steps, r.batch_size) for r in members]
        lo, hi = breakdown.rank_spread(steps, "comm")
        meta = members[0].meta
        samples = _nanmean([t["samples_per_s"] for t in tps])
        dataset = meta.get("dataset_size")
        rows.append({
            "config": label, "gpus": gpus, "runs": len(members),
            "steps": int(np.mean([t["steps"] for t in tps])),
            "comm_pct": sh["comm"], "data_pct": sh["data"], "compute_pct": sh["compute"],
            "other_pct": sh["other"], "comm_busy_pct": sh["comm_busy"], "data_busy_pct": sh["data_busy"],
            "compute_busy_pct": sh["compute_busy"], "overlap_pct": sh["overlap"],
            "comm_pct_rank_min": lo, "comm_pct_rank_max": hi,
            **{f"{c}_pct_{e}": iv[f"{c}_{e}"] for c in breakdown.CATEGORIES for e in ("lo", "hi")},
            "share_steps": iv["steps_n"],
            "imbalance_pct": _nanmean([stragglers.imbalance_pct(r.steps) for r in members]),
            "step_ms_median": float(np.median(steps["step_time"]) / 1e6),
            "step_ms_p95": float(np.percentile(steps["step_time"], 95) / 1e6),
            "steps_per_s": _nanmean([t["steps_per_s"] for t in tps]),
            "samples_per_s": samples,
            "batch_per_rank": _nanmean([t["batch_per_rank"] for t in tps]),
            "epoch_s": float(dataset) / samples if dataset and samples > 0 else np.nan,
            "loader": meta.get("loader"), "loader_workers": meta.get("loader_workers"),
            **flops_columns(meta, samples, gpus),
        })
    table = pd.DataFrame(rows)
    return add_scaling(table)


#: dense 16-bit tensor-core peak, TFLOP/s per GPU (vendor data sheets; SXM parts)
PEAK_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "GH200": 989.0, "B200": 2250.0,
               "A100": 312.0, "A800": 312.0, "A30": 165.0, "A10": 125.0, "L40S": 362.0, "L40": 181.0,
               "L4": 121.0, "V100": 125.0, "T4": 65.0, "RTX 4090": 165.0, "RTX 3090": 71.0, "MI300X": 1307.0,
               "MI250X": 383.0}
#: a user's peak (``commprof report --peak-tflops``) overrides the table
PEAK_OVERRIDE: Dict[str, float] = {}


def peak_tflops(device: Optional[str]) -> Optional[float]:
    if PEAK_OVERRIDE.get("peak"):
        return PEAK_OVERRIDE["peak"]
    if not device:
        return None
    for name in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if name.lower() in device.lower():
            return PEAK_TFLOPS[name]
    return None


def flops_columns(meta: dict, samples_per_s: float, gpus: int) -> dict:
    """Achieved model TFLOP/s per GPU (3 x forward FLOPs per sample: the
    backward costs about twice the forward) and MFU against the device's
    peak where known."""
    f = meta.get("fwd_flops_per_sample")
    if not f or not samples_per_s or samples_per_s != samples_per_s:
        return {"model_tflops": np.nan, "tflops_per_gpu": np.nan, "mfu_pct": np.nan}
    per_gpu = 3.0 * f * samples_per_s / max(gpus, 1) / 1e12
    peak = peak_tflops(meta.get("device_name"))
    return {"model_tflops": 3.0 * f / 1e12, "tflops_per_gpu": per_gpu,
            "mfu_pct": 100.0 * per_gpu / peak if peak else np.nan}


def add_scaling(table: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency vs the smallest GPU count of each config
    (none for a configuration measured at one GPU count: nothing is known
    about its scaling)."""
    if table.empty:
        return table
    table = table.copy()
    table["speedup"] = np.nan
    table["efficiency_pct"] = np.nan
    table["baseline_gpus"] = np.nan
    table["scaling"] = ""
    for config, g in table.groupby("config"):
        g = g.sort_values("gpus")
        base = g.iloc[0]
        n0, t0 = base["gpus"], base["samples_per_s"]
        per_rank = g["batch_per_rank"].round(6)
        global_b = (g["batch_per_rank"] * g["gpus"]).round(6)
        mode = "weak" if per_rank.nunique() == 1 else ("strong" if global_b.nunique() == 1 else "mixed")
        several = g["gpus"].nunique() > 1
        for idx, r in g.iterrows():
            if several and t0 and t0 > 0 and not np.isnan(r["samples_per_s"]):
                sp = r["samples_per_s"] / t0
                table.loc[idx, "speedup"] = sp
                table.loc[idx, "efficiency_pct"] = 100.0 * sp / (r["gpus"] / n0)
            table.loc[idx, "baseline_gpus"] = n0
            table.loc[idx, "scaling"] = mode if len(g) > 1 else ""
    return table


def study_table(table: pd.DataFrame, busy: bool = True) -> pd.DataFrame:
    """The study's shape: rows = GPU counts, column groups = configurations,
    each with comm / data / compute shares (busy shares by default, as
    scaling papers report them: not forced to 100 %) and efficiency."""
    if table.empty:
        return pd.DataFrame()
    cols = ({"comm_busy_pct": "comm %", "data_busy_pct": "data %", "compute_busy_pct": "compute %"} if busy
            else {"comm_pct": "comm %", "data_pct": "data %", "compute_pct": "compute %"})
    cols["efficiency_pct"] = "eff %"
    wide = table.pivot_table(index="gpus", columns="config", values=list(cols), aggfunc="first")
    out = pd.DataFrame(index=wide.index)
    for config in table["config"].drop_duplicates():
        for col, name in cols.items():
            out[f"{config} | {name}"] = wide[(col, config)] if (col, config) in wide else np.nan
    out = out.reset_index()
    out["gpus"] = out["gpus"].astype(int)
    return out


def telemetry_per_rank(m: pd.DataFrame) -> pd.DataFrame:
    """GPU telemetry per rank: mean utilisation, peak memory, mean power,
    mean SM clock, samples."""
    g = m.assign(name=m["name"].astype(str)).groupby(["rank", "name"])["value"]
    mean, peak, n = g.mean().unstack(), g.max().unstack(), g.size().unstack()
    out = pd.DataFrame({"rank": mean.index.astype(int)})
    for col, src, name in (("util_pct", mean, "gpu.util"), ("mem_peak_mib", peak, "gpu.mem_used_mib"),
                           ("power_w", mean, "gpu.power_w"), ("sm_clock_mhz", mean, "gpu.sm_clock_mhz"),
                           ("samples", n, "gpu.util")):
        out[col] = src[name].to_numpy() if name in src else np.nan
    return out


def phase_table(runs: List[RunAnalysis]) -> pd.DataFrame:
    """Horovod timeline phases per config and GPU count: count, total and
    mean ms, tensors; NEGOTIATE_* is time spent waiting for every rank to
    report the tensor ready."""
    frames = []
    for (label, gpus), members in _groups(runs).items():
        ph = [m.phases for m in members if len(m.phases)]
        if not ph:
            continue
        p = pd.concat(ph, ignore_index=True)
        t = p.groupby("name").agg(count=("ms", "size"), total_ms=("ms", "sum"), mean_ms=("ms", "mean"),
                                  max_ms=("ms", "max"), tensors=("detail", "nunique")).reset_index()
        t.insert(0, "gpus", gpus)
        t.insert(0, "config", label)
        frames.append(t.sort_values("total_ms", ascending=False))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def telemetry_table(runs: List[RunAnalysis]) -> pd.DataFrame:
    frames = []
    for (label, gpus), members in _groups(runs).items():
        for m in members:
            if len(m.telemetry):
                t = m.telemetry.copy()
                t.insert(0, "gpus", gpus)
                t.insert(0, "config", label)
                frames.append(t)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def kernel_tables(runs: List[RunAnalysis]):
    """(kernel-time shares, GPU temporal breakdown) per config and GPU
    count, averaged over ranks; empty frames when no run has kernels."""
    shares, gpu = [], []
    for (label, gpus), members in _groups(runs).items():
        ks = [m.kernel_shares for m in members if len(m.kernel_shares)]
        if ks:
            k = pd.concat(ks, ignore_index=True).fillna(0.0)
            row = k.drop(columns=["rank"]).mean().to_dict()
            shares.append({"config": label, "gpus": gpus, "ranks": len(k), **row})
        gb = [m.gpu_breakdown for m in members if len(m.gpu_breakdown)]
        if gb:
            g = pd.concat(gb, ignore_index=True)
            row = g.drop(columns=["rank"]).mean().to_dict()
            gpu.append({"config": label, "gpus": gpus, "ranks": len(g), **row})
    return pd.DataFrame(shares), pd.DataFrame(gpu)


def collectives_table(runs: List[RunAnalysis]) -> pd.DataFrame:
    frames = []
    for (label, gpus), members in _groups(runs).items():
        for m in members:
            t = m.colls.table(m.n_steps, m.n_ranks)
            if t.empty:
                continue
            t.insert(0, "gpus", gpus)
            t.insert(0, "config", label)
            frames.append(t)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def skew_tables(runs: List[RunAnalysis]) -> Dict[tuple, pd.DataFrame]:
    out = {}
    for key, members in _groups(runs).items():
        tables = [m.colls.skew_table() for m in members]
        tables = [t for t in tables if len(t)]
        if tables:
            out[key] = pd.concat(tables, ignore_index=True)
    return out


def straggler_tables(runs: List[RunAnalysis]) -> Dict[tuple, pd.DataFrame]:
    out = {}
    for key, members in _groups(runs).items():
        tables = [stragglers.stragglers(m.steps, m.colls.rank_lateness(), m.colls.last_by_block(m.n_steps))
                  for m in members]
        tables = [t for t in tables if len(t)]
        if tables:
            out[key] = pd.concat(tables, ignore_index=True)
    return out


def run_tables(runs: List[RunAnalysis], attr: str) -> Dict[tuple, pd.DataFrame]:
    """A per-run table (clocks, nodes, scope) of every run that has one, by (label, GPUs)."""
    out = {}
    for key, members in _groups(runs).items():
        tables = [getattr(m, attr) for m in members if len(getattr(m, attr))]
        if tables:
            out[key] = pd.concat(tables, ignore_index=True)
    return out


def stack(tables: Dict[tuple, pd.DataFrame]) -> pd.DataFrame:
    frames = []
    for (label, gpus), t in tables.items():
        t = t.copy()
        t.insert(0, "gpus", gpus)
        t.insert(0, "config", label)
        frames.append(t)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
