"""The report's reader leaves unread the optional columns a chunk holds no
value in, by the row groups' statistics (trace.parquet.iter_file_chunks
``skip_empty``): they come as Arrow null-type columns, every value the same
(null), every other column as read in full; a file without statistics is
read in full; the analysis gives the same tables either way, chunks with
device times beside chunks without."""
import os
import sys

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from commprof.trace import parquet, schema

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tracegen import MS, ddp_rank  # noqa: E402

RANKS = 4
DEVICE_RANKS = (2, 3)     # their collectives carry device times; the others' none


def _rank_table(r):
    t = schema.rows_to_table(ddp_rank(r, RANKS, 6, arrive_ms=0.5 * r), r).cast(schema.TRACE_SCHEMA)
    if r in DEVICE_RANKS:
        is_comm = [c == "comm" for c in t.column("category").to_pylist()]
        ts, te = t.column("t_start").to_pylist(), t.column("t_end").to_pylist()
        dev_s = pa.array([s + MS // 10 if c else None for s, c in zip(ts, is_comm)], pa.int64())
        dev_e = pa.array([e - MS // 10 if c else None for e, c in zip(te, is_comm)], pa.int64())
        t = t.set_column(t.schema.get_field_index("dev_start"), "dev_start", dev_s)
        t = t.set_column(t.schema.get_field_index("dev_end"), "dev_end", dev_e)
    return t


def _file(tmp_path, statistics=True):
    """Two hosts of two ranks, one row group per rank (one chunk per rank at
    max_rows=1)."""
    p = str(tmp_path / "trace.parquet")
    w = parquet.TraceWriter(p)
    for r in range(RANKS):
        w.write(_rank_table(r))
    metas = [{"rank": r, "world_size": RANKS, "host": "ab"[r // 2],
              "clock": {"boot_id": "ab"[r // 2], "mono_ns_at_start": 0, "wall_ns_at_start": 0}}
             for r in range(RANKS)]
    w.close({"world_size": RANKS, "framework": "ddp"}, metas)
    if not statistics:
        kv = pq.ParquetFile(p).metadata.metadata        # commprof's footer, kept
        table = pq.read_table(p).replace_schema_metadata(kv)
        pq.write_table(table, p, write_statistics=False, row_group_size=len(table) // RANKS)
    return p


def _chunks(p, skip):
    return list(parquet.iter_file_chunks(p, schema.TRACE_SCHEMA.names, max_rows=1, skip_empty=skip))


def test_empty_columns_come_as_nulls_and_the_rest_as_read(tmp_path):
    p = _file(tmp_path)
    full, lean = _chunks(p, False), _chunks(p, True)
    assert len(full) == len(lean) == RANKS
    for r, (a, b) in enumerate(zip(full, lean)):
        assert a.schema.equals(schema.TRACE_SCHEMA) and a.column_names == b.column_names
        assert a.num_rows == b.num_rows
        skipped = {f.name for f in b.schema if pa.types.is_null(f.type)}
        expected = {"value"} | ({"dev_start", "dev_end"} if r not in DEVICE_RANKS else set())
        assert skipped == expected
        for name in a.column_names:
            assert a.column(name).to_pylist() == b.column(name).to_pylist(), (r, name)
            if name not in skipped:
                assert b.column(name).type == a.column(name).type


def test_a_file_without_statistics_is_read_in_full(tmp_path):
    p = _file(tmp_path, statistics=False)
    assert pq.ParquetFile(p).metadata.row_group(0).column(0).statistics is None
    for a, b in zip(_chunks(p, False), _chunks(p, True)):
        assert b.schema.equals(a.schema) and b.equals(a)


def test_the_analysis_is_the_same_with_columns_left_unread(tmp_path, monkeypatch):
    from commprof import api

    p = _file(tmp_path)

    def tables(ra):
        c = ra.colls
        return {"steps": ra.steps, "calls": c.table(len(ra.steps), RANKS), "instances": c.instances(),
                "lateness": c.rank_lateness(), "clocks": ra.clocks, "nodes": ra.nodes, "scope": ra.scope,
                "links": ra.links, "fine_phases": ra.fine_phases, "fine_grads": ra.fine_grads,
                "timeline": ra.timeline}

    lean = tables(api.load(p).analysis(chunk_rows=1))
    monkeypatch.setattr(parquet, "_empty_columns", lambda *a: [])
    full = tables(api.load(p).analysis(chunk_rows=1))
    assert lean["steps"].shape[0] == RANKS * 5 and len(lean["instances"]) > 0 and len(lean["clocks"]) == 2
    # the device ranks' collectives were read on the device: a shorter latency
    assert lean["calls"]["calls"].sum() > 0
    for name in full:
        pd.testing.assert_frame_equal(lean[name], full[name], check_exact=True, obj=name)
