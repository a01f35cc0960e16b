"""The collectives of each chunk are folded in a thread of their own
(analyzers/run.py ``_Lane``) beside the sweeps: in the chunks' order, one
at a time, an error raised where the reader is, and the same tables as
folding them in the reader's thread. The report's end shares its work
with the side thread (``_Beside``): what that thread has not started is
done by the thread that wants it, once. Between its stages the free C
heap is given back to the system only past a threshold."""
import ctypes
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.analyzers import run
from commprof.trace import parquet, schema

from tracegen import ddp_rank


def test_a_lane_runs_in_order_on_a_thread_of_its_own():
    seen = []
    with run._Lane() as lane:
        for k in range(20):
            lane(lambda k=k: seen.append((k, threading.current_thread() is threading.main_thread())))
    assert [k for k, _ in seen] == list(range(20)) and not any(main for _, main in seen)


def test_an_error_in_the_lane_is_raised_to_the_reader():
    def bad():
        raise ValueError("fold failed")

    with pytest.raises(ValueError, match="fold failed"):
        with run._Lane() as lane:
            lane(bad)
    lane = run._Lane()
    lane(bad)
    with pytest.raises(ValueError, match="fold failed"):
        lane(lambda: None)          # the next chunk's fold waits for this one, and meets its error
    lane.pool.shutdown()


def _where(tag, calls):
    calls.append((tag, threading.current_thread() is threading.main_thread()))
    return tag


def test_work_the_side_thread_has_not_started_is_done_by_the_asker():
    release, started, calls = threading.Event(), threading.Event(), []

    def busy():
        started.set()
        release.wait(60)
        return _where("busy", calls)

    with ThreadPoolExecutor(max_workers=1) as pool:
        first = run._Beside(pool, busy)
        queued = [run._Beside(pool, _where, tag, calls) for tag in ("a", "b")]
        assert started.wait(60)
        assert run._results(None, *queued) == [None, "a", "b"]      # here, while the side thread is busy
        release.set()
        assert first.result() == "busy"
    assert calls == [("a", True), ("b", True), ("busy", False)]


def test_work_the_side_thread_took_is_waited_for_not_done_again():
    calls = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        w = run._Beside(pool, _where, "x", calls)
        w.future.result()       # the side thread has done it
        assert w.result() == "x" and w.result() == "x"
    assert calls == [("x", False)]


def test_an_error_in_work_done_by_the_asker_is_raised_to_it():
    release, calls = threading.Event(), []

    def bad():
        _where("bad", calls)
        raise ValueError("table failed")

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(release.wait, 60)
        w = run._Beside(pool, bad)
        with pytest.raises(ValueError, match="table failed"):
            run._results(w)
        with pytest.raises(ValueError, match="table failed"):
            w.result()          # kept, not run again
        release.set()
    assert calls == [("bad", True)]


def test_folding_in_the_lane_gives_the_same_tables(tmp_path, monkeypatch):
    from commprof import api

    p = str(tmp_path / "trace.parquet")
    w = parquet.TraceWriter(p)              # one row group per rank: one chunk per rank at chunk_rows=1
    for r in range(6):
        w.write(schema.rows_to_table(ddp_rank(r, 6, 8, arrive_ms=0.3 * r), r))
    metas = [{"rank": r, "world_size": 6, "host": "abc"[r // 2],
              "clock": {"boot_id": "abc"[r // 2], "mono_ns_at_start": 0, "wall_ns_at_start": 0}} for r in range(6)]
    w.close({"world_size": 6, "framework": "ddp"}, metas)

    def tables(ra):
        c = ra.colls
        return [ra.steps, c.table(len(ra.steps), 6), c.instances(), c.rank_lateness(), ra.clocks, ra.nodes,
                ra.scope, ra.links]

    lane = tables(api.load(p).analysis(chunk_rows=1))
    real = run._Accumulators.add
    monkeypatch.setattr(run._Accumulators, "add", lambda self, chunk, rows, lane=None: real(self, chunk, rows))
    here = tables(api.load(p).analysis(chunk_rows=1))
    assert len(lane[2]) == 7 * 2 and len(lane[4]) == 3          # step 0 is the warm-up
    for a, b in zip(lane, here):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["all_reduce", "broadcast", None]), st.sampled_from(["0", "1", None]),
                          st.one_of(st.none(), st.integers(0, 1 << 40))), min_size=1, max_size=30))
def test_exact_counts_read_from_the_calls_times_are_the_same(rows):
    """The exact calls and bytes per (op, group) taken with the op codes and
    sizes the sweep already read (call_times) and from the columns again:
    the same sums, bit for bit (one (op, group) or several, unknown sizes)."""
    import pyarrow as pa

    from commprof.analyzers.collectives import call_times

    comm = pa.table({"name": pa.array([r[0] for r in rows]).dictionary_encode(),
                     "group": pa.array([r[1] for r in rows]).dictionary_encode(),
                     "source": pa.array(["gloo"] * len(rows)).dictionary_encode(),
                     "bytes": pa.array([r[2] for r in rows], pa.int64()),
                     "t_start": pa.array(range(len(rows)), pa.int64()),
                     "t_end": pa.array(range(1, len(rows) + 1), pa.int64())})
    a, b = run.CallCounts(), run.CallCounts()
    a.add(comm)
    b.add(comm, call_times(comm))
    assert a.sums.keys() == b.sums.keys()
    for k in a.sums:
        assert [repr(x) for x in a.sums[k]] == [repr(x) for x in b.sums[k]]


def _resident() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_the_free_heap_is_given_back_only_past_the_threshold(monkeypatch):
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("a glibc without mallinfo2 gives the heap back every time")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 10     # under glibc's mmap threshold: from the heap
    blocks = [libc.malloc(size) for _ in range(2048)]          # 128 MiB, touched
    for b in blocks:
        ctypes.memset(b, 1, size)
    last = libc.malloc(size)        # above them: freed, they are not the heap's top, which glibc trims itself
    for b in blocks:
        libc.free(b)
    try:
        before = _resident()
        monkeypatch.setattr(run, "RETURN_HEAP_FROM", 1 << 40)
        run._return_free_heap()
        assert _resident() > before - (16 << 20)                # kept
        monkeypatch.setattr(run, "RETURN_HEAP_FROM", 64 << 20)
        run._return_free_heap()
        assert _resident() < before - (96 << 20)                # given back
    finally:
        libc.free(last)
