"""A guard on the report's speed (not a benchmark: benchmarks/report_speed.py
is): ``commprof report`` of a ~2 M-event synthetic trace of 32 ranks on 8
hosts, as a ratio to a bare scan of the same file's columns, both fresh
processes in this test (a ratio: robust to the machine's speed). The bound
catches a return of per-row Python work (that made the ratio x30); what it
is today is in the docs' benchmark page."""
import os
import subprocess
import sys
import time


from helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

BOUND = 6.0


def _wall(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=600)
    return time.perf_counter() - t0


def test_report_of_a_multi_host_trace_stays_near_the_scan(tmp_path):
    from synth import write

    from commprof.analyzers.report import REPORT_COLUMNS
    from commprof.assemble import merge

    shards, n = write(str(tmp_path), 32, 5700)
    path = str(tmp_path / "trace.parquet")
    merge(shards, path, {"run_id": "guard"})
    assert n > 1_900_000
    scan = [sys.executable, "-c", "import sys, pyarrow.parquet as pq; "
            f"pq.read_table(sys.argv[1], columns={REPORT_COLUMNS!r})", path]
    report = [sys.executable, "-m", "commprof", "report", path, "--format", "json", "-o", os.devnull]
    scans, reports = [], []
    for _ in range(2):                      # interleaved: both see the same machine
        scans.append(_wall(scan))
        reports.append(_wall(report))
    ratio = min(reports) / min(scans)
    print(f"report {min(reports):.2f} s, scan {min(scans):.2f} s: x{ratio:.1f}")
    assert ratio <= BOUND, (reports, scans)


def test_the_analysis_runs_blas_in_its_own_threads_only():
    """OpenBLAS's threads spin after each product and took a core from the
    analysis's own (benchmarks/results/report_speed/): inside the analysis
    BLAS runs in the caller, and is given back its threads after."""
    from threadpoolctl import threadpool_info

    from commprof.analyzers.run import analyze_chunks

    def blas_threads():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    before, seen = blas_threads(), []

    def chunks():
        seen.append(blas_threads())
        yield from ()

    analysis = analyze_chunks(chunks(), {"world_size": 1}, [{"rank": 0}])
    assert analysis.steps.empty
    assert seen == [{1}]
    assert blas_threads() == before
