"""Bad input to `commprof report`: one line on stderr, exit code 2."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from commprof.trace import metadata, schema
from commprof.trace.schema import Event
from commprof.cli import main
from commprof.trace.parquet import write_trace


def _events(n_steps=3, rank=0):
    rows = []
    t = 1_000
    for s in range(n_steps):
        rows.append(Event(s, "data", "dataloader", "DataLoader", None, t, t + 100, items=8))
        rows.append(Event(s, "compute", "forward", "nn.Module", "M", t + 100, t + 400, items=8))
        rows.append(Event(s, "step", "step", "torch.optim", None, t, t + 1000, items=8))
        t += 1000
    return schema.add_rank(schema.rows_to_batch(rows), rank)


def good_trace(path, n_steps=3):
    table = pa.Table.from_batches([_events(n_steps)])
    write_trace(table, str(path), {"world_size": 1}, [{"rank": 0, "world_size": 1}])
    return str(path)


def _one_line_error(capsys, argv, needle):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("commprof: error: ")
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


def test_good_trace_reports(tmp_path, capsys):
    path = good_trace(tmp_path / "t.parquet")
    assert main(["report", path, "--warmup", "0", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = doc["tables"]["breakdown"][0]
    assert row["data_pct"] == pytest.approx(10.0)
    assert row["compute_pct"] == pytest.approx(30.0)
    assert row["other_pct"] == pytest.approx(60.0)


def test_missing_file(tmp_path, capsys):
    _one_line_error(capsys, ["report", str(tmp_path / "nope.parquet")], "no such file")


def test_empty_file(tmp_path, capsys):
    p = tmp_path / "empty.parquet"
    p.write_bytes(b"")
    _one_line_error(capsys, ["report", str(p)], "empty file")


def test_truncated_parquet(tmp_path, capsys):
    path = good_trace(tmp_path / "t.parquet")
    data = open(path, "rb").read()
    p = tmp_path / "trunc.parquet"
    p.write_bytes(data[: len(data) // 2])
    _one_line_error(capsys, ["report", str(p)], "not a readable Parquet file")


def test_not_parquet(tmp_path, capsys):
    p = tmp_path / "notes.parquet"
    p.write_text("hello, this is text\n" * 10)
    _one_line_error(capsys, ["report", str(p)], "not a readable Parquet file")


def test_parquet_without_commprof_metadata(tmp_path, capsys):
    p = tmp_path / "other.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), p)
    _one_line_error(capsys, ["report", str(p)], "not a commprof trace")


def test_wrong_schema_version(tmp_path, capsys):
    path = good_trace(tmp_path / "t.parquet")
    t = pq.read_table(path)
    meta = dict(t.schema.metadata)
    meta[metadata.META_VERSION] = str(schema.SCHEMA_VERSION + 1).encode()
    p = tmp_path / "future.parquet"
    pq.write_table(t.replace_schema_metadata(meta), p)
    _one_line_error(capsys, ["report", str(p)], "newer than this commprof reads")


@pytest.mark.parametrize("command", ["report", "export"])
def test_too_old_schema_version_names_the_oldest_readable(tmp_path, capsys, monkeypatch, command):
    path = good_trace(tmp_path / "t.parquet")
    monkeypatch.setattr(schema, "MIN_READ_VERSION", schema.SCHEMA_VERSION + 1)
    args = [command, path] if command == "report" else ["export", "chrome", path, "-o", str(tmp_path / "x.json")]
    err = _one_line_error(capsys, args, "older than the oldest readable")
    assert f"({schema.SCHEMA_VERSION + 1})" in err


def test_missing_columns(tmp_path, capsys):
    path = good_trace(tmp_path / "t.parquet")
    t = pq.read_table(path)
    meta = t.schema.metadata
    p = tmp_path / "cols.parquet"
    pq.write_table(t.drop_columns(["t_end"]).replace_schema_metadata(meta), p)
    _one_line_error(capsys, ["report", str(p)], "missing required column(s): t_end")


def test_zero_steps(tmp_path, capsys):
    rows = [Event(0, "compute", "forward", "nn.Module", "M", 1, 5, items=8)]
    table = pa.Table.from_batches([schema.add_rank(schema.rows_to_batch(rows), 0)])
    p = tmp_path / "nosteps.parquet"
    write_trace(table, str(p), {}, [{"rank": 0}])
    _one_line_error(capsys, ["report", str(p)], "no complete training step")


def test_folder_without_trace(tmp_path, capsys):
    _one_line_error(capsys, ["report", str(tmp_path)], "no commprof trace here")


def test_bad_option(tmp_path, capsys):
    path = good_trace(tmp_path / "t.parquet")
    _one_line_error(capsys, ["report", path, "--format", "xml"], "invalid choice")


def test_one_bad_among_several_names_it(tmp_path, capsys):
    good = good_trace(tmp_path / "t.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_text("x")
    _one_line_error(capsys, ["report", good, str(bad)], "bad.parquet")


def test_csv_is_one_table_that_pandas_reads(tmp_path, capsys):
    import io

    import pandas as pd

    path = good_trace(tmp_path / "t.parquet", n_steps=4)
    assert main(["report", path, "--format", "csv"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(df.columns[:2]) == ["config", "gpus"] and len(df) == 1 and "comm_pct" in df.columns
    assert main(["report", path, "--format", "csv", "--table", "collectives"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert "busbw_GBps" in df.columns      # (this synthetic trace has no collectives)
    assert main(["report", path, "--table", "collectives"]) == 0
    out = capsys.readouterr().out
    assert "Collectives by message size" in out and "Breakdown per GPU count" not in out
    _one_line_error(capsys, ["report", path, "--format", "csv", "--table", "nope"], "no table 'nope'")


def test_output_formats_and_files(tmp_path, capsys):
    path = good_trace(tmp_path / "t.parquet", n_steps=4)
    for fmt, needle in (("table", "Breakdown per GPU count"), ("md", "| configuration |"),
                        ("csv", "config,gpus,"), ("json", '"tables"'), ("html", "<table>")):
        assert main(["report", path, "--format", fmt]) == 0
        assert needle in capsys.readouterr().out
    out = tmp_path / "rep.md"
    assert main(["report", path, "-o", str(out)]) == 0
    assert out.read_text().startswith("# commprof report")
    d = tmp_path / "files"
    assert main(["report", path, "--out-dir", str(d)]) == 0
    assert sorted(os.listdir(d)) == ["bottlenecks.csv", "breakdown.csv", "collectives.csv", "report.html",
                                     "report.json", "report.md", "report.txt", "skew.csv", "stragglers.csv",
                                     "study.csv"]


def test_absurd_timestamps_name_the_rank_and_the_event(tmp_path, capsys):

    table = pa.Table.from_batches([_events(4)])
    t_end = table.column("t_end").to_numpy().copy()
    t_end[3] = (1 << 62) + 12345                  # one event 146 years after the others
    table = table.set_column(table.schema.get_field_index("t_end"), "t_end", pa.array(t_end))
    path = tmp_path / "bad_time.parquet"
    write_trace(table, str(path), {"world_size": 1}, [{"rank": 0, "world_size": 1}])
    line = _one_line_error(capsys, ["report", str(path)], "rank 0: its events span")
    assert "event 3 (" in line and f"t_end {(1 << 62) + 12345}" in line and "nanoseconds on one clock" in line


def test_the_command_ends_with_all_its_output_written(tmp_path, capsys):
    """`commprof report` ends its process without the interpreter's teardown
    (cli.entry): what it prints and writes is all there, the exit code
    kept; bad input still exits 2 with its one line."""
    import subprocess
    import sys

    path = good_trace(tmp_path / "t.parquet", n_steps=6)
    assert main(["report", path, "--format", "csv", "--table", "breakdown"]) == 0
    expected = capsys.readouterr().out
    cmd = [sys.executable, "-m", "commprof", "report", path]
    run = subprocess.run(cmd + ["--format", "csv", "--table", "breakdown"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == expected and len(expected) > 100, run.stderr
    out = tmp_path / "r.json"
    run = subprocess.run(cmd + ["--format", "json", "-o", str(out)], capture_output=True, text=True)
    assert run.returncode == 0 and json.loads(out.read_text())
    run = subprocess.run([sys.executable, "-m", "commprof", "report", str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("commprof: error: ")
