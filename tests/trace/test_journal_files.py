"""The trace package on its own: Event rows, the journal (torn tails,
salvage, finishing as a shard), atomic writes, Parquet writing and reading,
cell values."""
import math
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from commprof.trace import journal, metadata, parquet, schema, values
from commprof.trace.files import atomic_open, atomic_write
from commprof.trace.schema import Event, TraceFormatError


def _rows(n, step=0):
    return [Event(step, "compute", "forward", "nn.Module", "M", 10 * i, 10 * i + 5, items=8) for i in range(n)]


def test_event_defaults_and_order():
    e = Event(3, "comm", "all_reduce", "ddp_reducer", "default", 1, 2, bytes=64, seq=7)
    assert tuple(e)[:7] == (3, "comm", "all_reduce", "ddp_reducer", "default", 1, 2)
    assert e.bytes == 64 and e.seq == 7 and e.value is None and e.dev_start is None
    assert list(e._fields) == schema.EVENT_COLUMNS
    assert [f.name for f in schema.TRACE_SCHEMA] == ["rank"] + schema.EVENT_COLUMNS


def _all_columns():
    """Rows that use every column, nulls and non-ASCII strings included."""
    return [
        Event(0, "comm", "all_reduce", "ddp_reducer", "default", 1, 2, bytes=4 << 20, dtype="torch.float32",
              group="0", group_size=8, seq=3, blocking=False),
        Event(0, "compute", "forward", "nn.Module", "Résumé(Net)", 5, 9, dev_start=6, dev_end=10, items=32),
        Event(0, "metric", "loss", "user", None, 11, 11, value=0.25),
        Event(1, "step", "step", "torch.optim", None, 0, 20, items=32),
        Event(1, "wait", "comm_wait", "autograd", "backward", 12, 13, blocking=True),
    ]


def test_journal_round_trip_every_column(tmp_path):
    w = journal.JournalWriter(str(tmp_path), "h", 5)
    rows = _all_columns()
    w.append(rows[:2])
    w.append(rows[2:])
    w.close()
    table = journal.journal_table(w.path, 7)
    assert table.schema.equals(schema.TRACE_SCHEMA)
    got = [tuple(r.values())[1:] for r in table.to_pylist()]
    assert got == [tuple(r) for r in rows]
    assert set(table.column("rank").to_pylist()) == {7}


