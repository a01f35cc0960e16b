"""Hangs diagnosed live (--hang-timeout) and after the fact (mismatch
table); several ``commprof record`` sharing one folder merge exactly once;
``commprof merge``."""
import json
import os
import subprocess
import sys

import pytest

import commprof
from commprof import assemble
from helpers import ROOT, TINY, commprof_cmd, run, venv_env

pytestmark = pytest.mark.slow

MULTI = os.path.join(ROOT, "tests", "workloads", "multinode.py")


def test_skipped_collective_is_diagnosed_live_and_after_the_fact(tmp_path):
    out = str(tmp_path / "rec")
    # rank 1 skips the blocking all_reduce of step 5; every later collective
    # pairs shifted by one, and rank 0 finally waits for a collective rank 1
    # never issues (rank 1 stays alive, busy elsewhere)
    proc = run(commprof_cmd("record", "-o", out, "--hang-timeout", "3", "--hang-kill", "--nproc", "2", "--",
                            sys.executable, MULTI, "--skip-rank", "1", "--skip-at", "5", "--sync-like-grads",
                            "--linger-s", "120"), timeout=200)
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert "no rank made progress for 3 s" in proc.stderr
    with open(os.path.join(out, "hang.json")) as fh:
        hang = json.load(fh)
    assert hang["waiting_for"] == [1]
    by_rank = {r["rank"]: r for r in hang["ranks"]}
    assert len(by_rank[0]["in_flight"]) == 1 and by_rank[0]["in_flight"][0]["op"] == "all_reduce"
    assert by_rank[0]["in_flight_from"] == by_rank[1]["in_flight_from"] == "ring"
    assert by_rank[0]["in_flight"][0]["for_s"] >= 3
    assert by_rank[1]["in_flight"] == []
    text = open(os.path.join(out, "hang.txt")).read()
    assert "rank(s) 1 never issued it: the others wait for them" in text
    # every rank's Python stack, the blocked one inside all_reduce
    assert "Stacks of rank 0" in text and "Stacks of rank 1" in text
    stack0 = text.split("Stacks of rank 0")[1].split("Stacks of rank 1")[0]
    assert "in all_reduce" in stack0 and "multinode.py" in stack0
    assert "time.sleep" not in stack0
    # after the fact: the trace (both ranks, salvaged) shows where the sequences diverged
    rep = commprof.load(out).report()
    mism = rep.tables["mismatches"].frame
    first = mism.iloc[0]
    assert first["kind"] == "issuer mismatch"
    ev = commprof.load(out).events()
    c = ev[(ev["category"] == "comm") & (ev["source"] == "torch.distributed")]
    # the first mismatched instance is rank 0's blocking all_reduce of loop step 5 (stamped step 6)
    seq0 = c[(c["rank"] == 0) & (c["step"] == 6)]["seq"].min()
    assert int(first["seq"]) == int(seq0)
    finds = rep.tables["bottlenecks"].frame
    assert finds["finding"].str.contains("collective mismatch").any()


