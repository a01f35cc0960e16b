"""``commprof predict``: measured runs in, the study extended to GPU counts
nobody ran (and what-ifs) out, and ``--validate``: each measured size
predicted from the others. Reads traces through the API, hands arrays to
:mod:`commprof.analyzers.replay` (the model) and gives a Report."""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence, Tuple

import pandas as pd

from .analyzers import replay as rp
from .errors import UsageError

STRUCTURE_COLUMNS = ["rank", "step", "category", "name", "t_start", "t_end", "bytes", "blocking"]


def instances_of(analysis) -> pd.DataFrame:
    """Collective instances seen on several ranks: group, seq, op, bytes,
    group size, the last rank's issue and the mean completion (seconds, on
    aligned clocks) — what the network model is fitted to."""
    inst = analysis.colls.instances()
    cols = ["group", "seq", "op", "bytes", "group_size", "last_issue_s", "end_s"]
    if inst.empty or "mean_end_ms" not in inst:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame({"group": inst["group"].astype(str), "seq": inst["seq"].astype("int64"),
                         "op": inst["op"].astype(str), "bytes": inst["bytes"].astype(float),
                         "group_size": inst["ranks"].astype(int), "last_issue_s": inst["last_issue_ms"] / 1e3,
                         "end_s": inst["mean_end_ms"] / 1e3})[cols]


def load_runs(paths: Sequence[str], warmup: int = 1, group_by=None):
    """[(config label, Structure, instances, RunAnalysis)] of the runs
    (study folders expanded, the 1-GPU baseline adopted as in the report)."""
    from .analyzers.scaling import adopt_baselines
    from .api import _expand, _one, join_jobs

    traces = join_jobs([_one(p) for p in _expand(list(paths))])
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
    if not text:
        return []
    out = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "..." in part or ".." in part:
            raise UsageError(f"predict: --to lists GPU counts (8,16,32,...), got {part!r}")
        try:
            n = int(part)
        except ValueError:
            raise UsageError(f"predict: --to expects GPU counts like 8,16,1024, got {part!r}")
        if n < 1:
            raise UsageError("predict: GPU counts must be >= 1")
        out.append(n)
    return sorted(set(out))


def comm_chooser(runs, bench: Optional[str], network: Optional[str], gpus_per_node: Optional[int]):
    """config -> CommModel: a bench model, else the described network, else
    fitted to the configuration's measured collectives."""
    fixed = None
    if bench:
        try:
            with open(bench) as fh:
                fixed = rp.bench_model(json.load(fh))
        except (OSError, ValueError) as exc:
            raise UsageError(f"predict: --bench {bench}: {exc}")
    elif network:
        try:
            fixed = rp.network_model(network)
        except ValueError as exc:
            raise UsageError(f"predict: {exc}")
    fitted: Dict[str, rp.CommModel] = {}
    for config, _st, inst, a in runs:
        fitted.setdefault(config, [])
        if len(inst):
            fitted[config].append(inst)
    models: Dict[str, rp.CommModel] = {}
    for config, insts in fitted.items():
        if fixed is not None:
            models[config] = fixed
            continue
        if not insts:
            raise UsageError(f"predict: {config}: no collective measured to fit the network from; "
                             "give --network bw=...,latency=... or --bench MODEL.json")
        m = rp.fit_comm(pd.concat(insts, ignore_index=True))
        if gpus_per_node:
            m.gpus_per_node = gpus_per_node
        models[config] = m
    return lambda config: models[config]


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
    comm_for = comm_chooser(runs, bench, network, gpus_per_node)
    table = rp.predict_table([(c, st) for c, st, _i, _a in runs], targets, comm_for, mode=mode,
                             what_ifs=what_ifs, steps=steps, reps=reps, seed=seed)
    base = {}
    for config, g in table[table["kind"] == "measured"].groupby("config"):
        g = g.sort_values("gpus")
        base[config] = (int(g["gpus"].iloc[0]), float(g["samples_per_s"].iloc[0]))
    table = rp.add_efficiency(table, base)
    val = None
    if validate or not targets:
        override = comm_for(runs[0][0]) if (bench or network) else None
        val = rp.validate([(c, st, i) for c, st, i, _a in runs], steps=steps, reps=reps, seed=seed,
                          comm_override=override)
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
                     + (f" (from {m.points} busy periods of the collectives; residual {100 * m.rel_err:.1f} % "
                        "of their time)" if m.points else ""))
        hosts = len(set((a.hosts or {}).values())) or 1
        if m.source.startswith("fitted") and hosts == 1 and any(n > st.world for n in targets) and \
                a.world_size > 1:
            notes.append(f"{config}: the collectives were measured inside one host; predictions beyond it assume "
                         "the same bandwidth across nodes — give --network or --bench for a real interconnect.")
    notes.append(f"{mode} scaling: " + ("per-rank batch fixed." if mode == "weak" else
                                          "global batch fixed: per-rank data, forward and backward time shrink "
                                          "with the per-rank batch (linear; small batches are usually less "
                                          "efficient on GPUs, so this is optimistic)."))
    notes.append("Replay: every simulated rank draws a measured (rank, step) sample each step; a bucket's "
                 "collective starts when the last rank has it ready and the previous bucket is done, and "
                 "lasts the model's time at N; exposed communication is what the backward did not hide. "
                 "Interval: 5-95 % over replays, widened by twice the model's relative residual.")
    return notes
