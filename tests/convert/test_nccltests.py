"""nccl-tests logs in, the same table out."""
import math

import pytest

from commprof.cli import main
from commprof.convert import nccltests
from commprof.trace.schema import TraceFormatError

LOG = """# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41201 on node-a device  0 [0x07] NVIDIA A100-SXM4-40GB
#  Rank  1 Group  0 Pid  41202 on node-a device  1 [0x0b] NVIDIA A100-SXM4-40GB
#  Rank  2 Group  0 Pid  41203 on node-b device  0 [0x07] NVIDIA A100-SXM4-40GB
#  Rank  3 Group  0 Pid  41204 on node-b device  1 [0x0b] NVIDIA A100-SXM4-40GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    12.10    0.00    0.00      0    11.90    0.00    0.00      0
        1024           256     float     sum      -1    14.00    0.07    0.11      0    13.80    0.07    0.11      0
     1048576        262144     float     sum      -1    60.00   17.48   26.21      0    59.50   17.62   26.43      0
   134217728      33554432     float     sum      -1  2050.00   65.47   98.21      3  2040.00   65.79   98.69      0
# Out of bounds values : 3 FAILED
# Avg bus bandwidth    : 31.22
#
"""


def test_parse_rows_ranks_and_wrong_counts():
    doc = nccltests.parse(LOG, "logs/all_reduce_perf.4gpu.log")
    assert doc["world_size"] == 4 and len(doc["rows"]) == 4
    big = doc["rows"][-1]
    assert big["op"] == "all_reduce" and big["bytes"] == 134217728 and big["count"] == 33554432
    assert big["out_of_place"]["time_us"] == 2050.0 and big["out_of_place"]["wrong"] == 3
    assert big["in_place"]["wrong"] == 0 and big["root"] == -1 and big["dtype"] == "float"
    # busbw is algbw x 2(n-1)/n, as the log says
    alg, bus = nccltests.bandwidths("all_reduce", big["bytes"], big["out_of_place"]["time_us"], 4)
    assert alg == pytest.approx(65.47, abs=0.01) and bus == pytest.approx(98.21, abs=0.01)


def test_older_logs_without_the_root_column():
    old = "\n".join(ln for ln in LOG.splitlines())
    rows = [ln for ln in old.splitlines() if ln.strip() and not ln.startswith("#")]
    for ln in rows:
        f = ln.split()
        old = old.replace(ln, "  ".join(f[:4] + f[5:]))
    doc = nccltests.parse(old, "all_reduce_perf.log")
    assert [r["bytes"] for r in doc["rows"]] == [8, 1024, 1048576, 134217728]
    assert doc["rows"][2]["out_of_place"]["time_us"] == 60.0


def test_truncated_and_foreign_logs_are_clear_errors():
    cut = LOG[: LOG.index("   134217728") + 40]  # killed while printing the last row
    with pytest.raises(TraceFormatError, match="truncated size row"):
        nccltests.parse(cut, "all_reduce_perf.log")
    no_end = LOG[: LOG.index("# Out of bounds")]
    with pytest.raises(TraceFormatError, match="truncated log"):
        nccltests.parse(no_end, "all_reduce_perf.log")
    with pytest.raises(TraceFormatError, match="which collective"):
        nccltests.parse(LOG, "mystery.log")
    with pytest.raises(TraceFormatError, match="not an nccl-tests log"):
        nccltests.parse("hello\nworld\n", "all_reduce_perf.log")


def test_collective_from_the_log_header():
    doc = nccltests.parse("# Collective test starting: reduce_scatter_perf\n" + LOG, "x.log")
    assert doc["rows"][0]["op"] == "reduce_scatter"


def test_our_table_reads_back_as_nccl_tests():
    doc = nccltests.parse(LOG, "all_reduce_perf.log")
    again = nccltests.parse(nccltests.table(doc), "all_reduce_perf.log")
    for a, b in zip(doc["rows"], again["rows"]):
        assert (a["bytes"], a["count"]) == (b["bytes"], b["count"])
        assert a["out_of_place"]["time_us"] == pytest.approx(b["out_of_place"]["time_us"], abs=0.01)
        assert a["out_of_place"]["wrong"] == b["out_of_place"]["wrong"]


@pytest.mark.parametrize("op, n, factor", [("all_reduce", 8, 1.75), ("reduce_scatter", 8, 0.875),
                                           ("all_gather", 4, 0.75), ("broadcast", 16, 1.0),
                                           ("all_to_all", 2, 0.5)])
def test_bus_factors_are_nccl_tests(op, n, factor):
    assert nccltests.bus_factor(op, n) == factor
    alg, bus = nccltests.bandwidths(op, 10**9, 1e6, n)  # 1 GB in 1 s
    assert alg == pytest.approx(1.0) and bus == pytest.approx(factor)
    assert math.isnan(nccltests.bandwidths(op, 8, 0.0, n)[0])


def test_import_command(tmp_path, capsys):
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(LOG)
    assert main(["import", "nccl-tests", str(log), "--model", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "134217728" in out and "alpha-beta fit" in out
    bad = tmp_path / "cut_all_reduce_perf.log"
    bad.write_text(LOG[: LOG.index("# Out of bounds")])
    assert main(["import", "nccl-tests", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "truncated log" in err[0]
