"""False-accusation rate and detection limit of the report's findings,
through the whole ``commprof report`` (not a test).

Traces come from the independent simulator of synchronous data-parallel
steps (tests/simsync.py: per-rank log-normal jitter of data, forward,
backward and optimizer; DDP-like buckets that complete on every rank when
the last rank issued them; a planted straggler or slow host). Each trace is
written to Parquet and reported as a user would (``commprof.load(path)
.report()``); a run *accuses* when its bottleneck table names a rank or a
host: a ``straggler:`` or ``slow node:`` finding, or a critical-path
finding that names a gate rank "(why: ...)".

1. Pure jitter (equal ranks) at 2, 8 and 64 ranks: the share of runs
   with any accusation, with its exact 95 % (Clopper-Pearson) interval.
2. One rank slowed by delta ms of backward at every step, 8 ranks x 50
   steps: the share of runs naming that rank, per delta; the detection
   limit is the smallest delta found in >= 90 % of runs.

    python benchmarks/findings_power.py --out benchmarks/results/findings_power/2026-12-02-5be3f7a.md
"""
import argparse
import datetime
import math
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import commprof  # noqa: E402
from commprof.analyzers import evidence as ev  # noqa: E402
from simsync import Sim  # noqa: E402

ACCUSE = re.compile(r"^(straggler: rank (\d+)|slow node in compute: (\S+))")
GATE = re.compile(r"rank (\d+) is the last ready in .*\(why: ")


def accused(path):
    b = commprof.load(path).report().tables["bottlenecks"].frame
    who = set()
    for _, r in b.iterrows():
        m = ACCUSE.match(r["finding"])
        if m:
            who.add(("rank", int(m.group(2))) if m.group(2) else ("node", m.group(3)))
        g = GATE.search(str(r["evidence"])) if r["finding"].startswith("critical path") else None
        if g:
            who.add(("rank", int(g.group(1))))
    return who


def beta_ppf(q, a, b):
    """Quantile of Beta(a, b) by bisection on the binomial tail (no SciPy):
    for integer a, b, P(Beta(a, b) <= x) = P(Binomial(a + b - 1, x) >= a)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if ev.binomial_sf(a, a + b - 1, mid) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k, n):
    lo = 0.0 if k == 0 else beta_ppf(0.025, k, n - k + 1)
    hi = 1.0 if k == n else beta_ppf(0.975, k + 1, n - k)
    return lo, hi


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=100, help="runs per pure-jitter case (2 and 8 ranks)")
    ap.add_argument("--seeds-64", type=int, default=30)
    ap.add_argument("--power-seeds", type=int, default=30)
    ap.add_argument("--deltas", default="0.5,0.75,1,1.25,1.5,2,3")
    ap.add_argument("--out")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "t.parquet")
    lines = []
    t0 = time.time()

    lines += ["## False accusations on pure jitter", "",
              "| ranks | hosts | steps | runs | runs accusing anybody | rate | 95 % interval |",
              "|---|---|---|---|---|---|---|"]
    for world, steps, seeds, gpn in ((2, 50, a.seeds, 1), (8, 50, a.seeds, 4), (64, 30, a.seeds_64, 8)):
        k = 0
        for s in range(seeds):
            k += bool(accused(Sim(world, steps, seed=10_000 + s, gpus_per_node=gpn).run().write(path)))
        lo, hi = clopper_pearson(k, seeds)
        lines.append(f"| {world} | {world // gpn} | {steps} | {seeds} | {k} | {100 * k / seeds:.1f} % | "
                     f"{100 * lo:.1f}-{100 * hi:.1f} % |")
        print(lines[-1], flush=True)

    lines += ["", "## Detection of one slowed rank (8 ranks on 2 hosts, 50 steps, backward + delta)", "",
              "| delta ms | delta / work sd | runs | rank named | other ranks named | rate |",
              "|---|---|---|---|---|---|"]
    limit = None
    for delta in (float(x) for x in a.deltas.split(",")):
        hit = other = 0
        for s in range(a.power_seeds):
            who = accused(Sim(8, 50, seed=20_000 + s, gpus_per_node=4, slow_rank=5, delta_ms=delta)
                          .run().write(path))
            hit += ("rank", 5) in who
            other += any(w[0] == "rank" and w[1] != 5 for w in who)
        rate = hit / a.power_seeds
        # work sd of one rank: 5 % log-normal jitter of 2 + 10 + 20 + 3 ms
        sd = 0.05 * math.sqrt(2 ** 2 + 10 ** 2 + 20 ** 2 + 3 ** 2)
        lines.append(f"| {delta:g} | {delta / sd:.2f} | {a.power_seeds} | {hit} | {other} | {100 * rate:.0f} % |")
        print(lines[-1], flush=True)
        if limit is None and rate >= 0.9:
            limit = delta
    lines += ["", f"Detection limit (>= 90 % of runs name the slowed rank): "
              f"{'%g ms' % limit if limit is not None else 'not reached'} of extra backward per step, "
              f"at 8 ranks x 50 steps with 5 % jitter per phase."]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    head = ["# Findings against chance: false accusations and detection limit", "",
            f"Command: `python benchmarks/findings_power.py --seeds {a.seeds} --seeds-64 {a.seeds_64} "
            f"--power-seeds {a.power_seeds} --deltas {a.deltas}`  ",
            f"Date: {datetime.date.today()}  Commit: {commit}  Wall: {time.time() - t0:.0f} s  ",
            "Each run: a trace from tests/simsync.py written to Parquet and reported by `commprof.load(path)"
            ".report()`; accusing = a `straggler:` / `slow node:` finding or a critical-path gate rank.", ""]
    text = "\n".join(head + lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
