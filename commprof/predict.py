"""``commprof predict``: measured runs in, the study extended to GPU counts
nobody ran (and what-ifs) out, and ``--validate``: each measured size
predicted from the others. Reads traces through the API, hands arrays to
:mod:`commprof.analyzers.replay` (the model) and gives a Report."""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence, Tuple

import pandas as pd

import numpy as np

from .analyzers import collmodel as cm
from .analyzers import replay as rp
from .errors import UsageError

STRUCTURE_COLUMNS = ["rank", "step", "category", "name", "t_start", "t_end", "bytes", "blocking"]


def instances_of(analysis) -> pd.DataFrame:
    """Collective instances seen on several ranks: group, seq, op, bytes,
    group size, the last rank's issue and the mean completion (seconds, on
    aligned clocks), and the run's ranks per node — what the cost model is
    fitted to."""
    inst = analysis.colls.instances()
    cols = ["group", "seq", "op", "bytes", "group_size", "last_issue_s", "end_s", "ppn"]
    if inst.empty or "mean_end_ms" not in inst:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame({"group": inst["group"].astype(str), "seq": inst["seq"].astype("int64"),
                         "op": inst["op"].astype(str), "bytes": inst["bytes"].astype(float),
                         "group_size": inst["ranks"].astype(int), "last_issue_s": inst["last_issue_ms"] / 1e3,
                         "end_s": inst["mean_end_ms"] / 1e3, "ppn": ranks_per_node(analysis)})[cols]


def ranks_per_node(analysis) -> int:
    """The most ranks of one run on one host (all of them where the hosts are not known)."""
    hosts = getattr(analysis, "hosts", None) or {}
    if not hosts:
        return int(analysis.world_size or 1)
    counts: Dict[str, int] = {}
    for h in hosts.values():
        counts[h] = counts.get(h, 0) + 1
    return max(counts.values())


def load_runs(paths: Sequence[str], warmup: int = 1, group_by=None):
    """[(config label, Structure, instances, RunAnalysis)] of the runs
    (study folders expanded, the 1-GPU baseline adopted as in the report)."""
    from .analyzers.scaling import adopt_baselines
    from .api import open_runs

    traces = open_runs(paths)
    if not traces:
        raise UsageError("predict: no runs given")
    analyses = [t.analysis(warmup, None, group_by) for t in traces]
    by_path: Dict[str, Tuple] = {}
    for t, a in zip(traces, analyses):
        try:
            st = rp.structure(t.events(STRUCTURE_COLUMNS), a.world_size, a.batch_size or a.meta.get("batch_size"),
                              warmup=warmup,
                              label=t.path)
        except ValueError as exc:
            raise UsageError(f"predict: {exc}")
        by_path[a.meta["path"]] = (st, instances_of(a))
    out = []
    for a in adopt_baselines(analyses, group_by):
        st, inst = by_path[a.meta["path"]]
        out.append((a.label, st, inst, a))
    return out


def _targets(text: Optional[str]) -> List[int]:
    return counts(text, "predict", "GPU counts", 1)


def counts(text: Optional[str], command: str, what: str, minimum: int) -> List[int]:
    """``--to 8,16,1024`` as sorted distinct integers >= ``minimum``; bad
    input is a one-line UsageError naming ``command``."""
    if not text:
        return []
    out = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "..." in part or ".." in part:
            raise UsageError(f"{command}: --to lists {what} (8,16,32,...), got {part!r}")
        try:
            n = int(part)
        except ValueError:
            raise UsageError(f"{command}: --to expects {what} like 8,16,1024, got {part!r}")
        if n < minimum:
            raise UsageError(f"{command}: {what} must be >= {minimum}")
        out.append(n)
    return sorted(set(out))


def _bench_measurements(path: str) -> Tuple[cm.Measurements, str]:
    """A ``commprof bench --json`` / ``--model`` file or an nccl-tests log as
    measurements of the cost model, and the backend they ran on."""
    from .convert.nccltests import import_logs

    if not path.endswith(".json"):
        docs = import_logs([path])
        ms = cm.Measurements()
        for d in docs:
            ms.extend(cm.from_rows(d["rows"], d.get("world_size"), d.get("ranks_per_node"), source=path,
                                   forced=d.get("algorithm") or ""))
        return ms, "nccl"
    with open(path) as fh:
        doc = json.load(fh)
    n = int(doc.get("world_size") or 0)
    ppn = int(doc.get("ranks_per_node") or n or 1)
    if doc.get("rows"):
        return cm.from_rows(doc["rows"], n, ppn, source=path), str(doc.get("backend") or "nccl")
    if doc.get("measurements"):
        return cm.from_rows(doc["measurements"], n, ppn, source=path), str(doc.get("backend") or "nccl")
    # an older model file: its alpha-beta pieces, evaluated over their ranges
    from .analyzers.alphabeta import predict as ab

    ms = cm.Measurements()
    for op, by_dtype in (doc.get("ops") or {}).items():
        pieces = next(iter(by_dtype.values()), None) or []
        if not pieces:
            continue
        lo = max(1.0, min(p["min_bytes"] for p in pieces))
        hi = min(max(p["max_bytes"] for p in pieces), 1 << 40)
        for s in np.geomspace(lo, max(hi, lo * 2), 12):
            ms.add([(op, float(s))], max(n, 2), ppn, ab(pieces, float(s)), path)
    if not len(ms):
        raise ValueError("no measured collective in it")
    return ms, str(doc.get("backend") or "nccl")


