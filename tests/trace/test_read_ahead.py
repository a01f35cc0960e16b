"""commprof report decodes a trace file's first chunks while its analyzers
are imported (trace.parquet.read_ahead): the reader then starts with them,
the same chunks in the same order, the file read once; an error met ahead
is raised where the reader would have met it. The report runs without the
cycle collector, with Arrow's threads on the cores its own leave, and
gives both back."""
import os
import sys

import pytest

from commprof.trace import parquet, schema
from commprof.trace.schema import TraceFormatError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tracegen import ddp_rank, write_run  # noqa: E402


def _file(tmp_path, ranks=5):
    p = str(tmp_path / "trace.parquet")
    w = parquet.TraceWriter(p)              # one row group per rank: one chunk per rank at max_rows=1
    for r in range(ranks):
        w.write(schema.rows_to_table(ddp_rank(r, ranks, 4), r))
    w.close({"world_size": ranks}, [{"rank": r} for r in range(ranks)])
    return p


@pytest.mark.parametrize("ahead", [0, 2, 9])
def test_the_reader_starts_with_the_chunks_read_ahead(tmp_path, ahead):
    p = _file(tmp_path)
    cols = ["rank", "step", "t_start"]
    plain = list(parquet.iter_file_chunks(p, cols, max_rows=1))
    assert len(plain) == 5
    key = parquet.read_ahead(p, cols, max_rows=1, chunks=ahead)
    assert key == (os.path.abspath(p), tuple(cols), 1, False) and key in parquet._AHEAD
    got = list(parquet.iter_file_chunks(p, cols, max_rows=1))
    assert key not in parquet._AHEAD
    assert len(got) == len(plain) and all(a.equals(b) for a, b in zip(got, plain))


def test_other_columns_or_sizes_read_the_file_themselves(tmp_path):
    p = _file(tmp_path, 3)
    parquet.read_ahead(p, ["rank", "step"], max_rows=1, chunks=1)
    try:
        assert len(list(parquet.iter_file_chunks(p, ["rank"], max_rows=1))) == 3
        assert len(list(parquet.iter_file_chunks(p, ["rank", "step"], max_rows=10**6))) == 1
        assert parquet._AHEAD                   # still waiting for its own reader
    finally:
        parquet._AHEAD.clear()


def test_an_error_met_ahead_is_raised_to_the_reader(tmp_path):
    bad = tmp_path / "trace.parquet"
    bad.write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(TraceFormatError) as plain:
        list(parquet.iter_file_chunks(str(bad), None, max_rows=1))
    parquet.read_ahead(str(bad), None, max_rows=1)
    with pytest.raises(TraceFormatError) as ahead:
        list(parquet.iter_file_chunks(str(bad), None, max_rows=1))
    assert str(ahead.value) == str(plain.value)


def test_commprof_report_reads_its_trace_once(tmp_path, monkeypatch):
    """The report's reader asks for what the command read ahead: the file's
    chunks are produced once (nothing read twice, nothing left waiting)."""
    from commprof.cli import main

    path = write_run(tmp_path / "trace.parquet", {r: ddp_rank(r, 4, 6) for r in range(4)})
    calls = []
    real = parquet._iter_file_chunks
    monkeypatch.setattr(parquet, "_iter_file_chunks", lambda *a: calls.append(a) or real(*a))
    started = []
    real_ahead = parquet.read_ahead
    monkeypatch.setattr(parquet, "read_ahead", lambda *a, **k: started.append(a) or real_ahead(*a, **k))
    out = tmp_path / "r.json"
    assert main(["report", path, "--format", "json", "-o", str(out)]) == 0
    assert len(started) == 1 and len(calls) == 1 and calls[0][0] == path and not parquet._AHEAD
    assert out.stat().st_size > 1000


