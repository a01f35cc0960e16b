"""Speed and peak memory of ``commprof report`` on large synthetic traces
(not a test).

Writes a merged trace of about ``--events`` events (``benchmarks/synth.py``
shape: 11 events per rank and step with 4 DDP buckets), then times, each
as a fresh process (best of ``--repeats``, wall clock, peak resident
memory as ``/usr/bin/time -f %M`` reports it):

- a bare scan: ``python -c "pyarrow.parquet.read_table(TRACE,
  columns=<the columns the report reads>)"``;
- ``commprof report TRACE --format json -o /dev/null``.

One untimed report runs first (``--untimed``), so that every timed scan
follows a report and every timed report follows a scan, whatever ran
before the benchmark: on a VM that hands freed memory back to its host a
scan started straight after a process that freed ~2 GiB of huge pages
(another scan, or the warm scan that ends this benchmark) reuses them and
takes about half the time (10 M events, 2026-12-06: a scan after a scan
0.85-1.20 s, after a report 1.40-1.99 s; the report the same after
either); without that round the first scan's time depended on what ran
before the benchmark (benchmarks/results/report_speed/2026-12-06-3db02ca.md,
2026-12-06-1100b59.md).

It also prints the scan repeated inside one process (the allocator warm:
the fastest a scan gets), for reference, measured last and in a child of
its own: this process never holds the events, so every command here runs
on a 24 GiB machine (the 100 M-event scan alone needs ~10 GiB). The trace
is generated in another process first (a child's ru_maxrss would include
the forking parent's). It says so where the machine is a VM that hands
free memory back to its host (free page reporting): there a scan is fast
only right after a process that freed huge pages.

    python benchmarks/report_speed.py --events 10000000 --ranks 64
    python benchmarks/report_speed.py --events 100000000 --ranks 128 --repeats 1
"""
import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import pyarrow.parquet as pq  # noqa: E402

from commprof.analyzers.report import REPORT_COLUMNS  # noqa: E402
from commprof.assemble import merge  # noqa: E402
from synth import write  # noqa: E402

