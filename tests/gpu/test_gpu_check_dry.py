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


def _raw(plain, record, plain2, ranks=1):
    """overhead_paired.py's --json: per rank, per arm, (CPU ns, wall ns) per round."""
    arms = {"plain": plain, "record": record, "plain2": plain2}
    return {"ranks": [{"arms": {a: [(w * 1.1, w) for w in v] for a, v in arms.items()}} for _ in range(ranks)]}


def test_paired_overhead_is_the_mean_of_the_rounds_differences():
    """Each round's recorded block against the same round's plain block: a
    drift shared by the blocks of a round cancels; the A/A control and the
    95 % interval beside the figure (block means in ns)."""
    plain = [40e6, 44e6, 48e6, 52e6]                 # the machine slows down through the run
    record = [p + d for p, d in zip(plain, (0.8e6, 1.0e6, 1.2e6, 1.0e6))]
    plain2 = [p + d for p, d in zip(plain, (0.1e6, -0.1e6, 0.0, 0.0))]
    o = gpu_check.paired_overhead(_raw(plain, record, plain2, ranks=2), 3.0)
    assert o["plain_ms"] == pytest.approx(46.0) and o["recorded_ms"] == pytest.approx(47.0)
    assert o["overhead_pct"] == pytest.approx(100 / 46)
    assert o["cpu_overhead_ms"] == pytest.approx(1.1)
    assert o["cpu_overhead_pct"] == pytest.approx(100 / 46)      # 1.1 ms over the plain step's 50.6 ms of CPU
    assert o["judged"] == "overhead_pct"                           # the wall time, unless told otherwise
    assert o["aa_pct"] == pytest.approx(0.0, abs=1e-9)
    # 1.96 x the standard error of (0.8, 1.0, 1.2, 1.0) ms over 46 ms
    assert o["ci95_pct"] == pytest.approx(100 * 1.96 * 0.163299 / 2 / 46, rel=1e-4)
    assert o["rounds"] == 4 and o["ranks"] == 2 and o["bound_pct"] == 3.0
    assert o["decided"] is True                      # 2.17 % +- 0.35 %: below 3 % with its interval
    assert gpu_check.paired_overhead(_raw(plain, record, plain2, ranks=2), 2.3)["decided"] is False
    # two separate runs' medians: their plain / recorded ratio, no interval (a figure only)
    assert gpu_check.run_overhead({"p": 0.046, "r": 0.043}, "p", "r")["overhead_pct"] == pytest.approx(-6.52, abs=0.01)
    assert gpu_check.run_overhead({"p": 0.046, "r": None}, "p", "r") is None


def test_an_overhead_run_that_failed_fails_the_verdict(monkeypatch, tmp_path):
    """An in-process overhead run that timed out (or exited non-zero) has
    no figure: its check is *not run*, naming the run, and the verdict
    fails; one over its bound fails as itself."""
    summary = {"verdict": None, "ok": None, "checks": {}, "runs": {}, "not_run": {}}
    monkeypatch.setattr(gpu_check, "SUMMARY", summary)
    for run in gpu_check.PLANNED_CHECKS:
        summary["runs"][run] = {"rc": 0, "left_behind": []}
        for name in gpu_check.PLANNED_CHECKS[run]:
            summary["checks"][name] = {"status": "pass"}
    del summary["checks"]["overhead r50"]
    summary["runs"]["r50-paired"] = {"rc": "timeout", "left_behind": [], "log": "r50-paired.log"}
    gpu_check.check(str(tmp_path), "overhead r18", False, overhead_pct=12.0, bound_pct=10.0)
    assert gpu_check.verdict(str(tmp_path)) is False
    assert summary["checks"]["overhead r50"]["status"] == "not run"
    assert "r50-paired failed (rc=timeout" in summary["not_run"]["overhead r50"]
    assert summary["failed"] == ["overhead r18"]


@pytest.mark.slow
def test_gpu_check_dry_run_passes_and_writes_its_summary(full_dry_run):
    _, proc, summary = full_dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert summary["verdict"] == "pass" and summary["ok"] is True and summary["dry_run"] is True
    assert summary["plan_total_s"] <= gpu_check.PLAN_LIMIT_S
    assert set(summary["runs"]) == {n for n, _ in gpu_check.PLAN}
    ran = summary["runs"]
    assert all(r["rc"] == 0 and r["left_behind"] == [] for r in ran.values())
    assert summary["not_run"] == {}
    planned = {c for cs in gpu_check.PLANNED_CHECKS.values() for c in cs}
    assert planned <= set(summary["checks"])
    statuses = {n: c["status"] for n, c in summary["checks"].items()}
    assert set(statuses.values()) <= {"pass", "n/a"}, statuses
    # what cannot apply on a CPU says so (and why); the rest ran and passed
    assert {n for n, s in statuses.items() if s == "n/a"} == {
        "telemetry: NVML sampled", "kernel mode: convolution kernels found", "kernel mode: NCCL kernels found"}
    assert set(summary["overhead"]) == set(gpu_check.PAIRED) == {"r50", "r18"}
    for o in summary["overhead"].values():    # the in-process runs' figures, read from their JSON
        assert o["rounds"] == 6 and o["ranks"] == 1 and o["plain_ms"] > 0
        # a dry run holds the CPU time against its bound: the suite's other tests load the machine
        assert o["judged"] == "cpu_overhead_pct" and o["cpu_overhead_pct"] <= o["bound_pct"]
    assert statuses["overhead r50"] == statuses["overhead r18"] == "pass"
    assert set(summary["overhead_runs"]) == {"r50", "r18", "r18 comm-hook"}
    assert all(o["plain_ms"] > 0 and o["recorded_ms"] > 0 for o in summary["overhead_runs"].values())
    for name in ("r18-rec", "r18-rec-hook"):   # both DDP timing points pass the device checks
        assert statuses[f"{name}: device rows"] == "pass", name
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
        assert "sleep 300" in summary["checks"]["no process outlives its run"]["left_behind"]["r18-plain"][0]
        assert gpu_check.marked_processes("r18-plain") == []


def test_a_helper_leaving_just_after_its_run_is_not_left_behind(tmp_path):
    """A helper that exits as its parent does (multiprocessing's resource
    tracker reads EOF, then leaves) is not an orphan; one still there
    after the grace is, and is killed."""
    ok = gpu_check.run(str(tmp_path), "helper", ["sh", "-c", "sleep 0.3 & exit 0"], dict(os.environ), 30)
    left = gpu_check.SUMMARY["runs"]["helper"]
    assert ok and left["left_behind"] == [] and "sleep 0.3" in list(left["exited_late"].values())[0]
    gpu_check.run(str(tmp_path), "stays", ["sh", "-c", "sleep 60 & exit 0"], dict(os.environ), 30)
    stays = gpu_check.SUMMARY["runs"]["stays"]
    assert len(stays["left_behind"]) == 1 and "sleep 60" in stays["left_cmd"][stays["left_behind"][0]]
    assert gpu_check.marked_processes("stays") == []
