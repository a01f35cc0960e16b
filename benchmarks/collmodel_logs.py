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


if __name__ == "__main__":
    main()
