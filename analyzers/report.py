"""The report pipeline: which tables, in which order, with which columns
and notes. Input: analysed runs (:func:`analyze_run` over chunks of trace
events); output: a :class:`Report` that any renderer formats. Both the
command line (``commprof report``) and the notebook API call this."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import pandas as pd

from ..trace import schema as _schema
from ..trace.schema import TraceFormatError
# Report, Table and ColumnSpec live at the bottom (trace/tables.py) so that renderers import no analyzer;
# importing them from here keeps working.
from ..trace.tables import ColumnSpec, Report, Table  # noqa: F401
from . import evidence, stragglers


#: The trace columns the report reads.
#: the columns the report reads: all of them (the trace schema's, in file
#: order; commprof report starts reading them before this module loads)
REPORT_COLUMNS = list(_schema.TRACE_SCHEMA.names)

BREAKDOWN_COLUMNS = [  # most important first: a narrow terminal shows these, the rest continue below
    ("config", "configuration", ""), ("gpus", "GPUs", "d"),
    ("comm_pct", "comm %", ".1f"), ("data_pct", "data %", ".1f"),
    ("compute_pct", "compute %", ".1f"), ("other_pct", "other %", ".1f"),
    ("step_ms_median", "step ms p50", ".2f"), ("samples_per_s", "samples/s", ".1f"),
    ("speedup", "speedup", ".2f"), ("efficiency_pct", "eff %", ".1f"),
    ("comm_busy_pct", "comm busy %", ".1f"), ("overlap_pct", "overlap %", ".1f"),
    ("imbalance_pct", "imbal %", ".1f"),
    ("comm_pct_rank_min", "comm % min rank", ".1f"), ("comm_pct_rank_max", "comm % max rank", ".1f"),
    ("step_ms_p95", "step ms p95", ".2f"), ("steps_per_s", "steps/s", ".3f"),
    ("batch_per_rank", "batch/rank", ".0f"), ("epoch_s", "epoch s", ".1f"),
    ("tflops_per_gpu", "TFLOP/s per GPU", ".4g"), ("mfu_pct", "MFU %", ".1f"),
    ("runs", "runs", "d"), ("steps", "steps", "d"),
]
COLLECTIVE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("op", "collective", ""),
    ("source", "issued by", ""), ("size", "message size", ""), ("calls", "calls", "d"),
    ("calls_per_step", "calls/step", ".1f"), ("bytes_per_call", "bytes/call", ",.0f"),
    ("lat_ms_mean", "lat ms mean", ".3f"), ("lat_ms_p50", "lat ms p50", ".3f"),
    ("lat_ms_p95", "lat ms p95", ".3f"), ("algbw_GBps", "algbw GB/s", ".3f"),
    ("busbw_GBps", "busbw GB/s", ".3f"),
]
SKEW_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("op", "collective", ""),
    ("instances", "instances", "d"), ("skew_ms_mean", "skew ms mean", ".3f"),
    ("skew_ms_p95", "skew ms p95", ".3f"), ("transfer_ms_mean", "transfer ms", ".3f"),
    ("wait_pct", "waiting %", ".1f"),
]
STRAGGLER_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("rank", "rank", "d"), ("metric", "metric", ""),
    ("late_steps", "late steps", "d"), ("steps", "of steps", "d"), ("excess_ms", "excess ms", ".2f"),
    ("value_ms", "rank ms", ".2f"), ("median_ms", "median ms", ".2f"), ("p", "p (corrected)", ".2g"),
]
NODE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("host", "host", ""), ("ranks", "ranks", ""),
    ("step_ms", "step ms", ".2f"), ("work_ms", "work ms", ".2f"), ("comm_pct", "comm %", ".1f"),
    ("data_pct", "data %", ".1f"), ("compute_pct", "compute %", ".1f"), ("lateness_ms", "late ms", ".2f"),
    ("last_pct", "last in %", ".0f"), ("inter_busbw_GBps", "inter-node busbw GB/s", ".3f"),
]
SCOPE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("op", "collective", ""), ("scope", "scope", ""),
    ("calls", "calls", "d"), ("bytes_per_call", "bytes/call", ",.0f"), ("lat_ms_p50", "lat ms p50", ".3f"),
    ("busbw_GBps", "busbw GB/s", ".3f"),
]
CLOCK_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("host", "host", ""), ("ranks", "ranks", ""),
    ("offset_ms", "offset ms", ",.3f"), ("wall_guess_ms", "wall-clock guess ms", ",.3f"),
    ("correction_ms", "correction ms", "+.3f"), ("uncertainty_ms", "± ms", ".3f"),
    ("feasible_lo_ms", "causal from ms", ",.3f"), ("feasible_hi_ms", "causal to ms", ",.3f"),
    ("instances", "instances", "d"), ("violations", "violations", "d"), ("method", "method", ""),
]
MISMATCH_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("group", "group", ""), ("seq", "seq", "d"),
    ("kind", "kind", ""), ("op", "collective", ""), ("detail", "detail", ""),
]
FINDING_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("finding", "finding", ""),
    ("evidence", "evidence", ""), ("advice", "what to try", ""),
]

NOTES = [
    "Shares are of step time (end of one optimizer step to the end of the next), time-weighted "
    "over measured steps and ranks; exposed shares add up to 100 %: data > blocking comm > compute "
    "> comm in flight > other. 'comm busy %' is the union of all collectives' issue-to-completion "
    "time and the waits for them (hidden communication included); 'overlap %' is the part of that "
    "time during which compute runs too (HTA's definition; compute a collective blocks is not running).",
    "algbw = S / latency, busbw = algbw x nccl-tests factor (all_reduce 2(n-1)/n; reduce_scatter, "
    "all_gather (n-1)/n with S the full array; broadcast 1); medians over calls, GB = 1e9 bytes.",
    "speedup and efficiency are relative to the smallest GPU count of each configuration; "
    "imbalance = max over ranks of mean work per step / mean over ranks - 1.",
]


def analyze_run(chunks: Iterable, meta: dict, rank_metas: List[dict], path: str, warmup: int = 1,
                batch_size: Optional[int] = None, group_by: Optional[Sequence[str]] = None, reread=None):
    """One run (its events as chunks of whole ranks, REPORT_COLUMNS) -> RunAnalysis."""
    from .run import analyze_chunks

    analysis = analyze_chunks(chunks, meta, rank_metas, warmup=warmup, batch_size=batch_size, group_by=group_by,
                              reread=reread)
    analysis.meta["path"] = path
    _check_steps(analysis)
    return analysis


def _check_steps(analysis) -> None:
    if analysis.steps.empty:
        from . import failure

        why = failure.findings(analysis.meta)
        raise TraceFormatError(f"{analysis.meta.get('path')}: the trace has no complete training step "
                               "(no optimizer step was recorded)"
                               + (f"; {why[0]['finding']}" if why else ""))


FAILURE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("rank", "rank", "d"), ("host", "host", ""),
    ("ended", "ended", ""), ("after_s", "after s", ".2f"), ("step", "step", "d"), ("where", "where", ""),
    ("in_flight", "inside", ""), ("detail", "error", ""),
]


def _failures(runs, finds: pd.DataFrame):
    """The failure table and finding of every run that did not end
    cleanly (analyzers/failure.py); its other findings say that they cover
    only the steps before the failure."""
    from . import failure

    rows, frames, keys = [], [], set()
    for r in runs:
        if failure.failed(r.meta):
            rows += failure.findings(r.meta, r.label, r.world_size)
            frames.append(failure.ends_table(r.meta).assign(config=r.label, gpus=r.world_size))
            keys.add((r.label, int(r.world_size)))
    if not rows:
        return pd.DataFrame(), finds
    if len(finds):
        hit = [(c, int(g)) in keys for c, g in zip(finds["config"], finds["gpus"])]
        finds = finds.copy()
        finds.loc[hit, "evidence"] = "before the failure: " + finds.loc[hit, "evidence"].astype(str)
    finds = pd.concat([pd.DataFrame(rows), finds], ignore_index=True)
    return pd.concat(frames, ignore_index=True), finds


LINK_COLUMNS = [("config", "configuration", ""), ("gpus", "GPUs", "d"), ("class", "class", ""),
                ("group", "group", ""), ("nodes", "nodes", ""), ("calls", "calls", "d"),
                ("transfer_ms", "transfer ms p50", ".3f"), ("busbw_GBps", "busbw GB/s p50", ".3g"),
                ("busbw_GBps_p75", "busbw GB/s p75", ".3g"), ("slow", "slow", "")]


def _flagged(groups: pd.DataFrame) -> pd.DataFrame:
    """The inter-node groups with their ``slow`` flag (analyzers/slowlinks.py)."""
    from .slowlinks import attribute

    return attribute(groups)[0]


def _with_pairs(finds: pd.DataFrame, pairs: Sequence[Tuple[str, dict]]) -> pd.DataFrame:
    """The pairs bench's findings after the study's; each node finding of
    the study says what the pairs bench found."""
    for where, doc in pairs:
        pf = pairs_report(doc).tables["bottlenecks"].frame
        said = "; ".join(str(f) for f in pf["finding"]) or "nothing"
        node = finds["bound"] == "node"
        finds.loc[node, "evidence"] = finds.loc[node, "evidence"] + f"; the study's pairs bench ({where}): {said}"
        pf = pf.assign(bound="node", advice=[f"{a} (results: {where})".lstrip() for a in pf["advice"].fillna("")])
        finds = pd.concat([finds, pf], ignore_index=True)
    return finds


def build_report(runs, warmup: int = 1, pairs: Sequence[Tuple[str, dict]] = (),
                 peak_tflops: Optional[float] = None):
    """The report's tables from analysed runs (RunAnalysis objects); with
    ``pairs`` (where, results of ``commprof bench --pairs`` run beside the
    study), their findings too, and a node finding of the study points to
    them."""
    from . import scaling

    for r in runs:
        _check_steps(r)
    # the straggler tests (numpy partitions of steps x ranks matrices) and the fine grain's tables run
    # beside the other tables: they read each run's steps, its fine grain and two small summaries of its
    # collectives taken first, nothing the others build
    strag_in = scaling.straggler_inputs(runs)
    with ThreadPoolExecutor(max_workers=1) as pool:
        side = pool.submit(lambda: (scaling.straggler_verdicts(strag_in), fine_grain(runs)))
        table = scaling.breakdown_table(runs, peak_tflops)
        per_run = {attr: scaling.run_tables(runs, attr) for attr in ("clocks", "nodes", "scope", "links")}
        mism = _mismatches(runs)
        colls = scaling.collectives_table(runs)
        skews = scaling.skew_tables(runs)
        strag, fine = side.result()
    sharded, sharded_sum = _sharded(runs, table)
    ends_t, finds = _failures(runs, _findings(table, colls, skews, strag, per_run, mism, pairs, fine, sharded_sum))
    tables = {}
    if len(ends_t):
        tables["failure"] = Table("The job failed: how each rank ended (first to end first)", ends_t,
                                  FAILURE_COLUMNS)
    tables["breakdown"] = Table("Breakdown per GPU count (exposed shares of step time)", table, BREAKDOWN_COLUMNS)
    study = scaling.study_table(table)
    if len(study):
        tables["study"] = Table("Side by side (busy shares of step time, as scaling studies report them)",
                                study, [(c, "GPUs" if c == "gpus" else c, "d" if c == "gpus" else ".1f")
                                       for c in study.columns])
    tables.update(_gpu_tables(runs))
    tables.update(_fine_tables(fine))
    if len(sharded):
        tables["fsdp_layers"] = Table("Sharded data parallel (FSDP): per layer, per measured step and rank",
                                      sharded, FSDP_TABLE_COLUMNS)
    tables["collectives"] = Table("Collectives by message size", colls, COLLECTIVE_COLUMNS)
    tables["skew"] = Table("Arrival skew across ranks (same collective, latest - earliest issue)",
                           scaling.stack(skews), SKEW_COLUMNS)
    tables["stragglers"] = Table("Stragglers (ranks late beyond chance)",
                                 stragglers.accused(scaling.stack(strag)), STRAGGLER_COLUMNS)
    tables.update(_node_tables(per_run, mism))
    tables["bottlenecks"] = Table("Bottlenecks and what to try", finds, FINDING_COLUMNS, style="list")
    report = Report(title="commprof report", tables=tables, notes=_notes(runs, warmup), runs=[r.meta for r in runs])
    report.extras["timelines"] = {f"{r.label} @ {r.world_size} GPUs": r.timeline for r in runs}
    report.extras["gantt"] = fine["gantt"]
    return report


def _mismatches(runs) -> Dict[tuple, pd.DataFrame]:
    """Per (configuration, GPU count): the collectives its ranks disagree on."""
    from . import scaling

    mism = {}
    for key, members in scaling.run_groups(runs).items():
        ms = [t for t in (m.colls.mismatches() for m in members) if len(t)]
        if ms:
            mism[key] = pd.concat(ms, ignore_index=True)
    return mism


def _sharded(runs, table: pd.DataFrame):
    """FSDP's per-layer table (analyzers/fsdp.py) of the first run of each
    (configuration, GPU count) with FSDP collectives, and what the
    findings read of it per (configuration, GPU count)."""
    from . import fsdp, scaling

    per, summ = {}, {}
    for key, members in scaling.run_groups(runs).items():
        r = members[0]
        rows = getattr(r, "sharded", None)
        if rows is None or rows.empty:
            continue
        groups = r.meta.get("fsdp_groups")
        per[key] = fsdp.layer_table(rows, groups)
        steps_ns = float(r.steps["step_time"].mean()) if len(r.steps) else 0.0
        summ[key] = dict(fsdp.summary(rows, steps_ns, groups), framework=r.meta.get("framework"))
    return scaling.stack(per), summ


def _findings(table, colls, skews, strag, per_run, mism, pairs, fine, sharded=None) -> pd.DataFrame:
    """Every finding before the failure's: the study's, the nodes', the
    pairs bench's and the fine grain's."""
    from . import bottleneck

    finds = bottleneck.findings(table, colls, skews, strag, sharded or {})
    finds = pd.concat([finds, bottleneck.node_findings(per_run["nodes"], mism, table, per_run["links"])],
                      ignore_index=True)
    finds = _with_pairs(finds, pairs)
    if len(fine["findings"]):
        finds = pd.concat([finds, fine["findings"]], ignore_index=True)
    return finds


def _notes(runs, warmup: int) -> List[str]:
    notes = [f"Warm-up: the first {warmup} step(s) of every rank are left out."] + NOTES
    for r in runs:
        k, calls = getattr(r, "comm_sample", (1, 0))
        if k > 1:
            notes.append(f"{r.meta['path']}: clock alignment, the per-scope medians, the inter-node links and "
                         f"the per-node bandwidth read one collective instance in {k} ({calls:,} calls; whole "
                         "instances, every rank); counts and all other tables read every call.")
        if r.meta.get("compile_steps_left_out"):
            notes.append(f"{r.meta['path']}: {r.meta['compile_steps_left_out']} (rank, step) pair(s) in which "
                         "torch.compile compiled graphs are left out of the step statistics, like the warm-up.")
        if r.meta.get("salvaged_ranks"):
            notes.append(f"{r.meta['path']}: rank(s) {r.meta['salvaged_ranks']} were killed; "
                         "their events up to the last flush are included.")
    return notes


def _gpu_tables(runs) -> Dict[str, Table]:
    """Kernels by class, the GPU temporal breakdown, Horovod's phases and
    NVML telemetry, where the runs have them."""
    from . import scaling

    tables = {}
    kshare, kgpu = scaling.kernel_tables(runs)
    if len(kshare):
        classes = [c for c in ("nccl", "cudnn", "data", "gemm", "other", "memcpy", "memset")
                   if f"{c}_pct" in kshare.columns]
        tables["kernels"] = Table(
            "GPU kernel time by class (% of summed kernel time, mean over ranks)", kshare,
            [("config", "configuration", ""), ("gpus", "GPUs", "d"), ("ranks", "ranks", "d"),
             ("kernel_ms", "kernel ms/rank", ".1f")]
            + [(f"{c}_pct", {"nccl": "NCCL %", "cudnn": "cuDNN %", "data": "data %"}.get(c, f"{c} %"), ".2f")
               for c in classes])
    if len(kgpu):
        tables["gpu_breakdown"] = Table(
            "GPU temporal breakdown (HTA definitions, exact; kernels launched before the last ProfilerStep)",
            kgpu, [("config", "configuration", ""), ("gpus", "GPUs", "d"), ("ranks", "ranks", "d"),
                   ("span_ms", "span ms", ".1f"), ("idle_pct", "idle %", ".2f"),
                   ("compute_pct", "compute %", ".2f"), ("non_compute_pct", "non-compute %", ".2f"),
                   ("overlap_pct", "comm/compute overlap %", ".2f")])
    phases = scaling.phase_table(runs)
    if len(phases):
        tables["horovod_phases"] = Table("Horovod timeline phases (rank 0, the coordinator)", phases, [
            ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("name", "phase", ""),
            ("count", "count", "d"), ("tensors", "tensors", "d"), ("total_ms", "total ms", ".2f"),
            ("mean_ms", "mean ms", ".3f"), ("max_ms", "max ms", ".3f")])
    tele = scaling.telemetry_table(runs)
    if len(tele):
        tables["telemetry"] = Table("GPU telemetry per rank (NVML)", tele, [
            ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("rank", "rank", "d"),
            ("util_pct", "util % mean", ".1f"), ("mem_peak_mib", "mem MiB peak", ".0f"),
            ("power_w", "power W mean", ".1f"), ("sm_clock_mhz", "SM MHz mean", ".0f"),
            ("samples", "samples", ".0f")])
    return tables


def _fine_tables(fine) -> Dict[str, Table]:
    """The fine grain's tables (key, title, fine_grain() entry, columns),
    those with rows."""
    specs = [
        ("buckets", "Gradient buckets (per bucket index over ranks and measured steps; aligned clocks)", "buckets",
         BUCKET_TABLE_COLUMNS),
        ("critical_path", "Critical path across ranks: what each step's end waited for", "gates",
         GATE_TABLE_COLUMNS),
        ("updates", "Delays between weight updates (end of one optimizer step to the start of the next, per rank)",
         "updates", UPDATE_TABLE_COLUMNS)]
    return {key: Table(title, fine[entry], cols) for key, title, entry, cols in specs if len(fine[entry])}


def _node_tables(per_run, mism) -> Dict[str, Table]:
    """Per node, scope, inter-node links, clock alignment, mismatches: runs
    on several hosts (mismatches: any run)."""
    from . import scaling

    tables = {}
    if per_run["nodes"]:
        tables["nodes"] = Table("Per node (host)", scaling.stack(per_run["nodes"]), NODE_COLUMNS)
    if per_run["scope"]:
        tables["scope"] = Table("Collectives within a node vs across nodes", scaling.stack(per_run["scope"]),
                                SCOPE_COLUMNS)
    if per_run["links"]:
        tables["links"] = Table("Inter-node groups: transfer speed once every rank arrived (the last arrival's "
                                "duration)", scaling.stack({k: _flagged(t) for k, t in per_run["links"].items()}),
                                LINK_COLUMNS)
    if per_run["clocks"]:
        tables["clocks"] = Table("Clock alignment per host (from the collectives; offsets added to each host's "
                                 "monotonic clock)", scaling.stack(per_run["clocks"]), CLOCK_COLUMNS)
    if mism:
        tables["mismatches"] = Table("Collectives the ranks disagree on (same group and sequence number)",
                                     scaling.stack(mism), MISMATCH_COLUMNS)
    return tables


BUCKET_TABLE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("bucket", "bucket", "d"), ("op", "collective", ""),
    ("bytes", "bytes", ",.0f"), ("ready_ms", "ready ms", ".2f"), ("ready_spread_ms", "ready spread ms", ".2f"),
    ("issue_to_done_ms", "issue->done ms", ".2f"), ("wait_ms", "waiting ms", ".2f"),
    ("transfer_ms", "transfer ms", ".2f"), ("tail_ms", "exposed tail ms", ".2f"), ("last_rank", "last rank", ".0f"),
    ("last_pct", "last in %", ".0f"), ("params", "holds", ""), ("source", "issued by", ""),
]
FSDP_TABLE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("layer", "layer", ""),
    ("params MiB", "params MiB", ".2f"), ("dtype", "dtype", ""), ("gathers/step", "gathers", ".1f"),
    ("gather ms", "gather ms", ".2f"), ("gather exposed ms", "exposed ms", ".2f"),
    ("prefetched %", "prefetched %", ".0f"), ("regathers/step", "re-gathers", ".1f"),
    ("regather ms", "re-gather ms", ".2f"), ("regather exposed ms", "exposed ms", ".2f"),
    ("regathers prefetched %", "prefetched %", ".0f"), ("reduce op", "reduction", ""),
    ("reduce ms", "reduce ms", ".2f"), ("reduce exposed ms", "exposed ms", ".2f"),
    ("after backward ms", "after backward ms", ".2f"), ("step end waits %", "step end waits %", ".0f"),
]
GATE_TABLE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("gate", "gate", ""), ("steps_pct", "steps %", ".0f"),
    ("phase", "why late (most often)", ""), ("tail_ms", "tail after backward ms", ".2f"),
    ("example", "example chain", ""),
]
UPDATE_TABLE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("delay_ms_p50", "delay ms p50", ".2f"),
    ("delay_ms_p95", "delay ms p95", ".2f"), ("delay_ms_max", "delay ms max", ".2f"), ("data_ms", "data ms", ".2f"),
    ("forward_ms", "forward ms", ".2f"), ("backward_ms", "backward ms", ".2f"),
    ("waiting_ms", "waiting ms", ".2f"), ("other_ms", "other ms", ".2f"),
    ("idle_ms_p50", "free window ms p50", ".2f"), ("ranks", "ranks", "d"), ("updates", "updates", "d"),
]

_GATE_ADVICE = {
    "data wait": "rank {r} waits for its data: more loader workers or DALI on its node, or check its storage",
    "forward": "rank {r} computes its forward slower than the others: check that GPU / host (clocks, placement, "
               "a noisy neighbour)",
    "backward": "rank {r}'s backward reaches this bucket last: a straggler in compute; smaller buckets "
                "(bucket_cap_mb) start the reduction earlier",
    "late start": "rank {r} starts its steps late (its previous step's tail or host work between steps)",
}


_JITTER_ADVICE = ("jitter, not one straggler: smaller buckets (bucket_cap_mb) let the reduction start earlier; "
                  "fewer host-side stalls (data, Python) even out the ranks")


def _gate_finding(key, world_size: int, paths: pd.DataFrame, b: pd.DataFrame, ph: pd.DataFrame) -> dict:
    """The critical path's finding: the most frequent gate, and whether its
    rank is last ready beyond chance (binomial test) by more than the
    effect floor (its median margin over the next-latest rank)."""
    from . import buckets as bk

    summ = bk.gate_summary(paths)
    size = dict(zip(b["bucket"], b["bytes"])).get(summ["bucket"])
    what = (f"bucket {summ['bucket']}" + (f" ({size / 2 ** 20:.1f} MiB)" if size else "")
            if summ["bucket"] >= 0 else "the slowest rank's backward")
    mine = paths[paths["gate_rank"] == summ["rank"]]
    phase = mine["gate_phase"].mode().iloc[0] if len(mine) else "backward"
    example = mine[mine["gate_phase"] == phase]["path"].iloc[0] if len(mine) else ""
    k = int(round(summ["rank_pct"] * summ["steps"] / 100))
    test = evidence.binomial_test(k, summ["steps"], 1.0 / world_size, world_size)
    last = f"rank {summ['rank']} is the last ready in {test.text()}"
    margin = float(mine["margin_ms"].median()) if len(mine) else float("nan")
    floor = evidence.min_effect_ms(float(((ph["s1"] - ph["s0"]) / 1e6).median()))
    if test.significant and not margin >= floor:
        who = (f"{last}, but by a median {margin:.2f} ms over the next rank, below the {floor:.2f} ms "
               "effect floor: no single rank")
        advice = _JITTER_ADVICE
    elif test.significant:
        who = f"{last} (why: {phase})"
        advice = _GATE_ADVICE.get(phase, "").format(r=summ["rank"])
    elif summ["steps"] < test.needed:
        who = f"{last}: too few steps to tell one rank from chance with {world_size} ranks (needs {test.needed})"
        advice = f"record at least {test.needed} steps after the warm-up to tell a straggler from jitter"
    else:
        who = f"{last}: consistent with chance for {world_size} ranks, no single rank"
        advice = _JITTER_ADVICE
    return {"config": key[0], "gpus": key[1],
            "finding": f"critical path: {what} gates {summ['bucket_pct']:.0f} % of steps",
            "evidence": f"{summ['steps']} measured steps walked back from the last gradient collective; {who}; "
                        f"e.g. {example}",
            "advice": advice}


def fine_grain(runs) -> dict:
    """Per (configuration, GPU count), from the first run of each: bucket
    table, critical-path gates, update delays, the gating finding, and
    Gantt bars of the largest run."""
    from . import buckets as bk
    from . import scaling

    bt, gt, ut, rows = {}, {}, {}, []
    gantt = None
    biggest = None
    for key, members in scaling.run_groups(runs).items():
        r = members[0]
        t = r.fine_tables if r.fine_tables is not None else \
            bk.run_tables(r.fine_phases, r.fine_grads, r.world_size, r.meta.get("ddp_buckets"))
        if t["updates"] is None:
            continue
        if len(t["updates"]):
            ut[key] = t["updates"]
        b = t["buckets"]
        if b is None:
            continue
        if len(b):
            bt[key] = b
        if t["gates"] is not None and len(t["gates"]):
            gt[key] = t["gates"]
            rows.append(_gate_finding(key, r.world_size, t["paths"], b, r.fine_phases))
        if biggest is None or r.world_size > biggest.world_size:
            biggest = r
    if biggest is not None:
        gantt = bk.gantt(biggest.fine_phases, biggest.fine_grads)
        gantt.attrs["title"] = f"{biggest.label} @ {biggest.world_size} GPUs"
    return {"buckets": scaling.stack(bt), "gates": scaling.stack(gt), "updates": scaling.stack(ut),
            "findings": pd.DataFrame(rows, columns=["config", "gpus", "finding", "evidence", "advice"]),
            "gantt": gantt}


MODEL_TABLE_COLUMNS = [
    ("trace", "trace", ""), ("op", "collective", ""), ("dtype", "type", ""), ("group_size", "ranks", "d"),
    ("scope", "scope", ""), ("from_bytes", "from B", ",.0f"), ("to_bytes", "to B", ",.0f"),
    ("alpha_us", "alpha us", ".2f"), ("beta_GBps", "beta GB/s", ".4f"), ("r2", "R^2", ".4f"),
    ("max_rel_residual", "max rel. residual", ".3f"), ("points", "sizes", "d"), ("calls", "calls", "d"),
]
AGREE_TABLE_COLUMNS = [
    ("trace", "trace", ""), ("against", "against", ""), ("op", "collective", ""), ("dtype", "type", ""),
    ("sizes", "sizes", "d"), ("median_rel_diff_pct", "median diff %", ".1f"),
    ("max_rel_diff_pct", "max diff %", ".1f"), ("verdict", "verdict", ""),
]
BENCH_TABLE_COLUMNS = [
    ("trace", "trace", ""), ("op", "collective", ""), ("dtype", "type", ""), ("bytes", "size B", ",d"),
    ("mode", "mode", ""), ("calls", "calls", "d"), ("time_us", "time us", ".2f"), ("median_us", "median us", ".2f"),
    ("algbw_GBps", "algbw GB/s", ".4f"), ("busbw_GBps", "busbw GB/s", ".4f"),
]


def model_report(fits: List[tuple], against: Sequence[tuple] = (), bench_rows: Sequence[tuple] = ()) -> Report:
    """``commprof model`` (and ``commprof report`` of bench traces): the
    alpha-beta fit of each trace, agreement with given models, and the
    benchmark's nccl-tests rows."""
    from .model import agreement, model_frame

    frames = [model_frame(m).assign(trace=name) for name, m in fits]
    tables = {"model": Table("Alpha-beta fit per collective: T(S) = alpha + S / beta",
                             pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(),
                             MODEL_TABLE_COLUMNS)}
    agree = [agreement(m, ref).assign(trace=name, against=ref_name) for name, m in fits for ref_name, ref in against]
    if agree:
        tables["agreement"] = Table("Agreement of the fits (predicted times at the trace's message sizes)",
                                    pd.concat(agree, ignore_index=True), AGREE_TABLE_COLUMNS)
    if bench_rows:
        tables["bench"] = Table("Benchmark (time = mean over calls of the slowest rank; nccl-tests factors)",
                                pd.DataFrame([dict(r, trace=name) for name, rows in bench_rows for r in rows]),
                                BENCH_TABLE_COLUMNS)
    notes = [m["note"] for _, m in fits if m.get("note")]
    notes.append("Per collective instance the time is the slowest rank's; points are median times per message "
                 "size; fit by least squares on relative residuals, split at the protocol switch when one line "
                 "leaves a residual above 25 %.")
    return Report(title="commprof model", tables=tables, notes=notes)