@pytest.mark.parametrize("content", [b"", b"PAR1 not a parquet file"])
def test_a_report_that_fails_leaves_nothing_read_ahead(tmp_path, content):
    """A trace the report cannot read: the one-line error, exit 2, and the
    chunks read ahead for it forgotten (a process that goes on holds none)."""
    from commprof.cli import main

    bad = tmp_path / "trace.parquet"
    bad.write_bytes(content)
    before = set(parquet._AHEAD)
    assert main(["report", str(bad), "--format", "json", "-o", str(tmp_path / "r.json")]) == 2
    assert set(parquet._AHEAD) == before and not (tmp_path / "r.json").exists()


def _trace_or_bad_file(tmp_path, content):
    """A 4-rank trace file (``content`` None) or a file holding ``content``."""
    if content is None:
        return write_run(tmp_path / "trace.parquet", {r: ddp_rank(r, 4, 6) for r in range(4)})
    (tmp_path / "trace.parquet").write_bytes(content)
    return str(tmp_path / "trace.parquet")


def _watch(mp, probe, seen):
    """``probe()`` appended to ``seen`` where the report starts reading its
    chunks and where it builds its tables (late, on the main thread)."""
    from commprof.analyzers import report as report_module

    real, real_tables = parquet._iter_file_chunks, report_module.build_report

    def spy(*a):
        seen.append(probe())
        return real(*a)

    def tables_spy(*a, **k):
        seen.append(probe())
        return real_tables(*a, **k)

    mp.setattr(parquet, "_iter_file_chunks", spy)
    mp.setattr(report_module, "build_report", tables_spy)


@pytest.mark.parametrize("content", [None, b"PAR1 not a parquet file"])
def test_a_report_runs_without_the_cycle_collector_and_gives_it_back(tmp_path, content):
    """The report runs with Python's cycle collector off (it stops every
    thread and finds next to nothing there); a process that goes on, after a
    report or a failed one, has it as it was."""
    import gc

    from commprof.cli import main

    path = _trace_or_bad_file(tmp_path, content)
    seen: list = []
    for on in (True, False):
        (gc.enable if on else gc.disable)()
        try:
            with pytest.MonkeyPatch.context() as mp:
                _watch(mp, gc.isenabled, seen)
                rc = main(["report", path, "--format", "json", "-o", str(tmp_path / "r.json")])
            assert rc == (0 if content is None else 2)
            assert gc.isenabled() == on
        finally:
            gc.enable()
    assert len(seen) == (4 if content is None else 2) and not any(seen)


@pytest.mark.parametrize("content", [None, b"PAR1 not a parquet file"])
@pytest.mark.parametrize("cores, threads", [(2, 1), (1, 1), (6, 4)])
def test_a_report_decodes_on_the_cores_its_own_threads_leave_and_gives_arrows_back(tmp_path, monkeypatch, content,
                                                                                  cores, threads):
    """Arrow's CPU threads while the report reads and builds its tables: the
    cores this process may run on (its affinity) less the two its sweeps
    and folds keep busy, at least one; a process that goes on, after a
    report or a failed one, has Arrow's as they were."""
    import pyarrow as pa

    from commprof.cli import main

    path = _trace_or_bad_file(tmp_path, content)
    seen: list = []
    _watch(monkeypatch, pa.cpu_count, seen)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    before = pa.cpu_count()
    try:
        pa.set_cpu_count(5)
        rc = main(["report", path, "--format", "json", "-o", str(tmp_path / "r.json")])
        assert rc == (0 if content is None else 2)
        assert pa.cpu_count() == 5
    finally:
        pa.set_cpu_count(before)
    assert len(seen) == (2 if content is None else 1) and seen == [threads] * len(seen)


def test_glibcs_heap_is_kept_only_by_a_process_that_ends_with_the_report(tmp_path, monkeypatch):
    """The heap thresholds outlast the command (glibc's own cannot be had
    back): set for a report run by the ``commprof`` command, which then
    ends, not for a caller of ``main()`` that goes on."""
    import ctypes

    from commprof import cli

    path = write_run(tmp_path / "trace.parquet", {r: ddp_rank(r, 4, 6) for r in range(2)})
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    real_cdll = ctypes.CDLL

    def cdll(name, *a, **k):        # glibc's only: the compiled kernels load as they do
        return Libc() if name == "libc.so.6" else real_cdll(name, *a, **k)

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    args = ["report", path, "--format", "json", "-o", str(tmp_path / "r.json")]
    assert cli.main(args) == 0
    assert calls and all(p == -8 for p, _ in calls)         # the arenas' limit only
    calls.clear()
    monkeypatch.setattr(cli, "_ENDS_WITH_COMMAND", True)     # as entry() sets it
    assert cli.main(args) == 0
    assert {(-3, 32 << 20), (-1, 1 << 30), (-2, 64 << 20)} <= set(calls)


