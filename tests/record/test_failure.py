"""When a job dies: how each rank ended, where, and the first collective
the ranks disagree on, from what survives the ranks (their collective rings,
faulthandler's reports, the journals), on real 2-rank gloo jobs."""
import os
import signal
import subprocess
import sys
import time

import pytest

import commprof
from commprof import assemble
from commprof.trace import ring
from helpers import ROOT, commprof_cmd, documented_record, run, venv_env

pytestmark = pytest.mark.slow

MULTI = os.path.join(ROOT, "tests", "workloads", "multinode.py")


def _record(out, *args, timeout=200):
    return run(commprof_cmd("record", "-o", out, "--nproc", "2", "--", sys.executable, MULTI, *args),
               timeout=timeout)


def _failure(out):
    rep = commprof.load(out).report()
    finds = rep.tables["bottlenecks"].frame
    return rep, finds[finds["bound"] == "failure"]


def test_a_size_mismatch_that_aborts_a_rank_is_named_with_both_sides(tmp_path):
    """Rank 1 skips the 4 KiB all_reduce of step 30 and goes on to its next
    DDP bucket: rank 0's 4 KiB call meets it, gloo aborts rank 0 (SIGABRT)
    and rank 1 fails with a connection reset. The mismatched calls were in
    flight well after the last flush; the rings keep them (every attempt,
    no race: benchmarks/failure_repeat.py runs it 10 times, with its result
    file; the suite runs it once)."""
    out = str(tmp_path / "rec")
    options, cmd = documented_record("docs/failures.md", "--skip-rank 1")     # the guide's command, as written
    proc = run(commprof_cmd("record", "-o", out, *options, "--", *cmd), timeout=200)
    assert proc.returncode != 0
    rep, fail = _failure(out)
    assert list(rep.tables)[0] == "failure"
    ends = rep.tables["failure"].frame
    first = ends.iloc[0]
    assert (first["rank"], first["ended"]) == (0, "aborted (SIGABRT)"), ends.to_string()
    assert first["where"].startswith("multinode.py:") and "all_reduce 4,096 B" in first["in_flight"]
    # gloo's exception, and the C-level stack of the thread it ended in (the native hooks' terminate handler)
    assert "Received data size doesn't match expected size" in first["detail"] or "Received data" in first["detail"]
    end0 = next(e for e in assemble.open_run(out)[0]["ends"] if e["rank"] == 0)
    assert any("gloo" in f.lower() for f in end0.get("native_stack", [])), end0.get("native_stack")
    # rank 1: gloo's connection reset, or torchrun's SIGTERM, whichever comes first
    assert ends.iloc[1]["rank"] == 1 and ends.iloc[1]["ended"] in ("raised RuntimeError", "terminated (SIGTERM)")
    assert len(fail) == 1, fail.to_string()
    f, e = fail.iloc[0]["finding"], fail.iloc[0]["evidence"]
    assert f.startswith("job failed: rank 0 aborted (SIGABRT) in all_reduce 4,096 B, step 31, at multinode.py:"), f
    assert "rank 0 all_reduce 4,096 B torch.float32 from user code" in e
    assert "rank 1 all_reduce" in e and "from the DDP reducer" in e, e
    # rank 1's bucket came from the native hooks' ring (C++), rank 0's call from the Python one
    last = {e["rank"]: e["last"] for e in assemble.open_run(out)[0]["ends"]}
    assert {w for *_x, w in last[1] if _x[5] == "ddp_reducer"} == {"native"}
    assert {w for *_x, w in last[0] if _x[5] == "torch.distributed"} == {"py"}
    others = rep.tables["bottlenecks"].frame
    assert others[others["bound"] != "failure"]["evidence"].str.startswith("before the failure: ").all()