COST_TERM_COLUMNS = [("form", "form", ""), ("term", "term", ""), ("value", "value", ".4g"), ("unit", "unit", ""),
                     ("std_err", "std err", ".2g"), ("status", "from", ""), ("prior", "prior us", ".3g"),
                     ("points", "points", "d")]
COST_FORM_COLUMNS = [("form", "form", ""), ("held_out_ranks", "held-out ranks", "d"), ("fitted_on", "fitted on", ""),
                     ("points", "points", "d"), ("median_abs_err_pct", "median |err| %", ".1f"),
                     ("max_abs_err_pct", "max |err| %", ".1f")]
COST_ROW_COLUMNS = [("op", "op", ""), ("n_ranks", "ranks", "d"), ("nodes", "nodes", "d"), ("bytes", "bytes", ",d"),
                    ("predicted", "predicted", ""), ("time_us", "time us", ".1f"), ("time_lo_us", "lo us", ".1f"),
                    ("time_hi_us", "hi us", ".1f"), ("algbw_GBps", "algbw GB/s", ".2f"),
                    ("busbw_GBps", "busbw GB/s", ".2f"), ("algorithm", "algorithm", ""),
                    ("err_pct", "model err %", "+.1f"), ("constant_busbw_us", "constant busbw us", ".1f"),
                    ("log2_nodes_us", "log2 nodes us", ".1f"), ("worse_than", "held out, beaten by", "")]
