"""The GPU check itself, run on CPU (``--dry-run``: gloo, tiny runs, a
simulated device): the one chance on a borrowed GPU must not be spent on a
bug in the check's own code. The full dry run passes; each fault planted
on purpose makes the verdict fail with the check that saw it named."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpu_check.py")
sys.path.insert(0, HERE)

import gpu_check  # noqa: E402


def dry(tmp_path, *args):
    proc = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=gpu_check.plan_total_s() + 120)
    with open(tmp_path / "gpu_check.json") as fh:
        return proc, json.load(fh)


@pytest.fixture(scope="module")
def full_dry_run(tmp_path_factory):
    """The whole dry run, once: (its folder, the process, the summary)."""
    out = tmp_path_factory.mktemp("gpu-dry")
    return (out, *dry(out))


def test_the_plan_fits_the_device_time():
    assert gpu_check.plan_total_s() <= gpu_check.PLAN_LIMIT_S <= 8 * 60
    assert [n for n, _ in gpu_check.PLAN][0] == "nccl-micro"          # the collective truth first
    assert set(gpu_check.PLANNED_CHECKS) == {n for n, _ in gpu_check.PLAN}


def test_overhead_is_taken_over_the_pairs_that_completed():
    """Two pairs in ABBA order on a machine that drifts: the mean over both
    pairs is the figure checked, each pair's own beside it; a pair with a
    run missing is left out, not half-counted."""
    med = {"p1": 0.010, "r1": 0.011, "r2": 0.013, "p2": 0.012}
    o = gpu_check.overhead(med, ("p1", "p2"), ("r1", "r2"), 3.0)
    assert o["pairs"] == 2 and o["per_pair_pct"] == [10.0, 8.33]
    assert o["overhead_pct"] == pytest.approx(100 * (0.012 / 0.011 - 1))
    o = gpu_check.overhead(dict(med, p2=None), ("p1", "p2"), ("r1", "r2"), 3.0)
    assert o["pairs"] == 1 and o["overhead_pct"] == pytest.approx(10.0)


@pytest.mark.parametrize("rc, median, failed", [
    (0, 0.01, False), ("not run (budget)", None, False), ("not run (dry run: one pair)", None, False),
    (None, None, False), (1, None, True), ("timeout", None, True), (0, None, True)])
def test_a_pair_run_that_timed_out_or_wrote_no_steps_has_failed(monkeypatch, rc, median, failed):
    """Left out (the budget, the dry run) is not a failure; a timeout, a
    non-zero exit or an exit 0 without step times is: the overhead check
    then fails instead of passing on the other pair alone."""
    runs = {} if rc is None else {"r50-recorded-2": {"rc": rc}}
    monkeypatch.setitem(gpu_check.SUMMARY, "runs", runs)
    assert gpu_check.run_failed("r50-recorded-2", median) is failed


@pytest.mark.slow
def test_gpu_check_dry_run_passes_and_writes_its_summary(full_dry_run):
    _, proc, summary = full_dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert summary["verdict"] == "pass" and summary["ok"] is True and summary["dry_run"] is True
    assert summary["plan_total_s"] <= gpu_check.PLAN_LIMIT_S
    assert set(summary["runs"]) == {n for n, _ in gpu_check.PLAN}
    ran = {n: r for n, r in summary["runs"].items() if n not in gpu_check.SECOND_PAIRS}
    assert all(r["rc"] == 0 and r["left_behind"] == [] for r in ran.values())
    assert all(summary["runs"][n]["rc"].startswith("not run (dry run") for n in gpu_check.SECOND_PAIRS)
    assert summary["not_run"] == {}
    planned = {c for cs in gpu_check.PLANNED_CHECKS.values() for c in cs}
    assert planned <= set(summary["checks"])
    statuses = {n: c["status"] for n, c in summary["checks"].items()}
    assert set(statuses.values()) <= {"pass", "n/a"}, statuses
    # what cannot apply on a CPU says so (and why); the rest ran and passed
    assert {n for n, s in statuses.items() if s == "n/a"} == {
        "telemetry: NVML sampled", "kernel mode: convolution kernels found", "kernel mode: NCCL kernels found"}
    assert set(summary["overhead"]) == {"r50", "r18", "r18 comm-hook"}
    for name in ("r18-rec", "r18-rec-hook"):   # both DDP timing points pass the device checks
        assert statuses[f"{name}: device rows"] == "pass", name
    assert all(o["pairs"] == 1 for o in summary["overhead"].values())
    for run in ran.values():
        assert os.path.exists(run["log"])


@pytest.mark.slow
@pytest.mark.parametrize("fault, only, failing, status", [
    ("skip", "r18-recorded", "r18-rec: device rows", "not run"),
    ("missing-trace", "r50-recorded", "r50-recorded: a trace was written", "fail"),
    ("device-before-host", "r50-recorded", "r50-rec: device never before host issue", "fail"),
    ("orphan", "r18-plain", "no process outlives its run", "fail"),
])
def test_a_planted_fault_fails_the_verdict_with_its_check_named(full_dry_run, tmp_path, fault, only, failing,
                                                                status):
    """Faults in a run's outputs are planted in a copy of the whole dry
    run's folder, checked again (``--recheck``: the run is not started
    twice); a fault of the run itself (the orphan) and the skip run it."""
    import shutil

    args = ["--inject", fault, "--only", only]
    if fault in ("missing-trace", "device-before-host"):
        shutil.copytree(full_dry_run[0], tmp_path, dirs_exist_ok=True)
        args.append("--recheck")
    proc, summary = dry(tmp_path, *args)
    assert all(r.get("rechecked") for n, r in summary["runs"].items() if n == only) == ("--recheck" in args)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["verdict"] == "fail"
    assert summary["checks"][failing]["status"] == status, summary["checks"].get(failing)
    if status == "not run":
        assert "budget" in summary["not_run"][failing]
    else:
        assert failing in summary["failed"]
    if fault == "orphan":  # found, named and killed: nothing of the run is left
        assert len(summary["runs"]["r18-plain"]["left_behind"]) == 1
        assert gpu_check.marked_processes("r18-plain") == []
