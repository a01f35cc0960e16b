"""A job that dies, recorded N times: does the report name the failure,
the aborting rank and its signal, and the mismatched collective with both
sides, every time (no race between the abort and the last flush)? Not a
test (tests/record/test_failure.py runs the same scenario 3 times).

The job (tests/workloads/multinode.py, 2 ranks, DDP over gloo): rank 1
skips the 4 KiB all_reduce of step 30 and goes on to its next DDP bucket;
rank 0's 4 KiB call meets that bucket, gloo aborts rank 0 (SIGABRT) and
rank 1 fails with a connection reset.

    python benchmarks/failure_repeat.py [--runs 10] [--out FILE.md]
"""
import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import commprof  # noqa: E402

MULTI = os.path.join(ROOT, "tests", "workloads", "multinode.py")


def one(folder: str):
    cmd = [sys.executable, "-m", "commprof", "record", "-o", folder, "--nproc", "2", "--", sys.executable, MULTI,
           "--steps", "50", "--skip-rank", "1", "--skip-at", "30"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    wall = time.monotonic() - t0
    finds = commprof.load(folder).report().tables["bottlenecks"].frame
    fail = finds[finds["bound"] == "failure"]
    if fail.empty:
        return proc.returncode, wall, "", "", False
    f, e = fail.iloc[0]["finding"], fail.iloc[0]["evidence"]
    ok = (f.startswith("job failed: rank 0 aborted (SIGABRT) in all_reduce 4,096 B")
          and "rank 0 all_reduce 4,096 B torch.float32 from user code" in e
          and "from the DDP reducer" in e)
    return proc.returncode, wall, f, e, ok


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    t0 = time.time()
    lines = ["| run | exit | wall s | named as expected | finding |", "|---:|---:|---:|---|---|"]
    good = 0
    example = ""
    for i in range(a.runs):
        d = tempfile.mkdtemp(prefix="commprof-fail-")
        try:
            rc, wall, f, e, ok = one(os.path.join(d, "rec"))
        finally:
            shutil.rmtree(d, ignore_errors=True)
        good += ok
        example = example or (f"{f}\n    evidence: {e}" if ok else "")
        lines.append(f"| {i + 1} | {rc} | {wall:.1f} | {'yes' if ok else 'NO'} | {f} |")
        print(lines[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    head = ["# A job that dies, recorded repeatedly: the failure named every time", "",
            f"Command: `python benchmarks/failure_repeat.py --runs {a.runs}`  ",
            f"Date: {datetime.date.today()}  Commit: {commit}  Wall: {time.time() - t0:.0f} s  ",
            "Job: tests/workloads/multinode.py on 2 gloo ranks; rank 1 skips the 4 KiB all_reduce of step 30, "
            "so rank 0's call meets rank 1's next DDP bucket and gloo aborts rank 0.", "",
            f"**{good} of {a.runs}** runs name rank 0's abort (SIGABRT) in the 4,096 B all_reduce and the "
            "mismatched instance with both sides.", ""]
    tail = ["", "The finding of the first run, as printed:", "", "```", example, "```"] if example else []
    text = "\n".join(head + lines + tail) + "\n"
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