COST_COMPARE_COLUMNS = [("scope", "scope", ""), ("band", "sizes", ""), ("held_out_ranks", "held-out ranks", "d"),
                        ("fitted_on", "fitted on", ""), ("points", "points", "d"),
                        ("model_median_pct", "model median %", ".1f"), ("model_max_pct", "model max %", ".1f"),
                        ("constant_busbw_median_pct", "constant busbw median %", ".1f"),
                        ("constant_busbw_max_pct", "constant busbw max %", ".1f"),
                        ("log2_nodes_median_pct", "log2 nodes median %", ".1f"),
                        ("log2_nodes_max_pct", "log2 nodes max %", ".1f"), ("better", "best", "")]


def cost_report(model, rows: pd.DataFrame, notes: Sequence[str] = ()) -> Report:
    """``commprof model ... --to``: the cost model's terms per form, the
    held-out validation that chose the form, and the measured and predicted
    collectives."""
    tables = {"terms": Table(f"Cost model terms ({model.backend}; * = the form that predicts)",
                             model.terms_table(), COST_TERM_COLUMNS),
              "forms": Table("Model forms, each fitted leaving one measured rank count out",
                             model.validation, COST_FORM_COLUMNS),
              "baselines": Table("The model against the naive answers, held out: the largest measured count of "
                                 "each scope predicted from the smaller ones", model.comparison, COST_COMPARE_COLUMNS),
              "collectives": Table("Measured and predicted collectives (predicted: lo-hi spans the plausible forms, "
                                   "and a naive answer that did better held out)", rows, COST_ROW_COLUMNS)}
    out = [f"Predicting form: {model.best}; plausible: {', '.join(model.plausible)}.", *notes,
           "time = latency + bytes / bandwidth per (algorithm, protocol), the fastest per call, as NCCL's tuner "
           "(ring: 2 (n - 1) steps for all_reduce, 2 (nodes - 1) across nodes; tree: 2 ((ranks per node - 1) "
           "intra + log2(nodes) inter)); each protocol (LL, LL128, Simple) its own latency and bandwidth terms; "
           "busbw with the nccl-tests factors."]
    c = model.comparison
    for _i, r in (c.iterrows() if c is not None and len(c) else iter(())):
        if r["better"] != "model":
            out.append(f"Held out at {r['held_out_ranks']} ranks ({r['scope']}, {r['band']}) the model was off by a "
                       f"median {r['model_median_pct']:.1f} %, {r['better'].replace('_', ' ')} by "
                       f"{r[str(r['better']) + '_median_pct']:.1f} %: there the predictions' intervals cover the "
                       f"naive answer.")
    return Report(title="commprof model", tables=tables, notes=out)


