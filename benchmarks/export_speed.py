"""Speed and peak memory of ``commprof export chrome`` on a large synthetic
trace (not a test): the trace of benchmarks/report_speed.py (generated the
same way, 64 ranks on 16 hosts by default), exported merged with flows to a
.json.gz as a fresh process, best of ``--repeats``, wall clock and peak
resident memory (``/usr/bin/time -f %M``).

    python benchmarks/export_speed.py --events 10000000 --ranks 64
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from report_speed import EVENTS_PER_STEP, timed  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dir", default="/tmp/commprof-bench")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    steps = max(1, args.events // (args.ranks * EVENTS_PER_STEP))
    out = os.path.join(args.dir, f"{args.ranks}x{steps}")
    path = os.path.join(out, "trace.parquet")
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(HERE, "report_speed.py"), "--generate-only", "--events",
                        str(args.events), "--ranks", str(args.ranks), "--dir", args.dir], check=True)
    target = os.path.join(out, "timeline.json.gz")
    cmd = [sys.executable, "-m", "commprof", "export", "chrome", path, "-o", target]
    runs = [timed(cmd) for _ in range(args.repeats)]
    size = os.path.getsize(target)
    wall, peak = min(w for w, _ in runs), max(m for _, m in runs)
    import pyarrow.parquet as pq

    n = pq.ParquetFile(path).metadata.num_rows
    print(f"| {n:,} events ({args.ranks} ranks x {steps:,} steps) | {wall:.1f} s | {peak:.0f} MiB "
          f"| {n / wall / 1e3:,.0f} k events/s | {size / 1e6:.0f} MB gz |")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