def test_hang_timeout_stays_quiet_on_a_healthy_job(tmp_path):
    out = str(tmp_path / "rec")
    proc = run(commprof_cmd("record", "-o", out, "--hang-timeout", "20", "--hang-kill", "--nproc", "2", "--",
                            sys.executable, MULTI, "--steps", "6"), timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not os.path.exists(os.path.join(out, "hang.json"))
    run_ = assemble.load(out)
    assert run_.meta["ranks_recorded"] == 2
    # progress and stack files are side files: gone after the merge
    assert not os.path.exists(os.path.join(out, "shards"))


def test_mismatched_dtypes_in_the_trace(tmp_path):
    """A rank reducing another dtype (same bytes) at the same (group, seq):
    gloo completes it (with garbage); the report names the instance, both
    dtypes and the ranks."""
    out = str(tmp_path / "rec")
    proc = run(commprof_cmd("record", "-o", out, "--nproc", "2", "--", sys.executable, MULTI, "--steps", "40",
                            "--mismatch-rank", "1", "--mismatch-at", "30", "--sync-bytes", "1024"), timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = commprof.load(out).report()
    mism = rep.tables["mismatches"].frame
    assert len(mism) == 1, mism
    first = mism.iloc[0]
    assert first["kind"] == "dtype mismatch"
    assert first["detail"] == "torch.float32 on rank 0 vs torch.float64 on rank 1"
    ev = commprof.load(out).events()
    c = ev[(ev["category"] == "comm") & (ev["rank"] == 1) & (ev["dtype"] == "torch.float64")]
    assert len(c) == 1 and int(c["seq"].iloc[0]) == int(first["seq"])


def _two_records(tmp_path, out, extra=()):
    """Two concurrent 'commprof record --nodes 2' (one process each) into one folder."""
    env = venv_env()
    procs = []
    for k in range(2):
        res = tmp_path / f"res{k}"
        res.mkdir(exist_ok=True)
        procs.append(subprocess.Popen(
            commprof_cmd("record", "-o", out, "--nodes", "2", *extra, "--", sys.executable, TINY,
                         "--steps", str(4 + 6 * k), "--result-dir", str(res)),
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=200) for p in procs]
    return procs, outs


def test_shared_folder_merges_exactly_once(tmp_path):
    out = str(tmp_path / "shared")
    procs, outs = _two_records(tmp_path, out, ("--run-id", "job42"))
    assert [p.returncode for p in procs] == [0, 0], outs
    errs = "".join(e for _, e in outs)
    assert errs.count("-> " + os.path.join(out, "trace.parquet")) == 1      # one merge
    assert "done; the last participant merges" in errs                      # the other left it
    run_ = assemble.load(out)
    assert run_.meta["run_id"] == "job42"
    pids = sorted(m["pid"] for m in run_.ranks)
    assert len(pids) == 2 and pids[0] != pids[1]
    assert not os.path.exists(os.path.join(out, ".nodes"))
    # a third recording into the merged folder is refused
    again = run(commprof_cmd("record", "-o", out, "--nodes", "2", "--", sys.executable, TINY))
    assert again.returncode == 2 and "already holds a recording" in again.stderr


def test_merge_by_hand(tmp_path):
    out = str(tmp_path / "rec")
    # one participant of two expected: it cannot merge alone
    proc = run(commprof_cmd("record", "-o", out, "--nodes", "2", "--", sys.executable, TINY, "--steps", "4"))
    assert proc.returncode == 0
    assert "waiting for: 1 participant(s) not started" in proc.stderr
    assert not os.path.exists(os.path.join(out, "trace.parquet"))
    m = run(commprof_cmd("merge", out))
    assert m.returncode == 0, m.stderr
    assert assemble.load(out).meta["ranks_recorded"] == 1
    again = run(commprof_cmd("merge", out))
    assert again.returncode == 2 and "already merged" in again.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    none = run(commprof_cmd("merge", str(empty)))
    assert none.returncode == 2 and "no shards" in none.stderr


def test_a_participant_that_finds_the_merge_done_and_cleared_leaves_quietly(tmp_path, monkeypatch):
    """Two nodes finishing together: this one marks itself done, the other
    takes the merge lock, merges, releases it and removes ``.nodes/`` before
    this one tries the lock. It must see the merge done and leave (it once
    exited 2: 'merging: No such file or directory')."""
    import shutil

    from commprof.record import shared
    from commprof.trace.parquet import TRACE_FILE

    out = str(tmp_path / "shared")
    me = shared.Participant(out, "job7", expected=2)
    write = shared.Participant._write

    def done_then_the_other_merges(self, state):
        write(self, state)
        if state == "done":
            with open(os.path.join(out, TRACE_FILE), "wb"):
                pass
            shutil.rmtree(os.path.join(out, shared.NODES_DIR))

    monkeypatch.setattr(shared.Participant, "_write", done_then_the_other_merges)
    assert me.finish() is False
    # with no merge done, a vanished folder is still an error
    other = str(tmp_path / "other")
    me2 = shared.Participant(other, "job8", expected=2)
    monkeypatch.setattr(shared.Participant, "_write",
                        lambda self, state: shutil.rmtree(os.path.join(other, shared.NODES_DIR)))
    with pytest.raises(FileNotFoundError):
        me2.finish()
