"""``commprof sweep``: a study run cell by cell under ``commprof record``
(locally here; as SLURM jobs on the real local SLURM in
tests/cluster/test_slurm.py), resumable, surviving
failing cells, and ``commprof report STUDY/`` over the result."""
import json
import os
import re
import sys

import pytest

import commprof
from helpers import ROOT, commprof_cmd, documented_scaled, run

PY = sys.executable
TINY = os.path.join(ROOT, "tests", "workloads", "tiny.py")
MULTI = os.path.join(ROOT, "tests", "workloads", "multinode.py")


def _state(study, cell):
    with open(os.path.join(study, cell, "sweep.json")) as fh:
        return json.load(fh)


def test_dry_run_prints_cells_and_job_scripts(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(f'''
output = "{tmp_path / 'study'}"
command = "{{launch}} {MULTI} --steps 4"
nproc = [1, 4, 8]
launcher = "slurm"
gpus_per_node = 4
[vary.framework]
ddp = {{launch = "srun --ntasks={{nproc}} python"}}
[vary]
loader = ["native", "dali"]
[slurm]
partition = "gpu"
time = "00:10:00"
request_gpus = true
''')
    proc = run(commprof_cmd("sweep", str(plan), "--dry-run", "--pairs"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("#!/bin/bash") == 7 and not (tmp_path / "study").exists()
    # first the pairs bench, over the largest cell's nodes
    first = out.split("# pairs (would run)")[1].split("\n# framework")[0]
    assert out.index("# pairs (would run)") < out.index("# framework")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "bench --pairs --json",
                 os.path.join(str(tmp_path / "study"), "pairs", "pairs.json"), "-- srun --ntasks 8"):
        assert line in first, (line, first)
    block = out.split("# framework-ddp_loader-dali/8 (would run)")[1].split("\n# framework")[0]
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks=8", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu", "#SBATCH --time=00:10:00",
                 "srun --ntasks=8 python"):
        assert line in block, (line, block)
    assert "--label" not in block  # framework and loader are detected by the recorder, not labels
    # an unknown placeholder is a one-line error
    proc = run(commprof_cmd("sweep", "--nproc", "1,2", "--dry-run", "--", PY, TINY, "--hidden", "{width}"))
    assert proc.returncode == 2 and "unknown placeholder {width}" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_plan_reads_every_field_from_toml_and_the_command_line_on_top(tmp_path):
    """Every Plan field is a TOML key (one table, commprof/sweep.py); the
    command line overrides or extends; a value of the wrong kind is a
    one-line UsageError naming its key."""
    import dataclasses

    from commprof import sweep
    from commprof.errors import UsageError

    plan = tmp_path / "plan.toml"
    plan.write_text('''command = "python train.py"
nproc = "1,2"
output = "s"
launcher = "slurm"
gpus_per_node = 4
record_args = ["--hang-timeout", "60"]
cell_timeout = 30
pairs = true
[vary]
loader = ["native", "dali"]
[slurm]
partition = "gpu"
''')
    got = sweep.load_plan(str(plan), nproc="8", record_args=["--ring-size", "64"], time="00:05:00")
    assert {f.name for f in dataclasses.fields(sweep.Plan)} == set(sweep._FROM_TOML)
    assert (got.command, got.nproc, got.output, got.launcher, got.gpus_per_node) == \
        ("python train.py", [8], "s", "slurm", 4)
    assert got.record_args == ["--hang-timeout", "60", "--ring-size", "64"] and got.cell_timeout == 30.0
    assert got.pairs and list(got.vary) == ["loader"] and got.slurm == {"partition": "gpu", "time": "00:05:00"}
    plan.write_text('command = "x"\ngpus_per_node = "four"\n')
    with pytest.raises(UsageError, match="gpus_per_node = 'four'"):
        sweep.load_plan(str(plan))


@pytest.mark.slow
def test_local_sweep_resumes_and_survives_a_failing_cell(tmp_path):
    """The README's sweep command (a plan file and -o), the plan a small
    model's, the varied values given on the command line on top."""
    study, plan = str(tmp_path / "study"), tmp_path / "study.toml"
    plan.write_text(f'command = "{PY} {TINY} --steps 5 --hidden {{hidden}}"\nnproc = "1,2"\npairs = true\n')
    args = commprof_cmd(*documented_scaled("README.md", "sweep study.toml", "a small model's plan",
                                           outputs={"study.toml": plan, "study": study},
                                           add=["--vary", "hidden=64,x"]))
    proc = run(args, timeout=400)
    assert proc.returncode == 1, proc.stdout + proc.stderr      # a cell failed; the others ran
    # the pairs bench first (2 ranks on this one node: one pair), its finding in the summary and the report
    assert re.search(r"pairs\s+done", proc.stdout), proc.stdout
    assert "Node pairs (" in proc.stdout and "two ranks: not attributable" in proc.stdout, proc.stdout
    assert os.path.isfile(os.path.join(study, "pairs", "pairs.html"))
    assert re.search(r"hidden-x/1\s+failed", proc.stdout) and re.search(r"hidden-x/2\s+failed", proc.stdout)
    assert re.search(r"hidden-64/1\s+done", proc.stdout) and re.search(r"hidden-64/2\s+done", proc.stdout)
    assert _state(study, "hidden-64/2")["status"] == "done"
    assert "invalid int value" in open(os.path.join(study, "hidden-x", "1", "sweep.log")).read()
    # the study report at the end: one configuration at 1 and 2 GPUs (N = 1: a plain process)
    assert "Side by side" in proc.stdout
    c = commprof.load(study)
    bd = c.report().tables["breakdown"].frame
    assert sorted(bd["gpus"]) == [1, 2] and bd["config"].nunique() == 1
    finds = c.report().tables["bottlenecks"].frame
    assert (finds["config"] == "bench --pairs").sum() == 1, finds
    # resume: complete cells are skipped (not rerun), failed ones retried, their attempt kept aside
    before = os.path.getmtime(os.path.join(study, "hidden-64", "2", "trace.parquet"))
    proc = run(args, timeout=400)
    assert proc.returncode == 1
    assert re.search(r"hidden-64/1\s+skipped \(complete\)", proc.stdout)
    assert re.search(r"pairs\s+skipped \(complete\)", proc.stdout)
    assert re.search(r"hidden-64/2\s+skipped \(complete\)", proc.stdout)
    assert os.path.getmtime(os.path.join(study, "hidden-64", "2", "trace.parquet")) == before
    assert os.path.isdir(os.path.join(study, "hidden-x", "1.failed-1"))
    # commprof report STUDY/ reads every complete cell
    proc = run(commprof_cmd("report", study, "--table", "study", "--format", "csv"))
    assert proc.returncode == 0, proc.stderr
    assert [line.split(",")[0] for line in proc.stdout.strip().split("\n")[1:]] == ["1", "2"]
