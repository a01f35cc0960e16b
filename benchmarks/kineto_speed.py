"""Kineto traces at scale (not a test): Holistic Trace Analysis vs commprof,
each as a fresh process, interleaved.

- HTA 0.5.0: ``TraceAnalysis(trace_dir)`` + ``get_temporal_breakdown`` +
  ``get_comm_comp_overlap``;
- commprof: ``commprof import kineto DIR -o T`` then ``commprof report T``
  (the report computes the same temporal breakdown and overlap).

Per tool and repeat: wall time and the peak RSS of the whole process tree
(psutil, sampled every 20 ms: worker processes count). Then both temporal
breakdowns are compared per rank (HTA rounds its percentages to 2 decimals).

    python benchmarks/kineto_speed.py --ranks 8 --kernels 200000 [--repeats 3] [--data DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

HTA = """
import json, sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
tb = a.get_temporal_breakdown(visualize=False)
ov = a.get_comm_comp_overlap(visualize=False)
json.dump({"temporal": tb.to_dict("records"), "overlap": ov.to_dict("records")}, open(sys.argv[2], "w"))
"""


STAGES = """
import gc, json, sys, time
from commprof.convert import kineto_fast as kf
out = []
for rep in range(3):
    gc.disable()
    c0 = time.process_time(); data = kf.read_bytes(sys.argv[1])
    c1 = time.process_time(); doc = kf._DECODER.decode(data); del data
    c2 = time.process_time(); kf.convert_doc(doc, sys.argv[1], None)
    c3 = time.process_time(); del doc
    c4 = time.process_time()
    gc.enable()
    out.append({"inflate": c1 - c0, "decode": c2 - c1, "convert": c3 - c2, "free": c4 - c3})
print(json.dumps(out))
"""


def measure(cmd, env=None):
    """(wall s, peak RSS of the process tree in MiB, returncode)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    proc = psutil.Process(p.pid)
    while p.poll() is None:
        try:
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    err = p.stderr.read()
    if p.returncode != 0:
        sys.exit(f"{cmd[:4]} failed: {err[-2000:]}")
    return time.perf_counter() - t0, peak / 2**20


def agreement(hta_rows, trace):
    """Per rank: HTA's temporal breakdown vs commprof's, exact and with HTA's
    own rounding applied to the events (HTA's parser rounds every event
    inward to whole microseconds: start up, end down — ``round_down_time_stamps``,
    pytorch/pytorch#122425 — then rounds the percentages to 2 decimals).
    Returns {metric: (max |HTA - exact|, max |HTA - HTA-rounded|)} in pp."""
    import numpy as np

    sys.path.insert(0, ROOT)
    import commprof
    from commprof.analyzers import kernels

    ev = commprof.load(trace).events()
    exact = kernels.temporal_breakdown(ev, hta_window=True).set_index("rank")
    ts, te = ev["t_start"].to_numpy(np.int64), ev["t_end"].to_numpy(np.int64)
    ev = ev.assign(t_start=-(-ts // 1000) * 1000, t_end=(te // 1000) * 1000)
    rounded = kernels.temporal_breakdown(ev, hta_window=True).set_index("rank").round(2)
    out = {}
    for ours, theirs in (("idle_pct", "idle_time_pctg"), ("compute_pct", "compute_time_pctg"),
                         ("non_compute_pct", "non_compute_time_pctg")):
        h = {int(r["rank"]): r[theirs] for r in hta_rows}
        out[ours] = (max(abs(h[k] - exact.loc[k, ours]) for k in h),
                     max(abs(h[k] - rounded.loc[k, ours]) for k in h))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--kernels", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=None, help="where the generated traces live (kept between runs)")
    p.add_argument("--no-hta", action="store_true")
    a = p.parse_args()
    data = a.data or os.path.join(tempfile.gettempdir(), f"commprof-kineto-{a.ranks}x{a.kernels}")
    subprocess.run([PY, os.path.join(ROOT, "benchmarks", "kineto_gen.py"), data, "--ranks", str(a.ranks),
                    "--kernels", str(a.kernels)], check=True, stdout=subprocess.DEVNULL)
    size = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data)) / 2**20
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = {"hta": [], "import": [], "report": [], "commprof": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            if not a.no_hta:
                w, m = measure([PY, "-c", HTA, data, os.path.join(tmp, "hta.json")], env)
                res["hta"].append((w, m))
                print(f"run {i + 1}: HTA {w:.1f} s, {m:.0f} MiB", file=sys.stderr, flush=True)
            out = os.path.join(tmp, f"t{i}.parquet")
            wi, mi = measure([PY, "-m", "commprof", "import", "kineto", data, "-o", out], env)
            wr, mr = measure([PY, "-m", "commprof", "report", out, "--format", "json", "-o",
                              os.path.join(tmp, "rep.json")], env)
            res["import"].append((wi, mi))
            res["report"].append((wr, mr))
            res["commprof"].append((wi + wr, max(mi, mr)))
            print(f"run {i + 1}: commprof import {wi:.1f} s / {mi:.0f} MiB + report {wr:.1f} s / {mr:.0f} MiB",
                  file=sys.stderr, flush=True)
            if i < a.repeats - 1:
                os.remove(out)
        agree = None
        if not a.no_hta:
            hta = json.load(open(os.path.join(tmp, "hta.json")))["temporal"]
            agree = agreement(hta, out)

    # what limits it: CPU per rank file and stage (fresh process, median of 3)
    stages = json.loads(subprocess.run([PY, "-c", STAGES, os.path.join(data, sorted(os.listdir(data))[0])],
                                       env=env, check=True, capture_output=True, text=True).stdout)

    def med(xs, k):
        v = sorted(x[k] for x in xs)
        return v[len(v) // 2], v[0], v[-1]

    print(f"\n{a.ranks} ranks x {a.kernels:,} kernels ({size:.0f} MiB of .json.gz), {a.repeats} interleaved "
          f"repeats, {os.cpu_count()} cores\n")
    print("| tool | what | wall s (median, min-max) | peak RSS MiB (median) |")
    print("|---|---|---:|---:|")
    rows = [("Holistic Trace Analysis 0.5.0", "load + temporal breakdown + comm/comp overlap", "hta"),
            ("commprof", "`import kineto`", "import"), ("commprof", "`report` on the imported trace", "report"),
            ("commprof", "import + report", "commprof")]
    for tool, what, k in rows:
        if not res[k]:
            continue
        w, lo, hi = med(res[k], 0)
        print(f"| {tool} | {what} | {w:.1f} ({lo:.1f}-{hi:.1f}) | {med(res[k], 1)[0]:.0f} |")
    if res["hta"]:
        print(f"\nspeed-up end to end: x{med(res['hta'], 0)[0] / med(res['commprof'], 0)[0]:.1f}; "
              f"peak memory: {med(res['commprof'], 1)[0]:.0f} vs {med(res['hta'], 1)[0]:.0f} MiB")
    per = {k: sorted(r[k] for r in stages)[1] for k in stages[0]}
    print("\nCPU per rank file (one process, median of 3): " + ", ".join(f"{k} {v:.2f} s" for k, v in per.items())
          + f" = {sum(per.values()):.2f} s; x {a.ranks} ranks / {os.cpu_count()} cores = "
          f"{sum(per.values()) * a.ranks / os.cpu_count():.1f} s of import at best")
    if agree:
        print("temporal breakdown per rank, largest |HTA - commprof| (pp): "
              + ", ".join(f"{k} {e:.2f} exact / {r:.2f} with HTA's µs rounding" for k, (e, r) in agree.items()))

if __name__ == "__main__":
    main()