PAIR_COLUMNS = [("host_a", "node A", ""), ("host_b", "node B", ""), ("a", "rank A", "d"), ("b", "rank B", "d"),
                ("scope", "scope", ""), ("bw_GBps", "GB/s each way", ".4g"), ("bw_GBps_p25", "p25", ".4g"),
                ("bw_GBps_p75", "p75", ".4g"), ("lat_us", "latency us", ".1f"), ("iters", "iters", "d"),
                ("slow", "slow", "")]
PAIR_NODE_COLUMNS = [("host", "node", ""), ("pairs", "pairs", "d"), ("slow_pairs", "slow pairs", "d"),
                     ("bw_GBps_median", "GB/s median", ".4g"), ("bw_GBps_min", "GB/s min", ".4g"),
                     ("others_GBps_median", "others' GB/s median", ".4g"), ("verdict", "verdict", "")]


def pairs_report(doc: dict) -> Report:
    """``commprof bench --pairs``: the node x node matrix, every pair, per
    node its links against the others', and the findings."""
    from .pairs import SLOW, attribute, matrix, pair_table

    samples = pd.DataFrame(doc.get("samples") or [], columns=["round", "a", "b", "host_a", "host_b", "kind",
                                                              "iteration", "bytes", "seconds"])
    pairs = pair_table(samples)
    pairs, nodes, found = attribute(pairs)
    mat = matrix(pairs)
    world = int(doc.get("world_size") or 0)
    finds = pd.DataFrame([{"config": "bench --pairs", "gpus": world, **f} for f in found],
                         columns=[c for c, _, _ in FINDING_COLUMNS])
    title = ("Bandwidth between nodes (between ranks where one node was measured; GB/s each way, median over "
             "iterations)")
    tables = {"pair_matrix": Table(title, mat,
                                   [(c, c, ".4g" if c != "host" else "") for c in mat.columns]),
              "pair_nodes": Table("Per node: its pairs against the pairs between the other nodes", nodes,
                                  PAIR_NODE_COLUMNS),
              "pairs": Table("Every pair measured", pairs, PAIR_COLUMNS),
              "bottlenecks": Table("Slow nodes and links", finds, FINDING_COLUMNS, style="list")}
    mib = int(doc.get("bytes") or 0) / 2 ** 20
    notes = [f"{world} ranks on {len(set(map(str, doc.get('hosts') or [])))} nodes, {len(doc.get('rounds') or [])} "
             f"rounds; each pair exchanged {mib:g} MiB both ways at once, {doc.get('iters')} timed iterations "
             f"(+ {doc.get('warmup')} warm-up), per iteration the slower side; latency: 8-byte exchanges.",
             f"A node (a rank, where one node was measured) is slow when more than half of its pairs have an "
             f"upper quartile below {SLOW:.0%} of the median of the pairs it is not in; a pair is slow when its "
             f"upper quartile is below {SLOW:.0%} of the median of the pairs between normal nodes, and a slow pair "
             f"between two normal nodes is a slow link."]
    return Report(title="commprof bench --pairs", tables=tables, notes=notes)