EVENTS_PER_STEP = 11
#: three scans in one process; prints each one's seconds, then the MiB of
#: the first one's table held in transparent huge pages (-1: not known)
WARM_SCAN = """
import ast, sys, time
import pyarrow.parquet as pq
cols = ast.literal_eval(sys.argv[2])
huge = -1
for i in range(3):
    t0 = time.perf_counter()
    table = pq.read_table(sys.argv[1], columns=cols)
    t = time.perf_counter() - t0
    if i == 0:
        try:
            with open("/proc/self/smaps_rollup") as fh:
                huge = next(int(line.split()[1]) // 1024 for line in fh if line.startswith("AnonHugePages:"))
        except (OSError, StopIteration, ValueError):
            pass
    del table
    print(t)
print(huge)
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default="/tmp/commprof-bench")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--untimed", type=int, default=1, metavar="N",
                   help="untimed reports before the timed rounds (default 1: every timed scan then follows a report)")
    p.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    steps = max(1, args.events // (args.ranks * EVENTS_PER_STEP))
    out = os.path.join(args.dir, f"{args.ranks}x{steps}")
    path = os.path.join(out, "trace.parquet")
    if args.generate_only:
        t0 = time.perf_counter()
        shutil.rmtree(out, ignore_errors=True)
        shard_dir, n = write(out, args.ranks, steps)
        merge(shard_dir, path, {"run_id": "bench"})
        shutil.rmtree(shard_dir)
        print(f"generated {n:,} events in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return
    if not os.path.exists(path):
        subprocess.run([sys.executable, __file__, "--generate-only", "--events", str(args.events),
                        "--ranks", str(args.ranks), "--dir", args.dir], check=True)
    n = pq.ParquetFile(path).metadata.num_rows
    size = os.path.getsize(path)
    # commprof's bytecode written, as an installed package has it (pip
    # compiles at install; with PYTHONDONTWRITEBYTECODE set and no
    # __pycache__, every report would compile its ~50 modules first:
    # ~0.08 s on one core, 10 M events, 5 pairs)
    for package in ("commprof", "analyzers"):
        compileall.compile_dir(os.path.join(ROOT, package), quiet=1)
    scan = [sys.executable, "-c", "import sys, pyarrow.parquet as pq; "
            f"pq.read_table(sys.argv[1], columns={REPORT_COLUMNS!r})", path]
    report = [sys.executable, "-m", "commprof", "report", path, "--format", "json", "-o", os.devnull]
    scans, runs, scan_cpu, run_cpu = [], [], [], []
    for _ in range(args.untimed):
        timed(report)
    for _ in range(args.repeats):  # interleaved, so both see the same machine
        scans.append(timed(scan, scan_cpu))
        runs.append(timed(report, run_cpu))
    s_best, r_best = min(w for w, _ in scans), min(w for w, _ in runs)
    s_peak, r_peak = max(m for _, m in scans), max(m for _, m in runs)
    warm = subprocess.run([sys.executable, "-c", WARM_SCAN, path, repr(REPORT_COLUMNS)], check=True,
                          capture_output=True, text=True).stdout.split()
    warm, huge = [float(w) for w in warm[:-1]], int(warm[-1])
    print(f"| {n:,} events ({args.ranks} ranks x {steps:,} steps, {size / 1e6:.0f} MB) "
          f"| {s_best:.2f} s, {s_peak:.0f} MiB | {r_best:.2f} s, {r_peak:.0f} MiB | x{r_best / s_best:.1f} "
          f"| {min(warm):.2f} s |")
    # each report against the scan run just before it: the scan's own time
    # varies by x1.8 and more on a VM (its huge pages: below), so the pairs'
    # ratios say how much of a best-vs-best ratio is the scan's luck
    ratios = sorted(r / s for (s, _), (r, _) in zip(scans, runs))
    print(f"untimed reports first: {args.untimed}")
    print(f"pairs (report / the scan just before it), {len(ratios)}: median x{statistics.median(ratios):.2f}, "
          f"range x{ratios[0]:.2f}-x{ratios[-1]:.2f}; scans {min(w for w, _ in scans):.2f}-"
          f"{max(w for w, _ in scans):.2f} s, reports {r_best:.2f}-{max(w for w, _ in runs):.2f} s")
    # CPU next to wall: the scan's system time is the kernel faulting in its
    # memory, what moves its wall time from hour to hour
    for name, cpu in (("scan", scan_cpu), ("report", run_cpu)):
        print(f"{name} CPU, user + system (s): " + ", ".join(f"{u:.2f} + {k:.2f}" for u, k in cpu))
    # pyarrow's default pool (mimalloc) takes the scan's memory in huge pages
    # where the kernel grants them: fast where another process has just freed
    # them, slow where they must be found anew
    # (benchmarks/results/report_speed/2026-12-05-0ff3190.md)
    if huge >= 0:
        print(f"the scan's table: {huge:,} MiB in transparent huge pages (its system time, and so its wall "
              f"time, depends on whether free huge pages are at hand)")
    if free_page_reporting():
        print("this VM hands free memory back to its host (virtio balloon, free page reporting): a process "
              "faults in again, on the host as well, what was freed more than a few seconds before it started "
              "(benchmarks/results/report_speed/2026-12-06-aab9661.md)")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)


def free_page_reporting() -> bool:
    """Whether a virtio balloon device here offers free page reporting
    (VIRTIO_BALLOON_F_REPORTING, feature bit 5): the guest then gives free
    blocks of 2 MiB and more back to the host soon after they are freed."""
    import glob

    for dev in glob.glob("/sys/bus/virtio/devices/*"):
        try:
            with open(os.path.join(dev, "device")) as fh:
                kind = int(fh.read().strip(), 16)
            with open(os.path.join(dev, "features")) as fh:
                bits = fh.read().strip()
        except (OSError, ValueError):
            continue
        if kind == 5 and len(bits) > 5 and bits[5] == "1":
            return True
    return False


def timed(cmd, cpu=None):
    """(wall seconds, peak RSS MiB) of a command run as a fresh process;
    its (user, system) CPU seconds appended to ``cpu`` when given."""
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M %U %S"] + cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(proc.stderr)
    rss, user, system = proc.stderr.strip().splitlines()[-1].split()
    if cpu is not None:
        cpu.append((float(user), float(system)))
    return wall, int(rss) / 1024


if __name__ == "__main__":
    main()
