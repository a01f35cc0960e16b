"""Crash safety, signals, exit codes and leftover processes."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from commprof import assemble
from helpers import ROOT, TINY, commprof_cmd, run, venv_env

pytestmark = pytest.mark.slow  # launches training processes

PY = sys.executable


def test_sigkilled_rank_is_salvaged_and_others_complete(record, tmp_path):
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", "40", "--step-sleep", "0.15", "--kill-at", "12", "--kill-rank", "1"],
                       "--flush-interval", "0.5")
    assert proc.returncode != 0  # torchrun reports the failed worker; commprof passes it on
    res_dir = proc.res_dir
    with open(os.path.join(res_dir, "killed1.json")) as fh:
        killed = json.load(fh)
    run_ = assemble.load(out)
    ev = run_.table.to_pandas()
    metas = {m["rank"]: m for m in run_.ranks}
    assert metas[1]["status"] == "salvaged"
    assert metas[0]["status"] == "complete"
    assert run_.meta["salvaged_ranks"] == [1]
    dead = ev[ev["rank"] == 1]
    # everything older than ~1 s before the SIGKILL survived
    assert dead["t_end"].max() >= killed["t"] - 1_000_000_000
    assert (dead[dead["category"] == "step"]["step"].max()) >= killed["step"] - 7
    alive = ev[ev["rank"] == 0]
    assert alive[alive["category"] == "step"]["step"].max() >= killed["step"] - 1
    # the report still works on it, and says so
    rep = run(commprof_cmd("report", out))
    assert rep.returncode == 0, rep.stderr
    assert "killed" in rep.stdout


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_reaches_job_and_exit_status_matches(tmp_path, sig):
    """The signal sent to ``commprof record`` ends the job as it would end
    it unrecorded. Started with SIGINT at its default: a shell without job
    control starts its background commands with SIGINT ignored, and a job
    that inherits that ignores it with or without commprof."""
    out = str(tmp_path / "rec")
    res = tmp_path / "res"
    res.mkdir()
    p = subprocess.Popen(commprof_cmd("record", "-o", out, "--", PY, TINY, "--steps", "400",
                                      "--step-sleep", "0.05", "--result-dir", str(res)),
                         env=venv_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    shard_dir = os.path.join(out, "shards")
    deadline = time.time() + 60
    journal = None
    while time.time() < deadline and journal is None:
        if os.path.isdir(shard_dir):
            js = [f for f in os.listdir(shard_dir) if f.endswith(".meta.json")]
            journal = js[0] if js else None
        time.sleep(0.1)
    assert journal, "the job never started recording"
    child_pid = int(journal.split(".")[-3])
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == -sig, (p.returncode, stderr)
    assert not _pid_alive(child_pid)
    # the rank finalised its shard on the way out (SIGTERM handler / KeyboardInterrupt + atexit)
    r = assemble.load(out)
    assert r.ranks[0]["status"] == "complete"
    assert (r.table.to_pandas()["category"] == "step").sum() >= 1


def test_a_sigterm_during_the_final_flush_loses_nothing(record):
    """A launcher terminating a rank that is already exiting (torchrun after
    another rank's abort, while this one's collective failed) signals it
    inside commprof's final flush: the flush completes, every step is in
    the trace, and the process still dies of SIGTERM (planted: the process
    signals itself inside close(), before the final flush)."""
    import commprof

    proc, out = record([PY, TINY, "--steps", "5"], env=venv_env({"COMMPROF_TEST_SIGTERM_IN_CLOSE": "1"}))
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    ev = commprof.load(out).events()
    assert (ev["category"].astype(str) == "step").sum() == 5, ev["category"].value_counts()
    end = assemble.open_run(out)[0]["ends"]
    assert [e["signal"] for e in end] == ["SIGTERM"], end


def test_exit_code_passthrough_without_torch(record):
    proc, out = record([PY, "-c", "import sys; sys.exit(7)"])
    assert proc.returncode == 7
    assert "no process recorded any event" in proc.stderr


def test_child_killed_by_signal_kills_commprof_alike(record):
    proc, out = record([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert proc.returncode == -signal.SIGKILL


def test_command_not_found(record):
    proc, out = record(["no-such-command-xyz"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["commprof: error: command not found: no-such-command-xyz"]


def test_unwritable_output_fails_before_the_job(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    marker = tmp_path / "ran"
    proc = run(commprof_cmd("record", "-o", str(blocker / "sub"), "--", PY, "-c",
                            f"open({str(marker)!r}, 'w').write('1')"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "not writable" in proc.stderr
    assert not marker.exists()


def test_existing_recording_is_not_overwritten(record):
    proc, out = record([PY, TINY, "--steps", "2"])
    assert proc.returncode == 0
    before = os.path.getmtime(os.path.join(out, "trace.parquet"))
    proc2, _ = record([PY, TINY, "--steps", "2"], out=out)
    assert proc2.returncode == 2
    assert "already holds a recording" in proc2.stderr
    assert os.path.getmtime(os.path.join(out, "trace.parquet")) == before


def test_no_command(tmp_path):
    proc = run(commprof_cmd("record", "-o", str(tmp_path / "x")))
    assert proc.returncode == 2
    assert "no command to record" in proc.stderr


def test_python_dash_m_commprof_equals_console_script(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "commprof")
    a = run([exe, "--version"])
    b = run(commprof_cmd("--version"))
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout and a.stdout.startswith("commprof ")


def test_a_job_killed_in_its_first_steps_keeps_both_ranks(record):
    """Rank 1 SIGKILLed in step 1, ~a second into training: torchrun ends
    rank 0 with SIGTERM. Rank 0's events up to its SIGTERM (written
    synchronously by its handler: pure Python, no pyarrow) and rank 1's up
    to about one flush interval before the kill are in the trace."""
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", "40", "--step-sleep", "0.6", "--kill-at", "1", "--kill-rank", "1"],
                       "--flush-interval", "0.5")
    assert proc.returncode != 0
    assert "no process recorded any event" not in proc.stderr
    with open(os.path.join(proc.res_dir, "killed1.json")) as fh:
        killed = json.load(fh)
    run_ = assemble.load(out)
    ev = run_.table.to_pandas()
    metas = {m["rank"]: m for m in run_.ranks}
    assert set(metas) == {0, 1}, metas
    assert metas[0]["status"] == "complete" and metas[1]["status"] == "salvaged"
    dead, alive = ev[ev["rank"] == 1], ev[ev["rank"] == 0]
    assert 0 in set(dead[dead["category"] == "step"]["step"])  # step 0 was flushed before the kill
    assert dead["t_end"].max() >= killed["t"] - 1_500_000_000
    assert alive[alive["category"] == "step"]["step"].max() >= 1
    assert (alive["category"] == "comm").any()


def test_a_recorded_rank_imports_no_pyarrow_or_pandas(record, tmp_path):
    """A pure-PyTorch DDP script recorded on 2 ranks: after its journal has
    been flushed many times and closed, neither pyarrow nor pandas was ever
    imported in the rank (numpy is: torch imports it itself)."""
    script = tmp_path / "pure.py"
    script.write_text(
        "import json, os, sys, time\n"
        "import torch, torch.distributed as dist, torch.nn as nn\n"
        "dist.init_process_group('gloo')\n"
        "model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(20):\n"
        "    model(torch.randn(8, 16)).sum().backward(); opt.step(); opt.zero_grad(); time.sleep(0.02)\n"
        "import commprof.record.session as s\n"
        "s.stop()  # flush and close the journal now, then look\n"
        "heavy = [m for m in ('pyarrow', 'pandas') if m in sys.modules]\n"
        "json.dump({'heavy': heavy, 'numpy': 'numpy' in sys.modules},\n"
        "          open(os.path.join(sys.argv[1], f'mods{dist.get_rank()}.json'), 'w'))\n"
        "t = torch.zeros(1); dist.all_reduce(t)\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'workloads')!r})\n"
        "from teardown import wait_released  # gloo lets go of the last tensor first (docs/known-issues.md)\n"
        "wait_released([t]); dist.destroy_process_group()\n")
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", str(script), "{res}"],
                       "--flush-interval", "0.05")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in (0, 1):
        with open(os.path.join(proc.res_dir, f"mods{r}.json")) as fh:
            mods = json.load(fh)
        assert mods["heavy"] == [], mods
    ev = assemble.load(out).table.to_pandas()
    assert set(ev["rank"]) == {0, 1} and (ev["category"] == "comm").any()
