"""The report as a person reads it: tables that fit the terminal (rich on a
real pseudo-terminal, plain text in pipes), the study table with one header
per configuration, column choice, and progress on stderr only where someone
watches."""
import os
import re
import sys

import pytest

from helpers import ROOT, commprof_cmd, run, run_in_pty, venv_env

sys.path.insert(0, os.path.join(ROOT, "tests"))
import tracegen  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Two configurations x three GPU counts (1 plain + 2, 4 DDP)."""
    d = tmp_path_factory.mktemp("study")
    paths = []
    for loader, data_ms in (("native", 4), ("dali", 1)):
        for n in (1, 2, 4):
            rows = {r: tracegen.ddp_rank(r, n, 8, data_ms=data_ms, buckets=0 if n == 1 else 2, bucket_ms=2 * n,
                                         arrive_ms=0.4 * r) for r in range(n)}
            paths.append(tracegen.write_run(str(d / f"{loader}{n}.parquet"), rows,
                                            meta={"loader": loader, "framework": "none" if n == 1 else "ddp"}))
    return paths


def _visible(text):
    """What the terminal shows: escapes dropped, a carriage return
    overwriting the line (the progress bar redraws that way)."""
    return "\n".join(line.rstrip("\r").split("\r")[-1] for line in ANSI.sub("", text).split("\n"))


def _section(text, title):
    start = text.index(title)
    end = text.find("\n\n", start)
    return text[start:end if end > 0 else None]


def test_a_100_column_terminal_gets_tables_that_fit(study):
    rc, out = run_in_pty(commprof_cmd("report", *study), columns=100)
    assert rc == 0, out[-2000:]
    assert "\x1b[" in out  # rich: colours on a terminal
    text = _visible(out)
    lines = text.split("\n")
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    first = _section(text, "Breakdown per GPU count")
    for header in ("configuration", "GPUs", "comm %", "data %", "compute %", "step ms p50"):
        assert header in first
    assert "Breakdown per GPU count (exposed shares of step time) (continued)" in text
    assert "see them with --wide or --columns" in text
    # the study table names each configuration once, its shares under it
    side = _section(text, "Side by side")
    assert side.count("ddp / native / M / bs=32") == 1 and side.count("ddp / dali / M / bs=32") == 1
    assert side.count("comm %") == 2
    # the findings are highlighted (bold yellow) and wrapped inside the width
    assert "\x1b[1;33m" in out and "compute-bound" in text


def test_pipes_get_plain_unsplit_text_and_width_fits_on_request(study):
    proc = run(commprof_cmd("report", *study))
    assert proc.returncode == 0 and "\x1b[" not in proc.stdout
    header = next(line for line in proc.stdout.split("\n") if line.startswith("configuration") and "steps" in line)
    assert "comm %" in header and "imbal %" in header and "(continued)" not in proc.stdout
    proc = run(commprof_cmd("report", *study, "--width", "80"))
    assert proc.returncode == 0
    assert max(len(line) for line in proc.stdout.split("\n")) <= 80
    assert "(continued)" in proc.stdout


def test_wide_and_plain_on_a_terminal(study):
    rc, out = run_in_pty(commprof_cmd("report", *study, "--wide", "--plain"), columns=100)
    assert rc == 0 and "\x1b[" not in out.split("commprof report", 1)[1]
    assert max(len(line) for line in _visible(out).split("\n")) > 200  # nothing split
    assert "(continued)" not in out


def test_columns_choose_what_shows(study):
    proc = run(commprof_cmd("report", *study, "--table", "breakdown", "--columns", "comm %,efficiency_pct"))
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.split("\n") if line.startswith("configuration"))
    assert header.split() == ["configuration", "GPUs", "comm", "%", "eff", "%"]
    proc = run(commprof_cmd("report", *study, "--format", "csv", "--columns", "samples/s"))
    assert proc.stdout.split("\n")[0] == "config,gpus,samples_per_s"
    proc = run(commprof_cmd("report", *study, "--columns", "bogus"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no column 'bogus'" in proc.stderr and "comm %" in proc.stderr


def test_progress_only_where_someone_watches(study, tmp_path):
    # a terminal: a rich progress bar on stderr while the runs are read
    rc, out = run_in_pty(commprof_cmd("report", *study[3:], "--table", "study"), columns=100)
    assert rc == 0 and "reading dali4.parquet" in ANSI.sub("", out)
    # a pipe: nothing on stderr
    proc = run(commprof_cmd("report", *study))
    assert proc.returncode == 0 and proc.stderr == ""
    # forced in a pipe: plain lines, the last one complete
    env = venv_env({"COMMPROF_PROGRESS": "1"})
    proc = run(commprof_cmd("report", study[2]), env=env)
    assert "commprof: reading native4.parquet 4/4 ranks" in proc.stderr
    proc = run(commprof_cmd("export", "chrome", study[2], "-o", str(tmp_path / "t.json")), env=env)
    assert proc.returncode == 0 and "commprof: exporting 4/4 ranks" in proc.stderr
    kineto = os.path.join(ROOT, "tests", "data", "kineto")
    proc = run(commprof_cmd("import", "kineto", kineto, "-o", str(tmp_path / "k.parquet")), env=env)
    assert proc.returncode == 0 and "commprof: importing 2/2 files" in proc.stderr, proc.stderr
    # off wins even on a terminal
    rc, out = run_in_pty(commprof_cmd("report", study[2], "--table", "study"), columns=100,
                         env=venv_env({"COMMPROF_PROGRESS": "0"}))
    assert rc == 0 and "reading" not in out


def test_merge_shows_progress(record):
    env = venv_env({"COMMPROF_PROGRESS": "1"})
    tiny = os.path.join(ROOT, "tests", "workloads", "tiny.py")
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", tiny, "--steps", "3"], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "commprof: merging 2/2 ranks" in proc.stderr