def test_journal_torn_tail_is_dropped_and_salvaged(tmp_path):
    w = journal.JournalWriter(str(tmp_path), "h", 42)
    w.append(_rows(5))
    w.append(_rows(7, step=1))
    w.write_meta({"rank": 3, "world_size": 4, "host": "h", "pid": 42, "status": "journal"})
    size = os.path.getsize(w.path)
    w.append(_rows(9, step=2))
    full = os.path.getsize(w.path)
    w.close()
    # cut the third block in half: a writer killed mid-write
    with open(w.path, "r+b") as fh:
        fh.truncate(size + (full - size) // 2)
    strings, blocks = journal.read_journal(w.path)
    assert [len(b) // journal.ROW.size for b in blocks] == [5, 7]
    shards, journals = journal.find_shards(str(tmp_path))
    assert shards == [] and journals == [w.path]
    table, meta = journal.load_journal(w.path)
    assert table.num_rows == 12 and meta["status"] == "salvaged" and meta["events"] == 12
    assert set(table.column("rank").to_pylist()) == {3}


def test_a_corrupted_block_stops_reading_there(tmp_path):
    w = journal.JournalWriter(str(tmp_path), "h", 43)
    w.append(_rows(3))
    size = os.path.getsize(w.path)
    w.append(_rows(4))
    w.append(_rows(2))
    w.close()
    with open(w.path, "r+b") as fh:  # flip a byte inside the second event block
        fh.seek(size + 20)
        b = fh.read(1)
        fh.seek(size + 20)
        fh.write(bytes([b[0] ^ 0xFF]))
    assert [len(b) // journal.ROW.size for b in journal.read_journal(w.path)[1]] == [3]


def test_journal_with_nothing_complete(tmp_path):
    path = tmp_path / "h.1.cpj"
    path.write_bytes(b"CPJ1B\x45\xff")
    assert journal.read_journal(str(path)) == ([], [])
    assert journal.load_journal(str(path))[0] is None
    (tmp_path / "h.2.cpj").write_bytes(b"")
    assert journal.load_journal(str(tmp_path / "h.2.cpj"))[0] is None


def test_a_closed_journal_is_complete_and_converts_to_a_shard(tmp_path):
    w = journal.JournalWriter(str(tmp_path), "h", 7)
    w.append(_rows(4))
    w.write_meta({"rank": 1, "host": "h", "pid": 7, "status": "complete"})
    w.close()
    table, meta = journal.load_journal(w.path)
    assert meta["status"] == "complete" and table.num_rows == 4
    out = journal.journal_to_shard(w.path)
    assert os.path.basename(out) == journal.shard_name(1, "h", 7) == "rank00001.h.7.parquet"
    assert not os.path.exists(w.path) and not os.path.exists(w.meta_path)
    table, run, ranks = parquet.read_file(out)
    assert table.num_rows == 4 and ranks[0]["events"] == 4
    shards, journals = journal.find_shards(str(tmp_path))
    assert shards == [out] and journals == []


def test_a_journal_beside_its_parquet_shard_is_left_out(tmp_path):
    w = journal.JournalWriter(str(tmp_path), "h", 9)
    w.append(_rows(2))
    w.close()
    parquet.write_trace(schema.rows_to_table(_rows(2), 0), str(tmp_path / journal.shard_name(0, "h", 9)), {}, [{}])
    assert journal.find_shards(str(tmp_path))[1] == []


def test_the_journal_writer_is_pure_python():
    import subprocess
    import sys

    code = ("import sys, tempfile\n"
            "from commprof.trace import journal\n"
            "from commprof.trace.schema import Event\n"
            "w = journal.JournalWriter(tempfile.mkdtemp(), 'h', 1)\n"
            "w.append([Event(0, 'step', 'step', 'x', None, 1, 2)]); w.close()\n"
            "print([m for m in ('pyarrow', 'numpy', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_atomic_write_keeps_the_old_file_on_error(tmp_path):
    p = str(tmp_path / "f.json")
    atomic_write(p, "old")
    with pytest.raises(RuntimeError):
        with atomic_open(p) as fh:
            fh.write("half")
            raise RuntimeError("disk full")
    assert open(p).read() == "old"
    assert os.listdir(tmp_path) == ["f.json"]
    atomic_write(str(tmp_path / "g.json.gz"), "zipped")
    import gzip
    assert gzip.open(tmp_path / "g.json.gz", "rt").read() == "zipped"


def test_trace_writer_is_atomic(tmp_path):
    p = str(tmp_path / "trace.parquet")
    w = parquet.TraceWriter(p)
    w.write(schema.rows_to_table(_rows(3), 0))
    assert not os.path.exists(p)
    w.abort()
    assert os.listdir(tmp_path) == []
    w = parquet.TraceWriter(p)
    assert w.empty
    w.write(schema.rows_to_table(_rows(3), 0))
    w.write(schema.rows_to_table(_rows(2), 1))
    w.close({"world_size": 2}, [{"rank": 0}, {"rank": 1}])
    table, run, ranks = parquet.read_file(p)
    assert table.num_rows == 5 and run["world_size"] == 2 and len(ranks) == 2
    chunks = list(parquet.iter_file_chunks(p, ["rank", "t_start"], max_rows=1))
    assert [c.column_names for c in chunks] == [["rank", "t_start"]] * len(chunks)
    assert sum(c.num_rows for c in chunks) == 5


def test_conform_fills_optional_columns_and_checks_versions():
    t = pa.table({"rank": pa.array([0], pa.int32()), "step": pa.array([0], pa.int32()),
                  "category": ["step"], "name": ["step"], "t_start": [1], "t_end": [2]})
    out = parquet.conform(t, schema.SCHEMA_VERSION)
    assert out.schema.equals(schema.TRACE_SCHEMA) and out.column("bytes").null_count == 1
    with pytest.raises(TraceFormatError, match=f"newer than this commprof reads \\({schema.SCHEMA_VERSION}\\)"):
        parquet.conform(t, schema.SCHEMA_VERSION + 1)
    with pytest.raises(TraceFormatError, match="missing required column"):
        parquet.conform(t.drop_columns(["t_end"]), schema.SCHEMA_VERSION)


def test_too_old_names_the_oldest_readable(monkeypatch):
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 6)
    monkeypatch.setattr(schema, "MIN_READ_VERSION", 5)
    with pytest.raises(TraceFormatError, match=r"version 4 is older than the oldest readable \(5\)"):
        schema.check_version(4)
    schema.check_version(5)


def test_metadata_round_trip_and_batch_size():
    meta = metadata.encode_meta({"a": 1}, [{"rank": 0}])
    assert metadata.decode_meta(meta) == (schema.SCHEMA_VERSION, {"a": 1}, [{"rank": 0}])
    with pytest.raises(TraceFormatError):
        metadata.decode_meta({})
    assert metadata.batch_size([32, 32, None, float("nan"), 0, 16, 32]) == 32
    assert metadata.batch_size([None, 0]) is None
    run = metadata.run_metadata([{"rank": 0, "world_size": 2, "host": "a", "framework": "ddp"},
                                 {"rank": 1, "world_size": 2, "host": "b", "status": "salvaged"}])
    assert run["hosts"] == ["a", "b"] and run["salvaged_ranks"] == [1] and run["framework"] == "ddp"


@pytest.mark.parametrize("v, is_missing, as_plain", [
    (None, True, None), (float("nan"), True, None), (np.float32("nan"), True, None), (pd.NA, True, None),
    (pd.NaT, True, None), (np.int64(3), False, 3), (np.float64(2.5), False, 2.5), (np.bool_(True), False, True),
    ("x", False, "x"), (7, False, 7), (math.inf, False, math.inf),
])
def test_values(v, is_missing, as_plain):
    assert values.missing(v) is is_missing
    out = values.plain(v)
    assert out == as_plain and type(out) is type(as_plain)


def test_plain_infinity_as_none():
    assert values.plain(float("inf"), inf_as_none=True) is None
    assert values.plain(np.float64("-inf"), inf_as_none=True) is None


def test_atomic_writes_leave_devices_fifos_and_links_in_place(tmp_path):
    """`commprof report -o /dev/null` (as benchmarks/report_speed.py runs it,
    as root) must not rename a regular file over the device: a target that
    is not a regular file is written in place, a link keeps pointing where
    it did and its target gets the text."""
    import stat
    import threading

    from commprof.trace.files import atomic_write

    try:
        atomic_write(os.devnull, "x" * 1000)
        assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    finally:        # a regression must not leave the machine without /dev/null
        if not stat.S_ISCHR(os.stat(os.devnull).st_mode):
            os.remove(os.devnull)
            os.mknod(os.devnull, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            os.chmod(os.devnull, 0o666)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    atomic_write(str(fifo), "through the pipe")
    reader.join(10)
    assert got == ["through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    atomic_write(str(link), "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.json", "target.json"]