def test_a_rank_sigkilled_inside_a_collective_keeps_its_in_flight_call(tmp_path):
    """Rank 1 skips a collective and lingers (same sizes: no abort): rank 0
    waits inside its all_reduce until the test SIGKILLs it. Its ring holds
    the call; every collective its ring recorded is in the trace. The
    rings have the size asked for (--ring-size 16) and keep at most that
    many, the newest."""
    out = str(tmp_path / "rec")
    proc = subprocess.Popen(commprof_cmd("record", "-o", out, "--nproc", "2", "--ring-size", "16", "--",
                                         sys.executable, MULTI,
                                         "--steps", "40", "--skip-rank", "1", "--skip-at", "20",
                                         "--sync-like-grads", "--linger-s", "60"),
                            env=venv_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shards = os.path.join(out, "shards")
    victim, deadline = None, time.monotonic() + 120
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        for path in sorted(os.listdir(shards)) if os.path.isdir(shards) else []:
            if not path.endswith(".py.ring"):
                continue
            header, recs = ring.read(os.path.join(shards, path))
            stuck = [r for r in recs if r["t_done"] is None and time.monotonic_ns() - r["t_issue"] > 2e9]
            if stuck:
                victim = (header["pid"], recs, stuck[-1])
        time.sleep(0.2)
    assert victim is not None, "no rank got stuck in a collective"
    rings = [ring.read(os.path.join(shards, f)) for f in os.listdir(shards) if f.endswith(".ring")]
    assert len(rings) >= 3 and all(h["slots"] == 16 and len(r) <= 16 for h, r in rings), \
        [(h, len(r)) for h, r in rings]
    assert any(r and r[0]["index"] > 1 for _h, r in rings), "no ring wrapped"
    pid, recs_before, stuck = victim
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    meta = assemble.open_run(out)[0]
    end = next(e for e in meta["ends"] if e["pid"] == pid)
    assert end["how"] == "killed"
    assert [(c["group"], c["seq"], c["op"], c["bytes"]) for c in end["in_flight"]] == \
        [(stuck["group"], stuck["seq"], "all_reduce", stuck["bytes"])]
    ev = commprof.load(out).events()
    mine = ev[(ev["category"] == "comm") & (ev["rank"] == end["rank"])]
    have = set(zip(mine["group"].astype(str), mine["seq"].astype(int)))
    assert all((r["group"], r["seq"]) in have for r in recs_before), "a ring record is missing from the trace"
    _rep, fail = _failure(out)
    assert fail.iloc[0]["finding"].startswith(f"job failed: rank {end['rank']} killed (no handler ran")


def test_a_segfault_keeps_its_signal_and_stack(tmp_path):
    out = str(tmp_path / "rec")
    proc = _record(out, "--steps", "30", "--crash-rank", "1", "--crash-at", "12")
    assert proc.returncode != 0
    rep, fail = _failure(out)
    first = rep.tables["failure"].frame.iloc[0]
    assert (first["rank"], first["ended"]) == (1, "crashed (SIGSEGV)"), rep.tables["failure"].frame.to_string()
    assert first["where"].startswith("multinode.py:") and first["step"] == 12
    end = next(e for e in assemble.open_run(out)[0]["ends"] if e["rank"] == 1)
    assert any(any("string_at" in f for f in t) for t in end["threads"]), end["threads"]


def test_a_rank_that_exits_early_is_named_as_the_one_that_never_issued(tmp_path):
    out = str(tmp_path / "rec")
    proc = _record(out, "--steps", "30", "--crash-rank", "1", "--crash-at", "12", "--crash", "exit")
    assert proc.returncode != 0
    _rep, fail = _failure(out)
    e = fail.iloc[0]["evidence"]
    assert fail.iloc[0]["finding"].startswith("job failed: rank 0 raised"), fail.to_string()
    assert "rank(s) 1 exited" in e and "rank 1 never issued it" in e, e


def test_a_clean_run_has_no_failure_section(tmp_path):
    out = str(tmp_path / "rec")
    proc = _record(out, "--steps", "12")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep, fail = _failure(out)
    assert "failure" not in rep.tables and fail.empty
    meta = assemble.open_run(out)[0]
    assert [e["how"] for e in meta["ends"]] == ["exit", "exit"] and not any("last" in e for e in meta["ends"])


def test_a_record_whose_completion_was_not_seen_is_not_called_in_flight(tmp_path):
    """A group runs its collectives in order: a record of step 9 without a
    completion, on a group whose step-12 collective completed, was not in
    flight when the rank ended (its completion was missed); one on another
    group without a later completion may be."""
    w = ring.RingWriter(str(tmp_path / "h.1.py.ring"), slots=16)
    w.issue("g", 5, "all_reduce", 8, "float32", "torch.distributed", 9, 100)
    w.issue("g", 6, "all_reduce", 8, "float32", "torch.distributed", 12, 200)
    w.done("g", 6, 250)
    w.issue("h", 0, "all_reduce", 8, "float32", "torch.distributed", 12, 300)
    w.close()
    recs = ring.read_process(str(tmp_path), "h", 1)
    stale = assemble.stale_records(recs)
    assert [(r["group"], r["seq"]) for r in recs if id(r) in stale] == [("g", 5)]
