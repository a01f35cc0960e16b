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

from dataclasses import replace
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from . import breakdown, stragglers, throughput
from .run import DEFAULT_GROUP_BY, RunAnalysis, config_label

__all__ = ["RunAnalysis", "adopt_baselines", "breakdown_table", "study_table", "add_scaling"]


def run_groups(runs: List[RunAnalysis]) -> Dict[tuple, List[RunAnalysis]]:
    """The runs by (configuration label, GPU count), in that order."""
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


def breakdown_table(runs: List[RunAnalysis], peak: Optional[float] = None) -> pd.DataFrame:
    """One row per (configuration, GPU count); ``peak``: the GPU's peak
    TFLOP/s for MFU (None: known devices by name)."""
    rows = []
    for (label, gpus), members in run_groups(runs).items():
        steps = _steps_of(members)
        if steps.empty:
            continue
        fig = members[0].step_figures if len(members) == 1 else None     # breakdown.step_figures
        if fig is not None and fig["of"] is steps and members[0].batch_size == fig["batch_size"]:
            tps, imbalance = [fig["throughput"]], [fig["imbalance"]]
        else:
            fig = breakdown.share_figures(steps)
            tps = [throughput.throughput(r.steps, r.batch_size) for r in members]
            imbalance = [stragglers.imbalance_pct(r.steps) for r in members]
        sh, iv, (lo, hi) = fig["shares"], fig["intervals"], fig["spread"]
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
            "imbalance_pct": _nanmean(imbalance),
            "step_ms_median": fig["median"], "step_ms_p95": fig["p95"],
            "steps_per_s": _nanmean([t["steps_per_s"] for t in tps]),
            "samples_per_s": samples,
            "batch_per_rank": _nanmean([t["batch_per_rank"] for t in tps]),
            "epoch_s": float(dataset) / samples if dataset and samples > 0 else np.nan,
            "loader": meta.get("loader"), "loader_workers": meta.get("loader_workers"),
            "framework": meta.get("framework"),
            **flops_columns(meta, samples, gpus, peak),
        })
    table = pd.DataFrame(rows)
    return add_scaling(table)


#: dense 16-bit tensor-core peak, TFLOP/s per GPU (vendor data sheets; SXM parts)
PEAK_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "GH200": 989.0, "B200": 2250.0,
               "A100": 312.0, "A800": 312.0, "A30": 165.0, "A10": 125.0, "L40S": 362.0, "L40": 181.0,
               "L4": 121.0, "V100": 125.0, "T4": 65.0, "RTX 4090": 165.0, "RTX 3090": 71.0, "MI300X": 1307.0,
               "MI250X": 383.0}


def peak_tflops(device: Optional[str]) -> Optional[float]:
    """The device's peak from :data:`PEAK_TFLOPS` (longest name contained
    in the device's name), or None."""
    if not device:
        return None
    for name in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if name.lower() in device.lower():
            return PEAK_TFLOPS[name]
    return None


def flops_columns(meta: dict, samples_per_s: float, gpus: int, peak: Optional[float] = None) -> dict:
    """Achieved model TFLOP/s per GPU (3 x forward FLOPs per sample: the
    backward costs about twice the forward) and MFU against ``peak`` (a
    user's, ``commprof report --peak-tflops``) or the device's where known."""
    f = meta.get("fwd_flops_per_sample")
    if not f or not samples_per_s or samples_per_s != samples_per_s:
        return {"model_tflops": np.nan, "tflops_per_gpu": np.nan, "mfu_pct": np.nan}
    per_gpu = 3.0 * f * samples_per_s / max(gpus, 1) / 1e12
    peak = peak or peak_tflops(meta.get("device_name"))
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


def phase_table(runs: List[RunAnalysis]) -> pd.DataFrame:
    """Horovod timeline phases per config and GPU count: count, total and
    mean ms, tensors; NEGOTIATE_* is time spent waiting for every rank to
    report the tensor ready."""
    frames = []
    for (label, gpus), members in run_groups(runs).items():
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
    for (label, gpus), members in run_groups(runs).items():
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
    for (label, gpus), members in run_groups(runs).items():
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
    for (label, gpus), members in run_groups(runs).items():
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
    for key, members in run_groups(runs).items():
        tables = [m.colls.skew_table() for m in members]
        tables = [t for t in tables if len(t)]
        if tables:
            out[key] = pd.concat(tables, ignore_index=True)
    return out


def straggler_tables(runs: List[RunAnalysis]) -> Dict[tuple, pd.DataFrame]:
    return straggler_verdicts(straggler_inputs(runs))


def straggler_inputs(runs: List[RunAnalysis]) -> Dict[tuple, list]:
    """What the straggler tests read of each run, by (label, GPUs): its
    steps and two small summaries of its collectives (taken here, so that
    :func:`straggler_verdicts` touches nothing the other tables read)."""
    return {key: [(m.steps, m.colls.rank_lateness(), m.colls.last_by_block(m.n_steps), m.step_stragglers)
                  for m in members]
            for key, members in run_groups(runs).items()}


def straggler_verdicts(inputs: Dict[tuple, list]) -> Dict[tuple, pd.DataFrame]:
    """The straggler tables from :func:`straggler_inputs`."""
    out = {}
    for key, members in inputs.items():
        tables = [stragglers.stragglers(steps, lateness, last, done) for steps, lateness, last, done in members]
        tables = [t for t in tables if len(t)]
        if tables:
            out[key] = pd.concat(tables, ignore_index=True)
    return out


def run_tables(runs: List[RunAnalysis], attr: str) -> Dict[tuple, pd.DataFrame]:
    """A per-run table (clocks, nodes, scope) of every run that has one, by (label, GPUs)."""
    out = {}
    for key, members in run_groups(runs).items():
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