DIFF_COLUMNS = [("what", "what", ""), ("metric", "metric", ""), ("a", "A", ",.3f"), ("b", "B", ",.3f"),
                ("delta", "B - A", "+,.3f"), ("delta_pct", "change %", "+.1f")]


def diff_report(table: pd.DataFrame, a: str, b: str) -> Report:
    """``commprof diff``'s report around :func:`commprof.analyzers.diff.diff_tables`' table."""
    return Report(title=f"commprof diff: A = {a}, B = {b}",
                  tables={"diff": Table("What changed (B - A)", table, DIFF_COLUMNS)},
                  notes=["Exposed shares and ms per step (share x median step time); collectives: "
                         "calls per step and rank, bytes per call, mean latency."])


PREDICT_TABLE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("kind", "kind", ""), ("scenario", "what-if", ""),
    ("step_ms", "step ms", ".2f"), ("step_ms_lo", "step ms lo", ".2f"), ("step_ms_hi", "step ms hi", ".2f"),
    ("samples_per_s", "samples/s", ".1f"), ("efficiency_pct", "eff %", ".1f"), ("comm_pct", "comm %", ".1f"),
    ("comm_pct_lo", "comm % lo", ".1f"), ("comm_pct_hi", "comm % hi", ".1f"),
    ("comm_pct_constant_busbw", "comm % constant busbw", ".1f"), ("comm_pct_log2_nodes", "comm % log2 nodes", ".1f"),
    ("data_pct", "data %", ".1f"), ("compute_pct", "compute %", ".1f"), ("other_pct", "other %", ".1f"),
    ("gain_pct", "gain %", "+.1f"), ("speedup", "speedup", ".2f"), ("batch_per_rank", "batch/rank", ".1f"),
    ("source_gpus", "from GPUs", "d"), ("algorithm", "algorithm", ""),
]
VALIDATE_TABLE_COLUMNS = [
    ("config", "configuration", ""), ("gpus", "GPUs", "d"), ("mode", "predicted", ""),
    ("from_gpus", "from GPUs", "d"), ("measured_ms", "measured ms", ".2f"), ("predicted_ms", "predicted ms", ".2f"),
    ("step_err_pct", "step err %", "+.1f"), ("tput_err_pct", "throughput err %", "+.1f"),
    ("comm_err_pp", "comm err pp", "+.1f"), ("data_err_pp", "data err pp", "+.1f"),
    ("compute_err_pp", "compute err pp", "+.1f"), ("coll_err_pct", "collectives |err| %", ".1f"),
]