_LOAD_PROBE = r"""
import ctypes, glob, json, os, sys
from commprof import cli
cli._ENDS_WITH_COMMAND = True                   # as entry() sets it
rc = cli.main(["report", sys.argv[1], "--format", "json", "-o", sys.argv[2]])
import numpy, pyarrow as pa
blas = glob.glob(os.path.join(os.path.dirname(numpy.__file__) + ".libs", "libscipy_openblas64_*.so"))
threads = ctypes.CDLL(blas[0]).scipy_openblas_get_num_threads64_() if blas else None
print(json.dumps({"rc": rc, "mimalloc": pa.mimalloc_memory_pool().total_bytes_allocated(),
                  "jemalloc": pa.jemalloc_memory_pool().total_bytes_allocated(), "blas": threads,
                  "env": sorted(k for k in ("ARROW_DEFAULT_MEMORY_POOL", "OPENBLAS_NUM_THREADS") if k in os.environ)}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the settings are made on Linux only")
@pytest.mark.parametrize("user_blas", [None, "2"])
def test_a_report_process_loads_arrow_and_numpy_with_its_settings_then_forgets_them(tmp_path, user_blas):
    """In a fresh process that ends with the report: every Arrow buffer,
    the Parquet reader's included, from jemalloc (none from the default
    mimalloc), OpenBLAS on one thread unless the user chose, and the
    environment left as it was for anything launched after."""
    import json
    import subprocess

    path = write_run(tmp_path / "trace.parquet", {r: ddp_rank(r, 4, 6) for r in range(4)})
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "OPENBLAS_NUM_THREADS")}
    if user_blas:
        env["OPENBLAS_NUM_THREADS"] = user_blas
    proc = subprocess.run([sys.executable, "-c", _LOAD_PROBE, path, str(tmp_path / "r.json")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0 and (tmp_path / "r.json").stat().st_size > 1000
    assert got["mimalloc"] == 0 and got["jemalloc"] > 0
    if got["blas"] is not None:
        assert got["blas"] == (int(user_blas) if user_blas else 1)
    assert got["env"] == (["OPENBLAS_NUM_THREADS"] if user_blas else [])


def test_a_trace_file_is_found_by_its_path_alone(tmp_path):
    """The file itself, or a record folder's merged trace; a folder of
    shards or nothing at all is not a trace file (the report then reads
    nothing ahead)."""
    p = _file(tmp_path)
    assert parquet.trace_file(p) == p
    assert parquet.trace_file(str(tmp_path)) == os.path.join(str(tmp_path), parquet.TRACE_FILE)
    (tmp_path / "shards").mkdir()
    assert parquet.trace_file(str(tmp_path / "shards")) is None
    assert parquet.trace_file(str(tmp_path / "missing")) is None


_AHEAD_PROBE = r"""
import sys
from commprof import cli
key = cli._read_ahead([sys.argv[1]])
print(key is not None, "pandas" in sys.modules, "commprof.assemble" in sys.modules, "commprof.analyzers" in sys.modules)
"""


def test_the_decoding_starts_before_the_analyzers_are_imported(tmp_path):
    """What the report reads ahead, it starts decoding with Arrow loaded and
    nothing of the analyzers or pandas yet (their import is what it runs
    beside), for a record folder as for its file."""
    import subprocess

    p = _file(tmp_path)
    for where in (p, str(tmp_path)):
        proc = subprocess.run([sys.executable, "-c", _AHEAD_PROBE, where], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["True", "False", "False", "False"]
