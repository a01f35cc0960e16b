"""The collective ring's layout (trace/ring.py), faulthandler's report
parsed (trace/ends.py) and the cross-rank match of rings
(analyzers/failure.py): unit tests of the parts, on inputs written here.
The real thing, dying processes, is tests/record/test_failure.py."""
import os
import struct
import subprocess
import sys

from commprof.analyzers import failure
from commprof.trace import ends, ring


def test_records_survive_in_write_order_and_wrap_keeps_the_last(tmp_path):
    path = str(tmp_path / "h.1.py.ring")
    w = ring.RingWriter(path, slots=8, pid=1)
    for seq in range(20):
        w.issue("0", seq, "all_reduce", 4096, "torch.float32", "torch.distributed", seq // 2, 1000 + seq, 2)
        if seq != 19:
            w.done("0", seq, 2000 + seq)
    w.done("0", 3, 9999)  # overwritten long ago: ignored
    header, recs = ring.read(path)
    assert header == {"slots": 8, "rank": -1, "pid": 1}
    assert [r["seq"] for r in recs] == list(range(12, 20))
    assert recs[-1]["t_done"] is None and recs[0]["t_done"] == 2012
    assert (recs[0]["source"], recs[0]["group_size"], recs[0]["step"]) == ("torch.distributed", 2, 6)


def test_a_torn_slot_is_skipped(tmp_path):
    path = str(tmp_path / "h.1.py.ring")
    w = ring.RingWriter(path, slots=4)
    for seq in range(3):
        w.issue("0", seq, "broadcast", None, None, "user", 0, seq)
    struct.pack_into("<Q", w.mm, ring.HEADER_SIZE + ring.SLOT_SIZE, 0)  # slot 1's index: the write in progress
    recs = ring.read(path)[1]
    assert [r["seq"] for r in recs] == [0, 2] and recs[0]["bytes"] is None


def test_a_killed_writer_leaves_its_records(tmp_path):
    """The page cache keeps what a SIGKILLed process stored into the map."""
    path = str(tmp_path / "h.1.py.ring")
    code = ("import os, sys; from commprof.trace import ring; w = ring.RingWriter(sys.argv[1]); "
            "[w.issue('0', s, 'all_reduce', 8, 'torch.float32', 'x', 0, s) for s in range(5)]; "
            "os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, path])
    assert proc.returncode == -9
    assert [r["seq"] for r in ring.read(path)[1]] == [0, 1, 2, 3, 4]


FATAL = """Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/x/commprof/record/writer.py", line 50 in _loop

Current thread 0x00007f0000000002 (most recent call first):
  File "/usr/local/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/home/u/train.py", line 88 in main
  File "/home/u/train.py", line 100 in <module>

Extension modules: numpy.core._multiarray_umath (total: 1)
"""


def test_faulthandler_report_parsed():
    e = ends.parse_fatal(FATAL)
    assert (e["signal"], e["where"], e["user_where"]) == ("SIGSEGV", "__init__.py:519 in string_at",
                                                          "train.py:88 in main")
    assert not e["in_backend_thread"] and len(e["threads"]) == 2
    aborted = FATAL.replace("Segmentation fault", "Aborted").replace(
        'Current thread 0x00007f0000000002 (most recent call first):\n', 'Thread 0x2 (most recent call first):\n')
    aborted += "\nCurrent thread 0x00007f0000000003 (most recent call first):\n  <no Python frame>\n"
    e = ends.parse_fatal(aborted)
    assert e["signal"] == "SIGABRT" and e["in_backend_thread"] and e["user_where"] == "train.py:88 in main"
    assert ends.parse_fatal("not a report") is None
    cxx = ("commprof terminate: [enforce fail at pair.cc:464] Received data size doesn't match\n"
           "commprof native stack:\n/x/libgloo.so(_ZN4gloo+0x10)[0x7f00]\n/lib/libc.so.6(+0x9)[0x7f01]\n"
           "commprof native stack end\n") + aborted
    e = ends.parse_fatal(cxx)
    assert e["message"].endswith("Received data size doesn't match") and len(e["native_stack"]) == 2


def test_end_of_a_rank_without_files(tmp_path):
    assert ends.end_of(str(tmp_path), {"host": "h", "pid": 1, "status": "complete"})["how"] == "exit"
    assert ends.end_of(str(tmp_path), {"host": "h", "pid": 1, "status": "salvaged"})["how"] == "killed"
    (tmp_path / "h.1.fatal.txt").write_text(FATAL)
    assert ends.end_of(str(tmp_path), {"host": "h", "pid": 1, "status": "salvaged"})["signal"] == "SIGSEGV"


def _end(rank, how, last, **kw):
    return {"rank": rank, "how": how, "last": [[g, s, op, b, "torch.float32", src, True, "py"]
                                               for g, s, op, b, src in last], **kw}


def test_rings_matched_across_ranks():
    same = [("0", s, "all_reduce", 64, "ddp_reducer") for s in range(10, 14)]
    meta = {"ends": [_end(0, "signal", same + [("0", 14, "all_reduce", 4096, "torch.distributed")]),
                     _end(1, "exception", same + [("0", 14, "all_reduce", 16640, "ddp_reducer")])]}
    d = failure.disagreement(meta)
    assert (d["group"], d["seq"], d["missing"]) == ("0", 14, [])
    assert failure.describe(d) == ("group 0 #14: rank 0 all_reduce 4,096 B torch.float32 from user code "
                                   "(torch.distributed); rank 1 all_reduce 16,640 B torch.float32 from the "
                                   "DDP reducer")
    early = {"ends": [_end(0, "exception", same + [("0", 14, "all_reduce", 64, "ddp_reducer")]),
                      _end(1, "exit", same)]}
    d = failure.disagreement(early)
    assert (d["seq"], d["missing"]) == (14, [1])
    agree = {"ends": [_end(0, "killed", same), _end(1, "exit", same)]}
    assert failure.disagreement(agree) is None
    assert failure.failed(agree) and not failure.failed({"ends": [_end(0, "exit", same)], "job_exit": {"code": 0}})
    assert failure.findings(agree)[0]["evidence"].endswith("no disagreement in the last 4 collectives of the rings")


def test_the_ring_module_is_the_layout_the_native_hooks_write():
    src = open(os.path.join(os.path.dirname(ring.__file__), "..", "record", "_pghooks.cpp")).read()
    assert f"sizeof(RingSlot) == {ring.SLOT.size}" in src
    assert f"kRingHeader = {ring.HEADER_SIZE}, kRingSlotSize = {ring.SLOT_SIZE}" in src