def comm_chooser(runs, bench: Optional[str], network: Optional[str], gpus_per_node: Optional[int]):
    """config -> CostModel, fitted to the configuration's measured
    collectives (busy periods) plus ``--bench`` measurements (commprof
    bench results or an nccl-tests log), with the terms ``--network``
    describes fixed; predictions for ``--gpus-per-node`` ranks per node
    (default: as measured). Also returns ``fit_for(config, instances)`` for
    the validation."""
    extra, extra_backend = None, None
    if bench:
        try:
            extra, extra_backend = _bench_measurements(bench)
        except (OSError, ValueError) as exc:
            raise UsageError(f"predict: --bench {bench}: {exc}")
    fixed, net_ppn = None, None
    if network:
        try:
            fixed, net_ppn = rp.network_terms(network)
        except ValueError as exc:
            raise UsageError(f"predict: {exc}")
    ppn_target = gpus_per_node or net_ppn
    backend: Dict[str, str] = {}
    insts: Dict[str, List[pd.DataFrame]] = {}
    for config, _st, inst, a in runs:
        backend.setdefault(config, cm.backend_of(a.meta.get("backend") or extra_backend or "gloo"))
        insts.setdefault(config, [])
        if len(inst):
            insts[config].append(inst)

    def fit_for(config: str, frames: List[pd.DataFrame]) -> cm.CostModel:
        ms = cm.Measurements()
        for f in frames:
            ms.extend(cm.busy_periods(f))
        if extra is not None:
            ms.extend(extra)
        if not len(ms.usable()):
            if fixed is None:
                raise ValueError(f"{config}: no collective measured to fit the network from")
            model = cm.described(fixed, backend[config], ppn_target or 1)
        else:
            model = cm.build(ms, backend[config], fixed, source="fitted to " + (
                "the measured collectives" if frames else "") + (" and " if frames and extra is not None else "")
                + (f"{bench}" if extra is not None else ""))
        model.gpus_per_node = ppn_target
        return model

    models: Dict[str, cm.CostModel] = {}
    for config, frames in insts.items():
        try:
            models[config] = fit_for(config, frames)
        except ValueError:
            raise UsageError(f"predict: {config}: no collective measured to fit the network from; "
                             "give --network bw=...,latency=... or --bench RESULTS.json / an nccl-tests log")
    return (lambda config: models[config]), fit_for


def predict(paths: Sequence[str], to: Optional[str] = None, mode: str = "weak", what_if: Sequence[str] = (),
            bench: Optional[str] = None, network: Optional[str] = None, gpus_per_node: Optional[int] = None,
            validate: bool = False, warmup: int = 1, steps: int = 60, reps: int = 24, seed: int = 0,
            group_by=None):
    """The prediction Report (tables "prediction", and "validation" when
    asked or when no --to is given)."""
    from .analyzers.report import predict_report

    if mode not in ("weak", "strong"):
        raise UsageError("predict: --scaling is weak or strong")
    runs = load_runs(paths, warmup, group_by)
    targets = _targets(to)
    try:
        what_ifs = [rp.parse_what_if(w) for w in what_if]
    except ValueError as exc:
        raise UsageError(f"predict: {exc}")
    comm_for, fit_for = comm_chooser(runs, bench, network, gpus_per_node)
    table = rp.predict_table([(c, st) for c, st, _i, _a in runs], targets, comm_for, mode=mode,
                             what_ifs=what_ifs, steps=steps, reps=reps, seed=seed)
    base = {}
    for config, g in table[table["kind"] == "measured"].groupby("config"):
        g = g.sort_values("gpus")
        base[config] = (int(g["gpus"].iloc[0]), float(g["samples_per_s"].iloc[0]))
    table = rp.add_efficiency(table, base)
    val = None
    if validate or not targets:
        val = rp.validate([(c, st, i) for c, st, i, _a in runs], fit_for, steps=steps, reps=reps, seed=seed)
    notes = _notes(runs, comm_for, mode, targets)
    return predict_report(table, val, notes)


def _notes(runs, comm_for, mode, targets) -> List[str]:
    notes = []
    seen = set()
    for config, st, _i, a in runs:
        if config in seen:
            continue
        seen.add(config)
        m = comm_for(config)
        notes.append(f"{config}: communication model: {m.describe()}"
                     + (f" (from {m.points} observations; relative scatter {100 * m.rel_err:.1f} %)"
                        if m.points else ""))
        f = m.fits[m.best]
        if m.source.startswith("fitted") and any(str(f.status.get(t, "")).startswith("assumed")
                                                 for t in ("inter_bw", "intra_bw")) and targets:
            lat = "the same step latency" if m.backend == "gloo" else "NCCL's network latency constants"
            notes.append(f"{config}: the collectives were measured inside one node only; across nodes the model "
                         f"assumes the same bandwidth and {lat} — give --network (and --gpus-per-node) or "
                         "--bench with a multi-node measurement for a real interconnect.")
    notes.append(f"{mode} scaling: " + ("per-rank batch fixed." if mode == "weak" else
                                          "global batch fixed: per-rank data, forward and backward time shrink "
                                          "with the per-rank batch (linear; small batches are usually less "
                                          "efficient on GPUs, so this is optimistic)."))
    notes.append("Replay: every simulated rank draws a measured (rank, step) sample each step; a bucket's "
                 "collective starts when the last rank has it ready and the previous bucket is done, and "
                 "lasts the cost model's time at N; exposed communication is what the backward did not hide. "
                 "Interval: 5-95 % over replays with the cost model's interval ends (its plausible forms, "
                 "the terms' standard errors and the fit's scatter, and a naive answer that beat the model "
                 "held out). Beside it, the share replayed with each naive answer in the model's place: "
                 "'comm % constant busbw' (the bus bandwidth at the largest measured count, carried to N) and "
                 "'comm % log2 nodes' (each size's time linear in log2(nodes) through the measured counts; "
                 "empty with one count of that scope).")
    return notes
