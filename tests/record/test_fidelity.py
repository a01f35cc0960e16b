"""Recording must tell the truth and change nothing."""
import re
import sys

import numpy as np
import pytest

from commprof import assemble
from commprof.api import analyze
from helpers import TINY, why_failed

pytestmark = pytest.mark.slow  # launches training processes

PY = sys.executable


def test_data_share_within_one_point(record):
    # 25 ms of data loading per step in the main process, plus real compute.
    steps, warmup = 14, 2
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", str(steps), "--sleep", "0.025", "--hidden", "512",
                        "--layers", "3", "--batch", "64", "--compute-repeat", "4"])
    assert proc.returncode == 0, proc.stderr
    res = proc.results
    data = sum(sum(r["data_wait_ns"][warmup:]) for r in res.values())
    total = sum(sum(r["step_ns"][warmup:]) for r in res.values())
    truth = 100.0 * data / total
    report, _ = analyze([out], warmup=warmup)
    row = report.tables["breakdown"].frame.iloc[0]
    assert abs(row["data_pct"] - truth) <= 1.0, (row["data_pct"], truth)
    parts = row[["comm_pct", "data_pct", "compute_pct", "other_pct"]].sum()
    assert abs(parts - 100.0) < 1e-4  # per-step times are stored as float32
    # throughput agrees with the script's own clock (its step times, same steps)
    script_rate = sum(len(r["step_ns"][warmup:]) * r["batch"] / (sum(r["step_ns"][warmup:]) / 1e9)
                      for r in res.values())
    assert abs(row["samples_per_s"] - script_rate) / script_rate < 0.02, (row["samples_per_s"], script_rate)
    assert row["batch_per_rank"] == 64


def _plain(cmd, tmp_path, name):
    import subprocess

    from helpers import ROOT, results, venv_env

    res = tmp_path / name
    res.mkdir()
    cmd = [str(res) if c == "{res}" else c for c in cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=venv_env(), cwd=ROOT)
    return proc, results(str(res))


#: a 2-rank job whose ranks end with exit code 3; run plain once for the tests that compare with it
TWO_RANKS_EXIT_3 = ["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                    "--steps", "6", "--exit-code", "3"]


@pytest.fixture(scope="module")
def plain_two_ranks(tmp_path_factory):
    """(CompletedProcess, per-rank results) of TWO_RANKS_EXIT_3 without commprof."""
    return _plain(TWO_RANKS_EXIT_3, tmp_path_factory.mktemp("plain"), "plain")


def test_losses_bit_identical_and_exit_code_preserved(record, plain_two_ranks):
    cmd = TWO_RANKS_EXIT_3
    plain, plain_res = plain_two_ranks
    proc, out = record(cmd)
    assert plain.returncode != 0
    assert proc.returncode == plain.returncode
    for r in (0, 1):
        assert proc.results[r]["losses"] == plain_res[r]["losses"]  # bit-identical floats


def test_three_ranks_train_bit_identically_on_both_ddp_paths(record, tmp_path):
    """At 3 ranks (1/3 is inexact) the trained parameters stay bit-identical
    on both DDP timing paths: process-group hooks (DDP's own C++ path, no
    comm hook) and the timed comm hook with the Reducer's arithmetic (torch's
    allreduce_hook, which divides, changed the last bits here)."""
    cmd = ["torchrun", "--standalone", "--nproc_per_node=3", TINY, "--result-dir", "{res}", "--steps", "6"]
    plain, plain_res = _plain(cmd, tmp_path, "plain")
    assert plain.returncode == 0, why_failed(plain)
    for timing, hook in (("auto", ""), ("comm-hook", "allreduce_like_the_reducer")):
        proc, out = record(cmd, "--ddp-timing", timing)
        assert proc.returncode == 0, why_failed(proc)
        for r in range(3):
            assert proc.results[r]["params_sha256"] == plain_res[r]["params_sha256"], (timing, r)
            assert proc.results[r]["losses"] == plain_res[r]["losses"], (timing, r)
            assert proc.results[r]["comm_hook"].endswith(hook) and bool(hook) == bool(proc.results[r]["comm_hook"])
        run = assemble.load(out).table.to_pandas()
        b = run[run["source"] == "ddp_reducer"]
        assert set(b["detail"]) == {"reducer" if timing == "auto" else "default"}
        assert (b.groupby("rank")["step"].nunique() == 6).all()


def test_failing_instruments_disable_themselves(record, plain_two_ranks):
    """Every instrument failing at once: each logs once per process and
    disables itself; the losses and the exit code are the plain run's."""
    from commprof.record.instruments import ALL

    plain, plain_res = plain_two_ranks
    faults = []
    for name in ALL:
        faults += ["--fault-inject", name]
    proc, out = record(TWO_RANKS_EXIT_3, *faults)
    assert proc.returncode == plain.returncode != 0, proc.stderr     # torchrun's status for a rank's exit 3
    for r in (0, 1):
        assert proc.results[r]["losses"] == plain_res[r]["losses"]
    # what this job imports and runs (CUDA graphs are not captured on CPU)
    torch_instruments = [n for n, cls in ALL.items() if cls.trigger == "torch" and not getattr(cls, "cuda_only", False)]
    for name in torch_instruments:
        lines = [ln for ln in proc.stderr.splitlines() if f"instrument {name!r} disabled" in ln]
        # logged once per process (2 ranks), never a traceback
        assert len(lines) == 2, (name, proc.stderr)
    # never a traceback of commprof's: the one torchrun prints is its report of the rank's exit code 3
    assert not re.search(r'File "[^"]*/commprof/', proc.stderr), proc.stderr
    assert proc.stderr.count("Traceback") <= 1 and ("Traceback" not in proc.stderr or "ChildFailedError" in proc.stderr)


def test_single_failing_instrument_keeps_the_others(record):
    proc, out = record([PY, TINY, "--steps", "4"], "--fault-inject", "dataloader")
    assert proc.returncode == 0
    from commprof import assemble

    ev = assemble.load(out).table.to_pandas()
    assert not (ev["category"] == "data").any()
    assert (ev["name"] == "forward").sum() >= 4
    assert (ev["category"] == "step").sum() == 4


def test_overlap_split_of_backward(record):
    """DDP's backward is split into compute and the exposed wait for the last
    buckets: the wait starts at the last bucket's issue and the buckets
    complete inside it."""
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", "4", "--hidden", "256"])
    assert proc.returncode == 0, proc.stderr
    from commprof import assemble

    ev = assemble.load(out).table.to_pandas()
    for (rank, step), g in ev[ev["step"] < 4].groupby(["rank", "step"]):
        wait = g[g["category"] == "wait"]
        bw = g[g["name"] == "backward"]
        buckets = g[g["source"] == "ddp_reducer"]
        assert len(wait) == 1 and len(bw) == 1
        assert bw["t_end"].iloc[0] == wait["t_start"].iloc[0] == buckets["t_start"].max()
        assert buckets["t_end"].max() <= wait["t_end"].iloc[0]
        assert np.all(buckets["t_start"] >= bw["t_start"].iloc[0])
