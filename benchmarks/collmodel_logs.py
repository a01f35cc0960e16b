"""The collective cost model against real nccl-tests logs (not a test:
tests/analyzers/test_collmodel.py asserts bounds on the same numbers).

Fits the model on the two 2-node logs of NVIDIA/nccl-tests issue 309
(8 x H100 per node, IB 400G; the default run and NCCL_ALGO=Ring) and
predicts the 4- and 8-node logs of the same cluster, all_reduce over
1 MiB - 1 GiB (the logs start at 1 MiB), printing per size the measured
time (the faster of out-of-place and in-place), the prediction and its
error, then per log the median and worst |error|: of the model, against
the out-of-place column alone, and of a constant-busbw extrapolation (the
2-node bus bandwidth of each size, carried to N ranks).

Then the two ABCI 2.0 clusters (A100 8 a node, V100 4 a node; 4 - 128
GPUs, 4 B - 32 MiB) and one A100 node's three collectives (superbench):
per set the in-sample |error| (fitted on every count), and held out
(fitted at 4 - 16 GPUs, predicted at 64 and 128, 64 KiB - 32 MiB) the
model beside both naive answers (constant busbw: the 16-GPU bus bandwidth
carried to N; log2 nodes: linear in log2(nodes) through the measured
counts, where two multi-node counts were measured).

    python benchmarks/collmodel_logs.py
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from commprof.analyzers import collmodel as cm  # noqa: E402
from commprof.convert import nccltests as nt  # noqa: E402
from commprof.trace.ops import bus_factor  # noqa: E402

LOGS = os.path.join(ROOT, "tests", "fixtures", "nccl-tests")
FIT = ["nccltests309-gjaion_2n_16g_allreduce.log", "nccltests309-gjaion_2n_16g_allreduce_ring_minctas24_qps2.log"]
PREDICT = ["nccltests309-gjaion_4n_32g_allreduce.log", "nccltests309-gjaion_8n_64g_allreduce.log",
           "nccltests309-gjaion_8n_64g_allreduce_minctas24_qps2.log"]


def log(name):
    return nt.import_logs([os.path.join(LOGS, name)])[0]


def main():
    ms = cm.Measurements()
    for name in FIT:
        d = log(name)
        ms.extend(cm.from_rows(d["rows"], forced=d.get("algorithm") or ""))
    model = cm.build(ms, "nccl")
    ref = {r["bytes"]: r for r in log(FIT[0])["rows"]}
    print(f"fitted on: {', '.join(FIT)}")
    for name in PREDICT:
        d = log(name)
        n, ppn = d["world_size"], d["ranks_per_node"]
        print(f"\n{name}: {n} ranks, {ppn} per node")
        print(f"{'bytes':>12} {'measured us':>12} {'out-of-place us':>16} {'predicted us':>13} {'error %':>8} "
              f"{'algorithm':>14} {'flat busbw %':>13}")
        err, oop, flat = [], [], []
        for r in d["rows"]:
            s = r["bytes"]
            if not (1 << 20) <= s <= (1 << 30):
                continue
            t = cm.row_time_us(r)
            est = model.estimate("all_reduce", s, n, ppn)
            p = est["time_s"] * 1e6
            busbw = s * bus_factor("all_reduce", 16) / cm.row_time_us(ref[s])
            t_flat = s * bus_factor("all_reduce", n) / busbw
            err.append(abs(p - t) / t * 100)
            oop.append(abs(p - r["out_of_place"]["time_us"]) / r["out_of_place"]["time_us"] * 100)
            flat.append(abs(t_flat - t) / t * 100)
            print(f"{s:>12} {t:>12.1f} {r['out_of_place']['time_us']:>16.1f} {p:>13.1f} {err[-1]:>8.1f} "
                  f"{est['algorithm']:>14} {flat[-1]:>13.1f}")
        e, o, f = np.array(err), np.array(oop), np.array(flat)
        print(f"sizes {len(e)}: model median {np.median(e):.1f} %, worst {e.max():.1f} %; out-of-place only "
              f"median {np.median(o):.1f} %, worst {o.max():.1f} %; constant busbw median {np.median(f):.1f} %, "
              f"worst {f.max():.1f} %")


def _docs(names):
    return [d for n in names for d in nt.import_logs([os.path.join(LOGS, n)])]


def more_sets():
    files = sorted(os.listdir(LOGS))
    sets = {"ABCI 2.0 A100 (8 a node)": [f for f in files if f.startswith("abci2-a100_") and "early" not in f],
            "ABCI 2.0 V100 (4 a node)": [f for f in files if f.startswith("abci2-v100_") and "early" not in f],
            "nccl-tests 309 H100 (8 a node)": [f for f in files
                                               if f.startswith("nccltests309-") and "minctas" not in f],
            "superbench A100 node, all_reduce": ["superbench-a100_1n_8g_allreduce.log"],
            "superbench A100 node, all_gather": ["superbench-a100_1n_8g_allgather.log"],
            "superbench A100 node, reduce_scatter": ["superbench-a100_1n_8g_reducescatter.log"]}
    print("\nin sample (fitted on every count of the set)")
    print(f"{'set':<38} {'rows':>5} {'median %':>9} {'p90 %':>7} {'worst %':>8}  protocols at the largest count")
    for name, fs in sets.items():
        docs = _docs(fs)
        model = cm.build(cm.from_logs(docs), "nccl", compare_baselines=False)
        e = np.concatenate([cm.row_errors(model, d) for d in docs])
        big = max(docs, key=lambda d: d["world_size"])
        sw = model.fits[model.best].switch_points(big["op"], big["world_size"], big["ranks_per_node"])
        print(f"{name:<38} {len(e):>5} {np.median(e):>9.1f} {np.percentile(e, 90):>7.1f} {e.max():>8.1f}  "
              + ", ".join(f"{c} from {s} B" for s, c in sw))
    print("\nheld out: fitted at 4-16 GPUs, predicted at 64 and 128 (64 KiB - 32 MiB)")
    print(f"{'set':<26} {'N':>4} {'model median/worst %':>21} {'constant busbw %':>17} {'log2 nodes %':>13}")
    for name in list(sets)[:2]:
        docs = {d["world_size"]: d for d in _docs(sets[name])}
        train = cm.from_logs([docs[n] for n in docs if n <= 16])
        model = cm.build(train, "nccl", compare_baselines=False)
        base = cm.Baselines(train)
        for n in (64, 128):
            d = docs[n]
            e = cm.row_errors(model, d, 64 << 10)
            rows = [r for r in d["rows"] if r["bytes"] >= 64 << 10]
            t = np.array([cm.row_time_us(r) * 1e-6 for r in rows])
            fl = np.array([base.constant_busbw("all_reduce", r["bytes"], n, d["ranks_per_node"]) for r in rows])
            lg = np.array([base.log2_nodes("all_reduce", r["bytes"], n, d["ranks_per_node"]) for r in rows])
            fe, le = np.abs(fl - t) / t * 100, np.abs(lg - t) / t * 100
            lg_s = f"{np.median(le):.1f}/{le.max():.1f}" if np.isfinite(le).all() else "n/a (one count)"
            print(f"{name[:26]:<26} {n:>4} {np.median(e):>10.1f}/{e.max():<10.1f} "
                  f"{np.median(fe):>8.1f}/{fe.max():<8.1f} {lg_s:>13}")


if __name__ == "__main__":
    main()
    more_sets()