def predict_report(table: pd.DataFrame, validation=None, notes: Sequence[str] = ()) -> Report:
    """``commprof predict``'s report: measured, predicted and what-if rows
    (plus the validation of the model on the measured sizes)."""
    tables = {"prediction": Table("Measured and predicted per GPU count (predicted rows: replayed steps, "
                                  "interval lo-hi)", table, PREDICT_TABLE_COLUMNS)}
    study = _predicted_study(table)
    if len(study):
        tables["study"] = Table("The study table, extended (exposed shares; * = predicted)", study,
                                [(c, "GPUs" if c == "gpus" else c, "d" if c == "gpus" else "")
                                 for c in study.columns])
    gains = _gain_findings(table)
    if len(gains):
        tables["what_if"] = Table("What a change is expected to gain (replayed)", gains, FINDING_COLUMNS,
                                  style="list")
    out_notes = list(notes)
    if validation is not None:
        tables["validation"] = Table("Validation: each measured size predicted from the other runs",
                                     validation.rows, VALIDATE_TABLE_COLUMNS)
        if validation.summary:
            s = validation.summary
            coll = s.get("median_coll_err_pct")
            out_notes.insert(0, f"Validation: median |step-time error| {s['median_abs_step_err_pct']:.1f} %, "
                                f"worst {s['max_abs_step_err_pct']:.1f} % over {s['cases']} predictions"
                                + (f"; the cost model alone: median |error| {coll:.1f} % on the held-out runs' "
                                   "busy periods." if coll == coll and coll is not None else "."))
        else:
            out_notes.insert(0, "Validation: nothing to validate (needs two or more measured GPU counts of a "
                                "configuration, one of them with communication).")
    return Report(title="commprof predict", tables=tables, notes=out_notes)


def _predicted_study(table: pd.DataFrame) -> pd.DataFrame:
    """Rows = GPU counts, column groups = configurations: comm / data /
    compute share and efficiency, predicted cells marked with *."""
    t = table[table["kind"].isin(["measured", "predicted"])]
    if t.empty:
        return pd.DataFrame()
    rows: Dict[int, dict] = {}
    for _, r in t.sort_values(["gpus", "kind"]).iterrows():
        mark = "*" if r["kind"] == "predicted" else ""
        cells = rows.setdefault(int(r["gpus"]), {"gpus": int(r["gpus"])})
        if r["kind"] == "predicted" and f"{r['config']} | comm %" in cells:
            continue  # measured wins where both exist
        for col, name in (("comm_pct", "comm %"), ("data_pct", "data %"), ("compute_pct", "compute %"),
                          ("efficiency_pct", "eff %")):
            v = r[col]
            cells[f"{r['config']} | {name}"] = "-" if v != v else f"{v:.1f}{mark}"
    out = pd.DataFrame(list(rows.values())).sort_values("gpus")
    return out.fillna("-").reset_index(drop=True)


def _gain_findings(table: pd.DataFrame) -> pd.DataFrame:
    wi = table[table["kind"] == "what-if"]
    rows = []
    for _, r in wi.iterrows():
        if r["gain_pct"] != r["gain_pct"]:
            continue
        word = "faster" if r["gain_pct"] >= 0 else "slower"
        rows.append({"config": r["config"], "gpus": int(r["gpus"]), "finding": f"{r['scenario']}: "
                     f"{abs(r['gain_pct']):.1f} % {word} steps",
                     "evidence": f"predicted step {r['step_ms']:.1f} ms (interval {r['step_ms_lo']:.1f}-"
                                 f"{r['step_ms_hi']:.1f}) vs {r['step_ms'] / (1 - r['gain_pct'] / 100):.1f} ms "
                                 f"as is; comm {r['comm_pct']:.1f} % of the step",
                     "advice": ""})
    return pd.DataFrame(rows, columns=["config", "gpus", "finding", "evidence", "advice"])
