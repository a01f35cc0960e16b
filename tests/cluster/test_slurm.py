"""commprof under a real (local, one-node) SLURM: srun inside commprof
record, and commprof record inside srun (one per task, one shared folder);
a sweep's cells as SLURM jobs; Kineto traces imported by Dask workers that
srun started. Every test on the session's SLURM is in this file: a file
runs on one worker of the suite, so the SLURM daemons are started once
and used by one test at a time (tests/conftest.py)."""
import json
import os
import sys

import pytest

import commprof
from helpers import ROOT, columns_of, commprof_cmd, documented_record, documented_scaled, run, venv_env

pytestmark = pytest.mark.slow

PY = sys.executable
MULTI = os.path.join(ROOT, "tests", "workloads", "multinode.py")
KINETO = os.path.join(ROOT, "tests", "data", "kineto")


def test_record_around_srun(local_slurm, tmp_path):
    """Pattern (a), as the multi-node guide shows it: inside an allocation
    (salloc; here 2 tasks on the one node), one commprof record on the
    launch node around srun; the ranks come from SLURM_PROCID (the script
    maps them for env://)."""
    out = str(tmp_path / "rec")
    env = local_slurm.env(venv_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29711"}))
    options, cmd = documented_record("docs/multi-node.md", "srun python train.py", script=[MULTI, "--steps", "6"])
    proc = run(["salloc", "-n", "2", *commprof_cmd("record", "-o", out, *options, "--", *cmd)], env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = commprof.load(out)
    assert t.meta["world_size"] == 2 and t.meta["ranks_recorded"] == 2
    assert t.meta["launcher"] == "srun"
    assert sorted(m["rank"] for m in t.ranks) == [0, 1]
    assert all(m["node_rank"] == 0 for m in t.ranks)       # SLURM_NODEID
    jobs = {m["slurm_job_id"] for m in t.ranks}
    assert len(jobs) == 1 and jobs.pop().isdigit()
    assert t.report().tables["breakdown"].frame["gpus"].tolist() == [2]


def test_record_around_srun_that_allocates_its_own_job(local_slurm, tmp_path):
    """The README's and the recording guide's srun example (64 tasks there,
    2 on this one node): srun outside any allocation makes its own job;
    every task is a rank of the record."""
    out = str(tmp_path / "rec")
    env = local_slurm.env(venv_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29713"}))
    words = documented_scaled("README.md", "srun -n 64 python train.py", "2 tasks on one node",
                              values={"-n": 2}, outputs={"run": out}, script=[MULTI, "--steps", "6"])
    assert documented_scaled("docs/recording.md", "srun -n 64 python train.py", "2 tasks on one node",
                             values={"-n": 2}, outputs={"run5": out}, script=[MULTI, "--steps", "6"]) == words
    proc = run(commprof_cmd(*words), env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = commprof.load(out)
    assert t.meta["world_size"] == 2 and t.meta["ranks_recorded"] == 2 and t.meta["launcher"] == "srun"
    assert len({m["slurm_job_id"] for m in t.ranks}) == 1


def test_bench_through_srun(local_slurm, tmp_path):
    """`commprof bench -- srun ...` (the README's and the bench guide's
    cluster commands: 16 nodes x 8 tasks there, one node x 2 tasks here):
    the pairs bench and the collective bench take their ranks from srun."""
    env = local_slurm.env(venv_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29715"}))
    js = tmp_path / "pairs.json"
    shape = {"-N": 1, "--ntasks-per-node": 2}
    pairs = ["--iters", "3", "--warmup", "1", "--pairs-bytes", "256K", "--json", js]
    words = documented_scaled("README.md", "--pairs -- srun -N 16", "one node, 2 tasks; sizes of a check",
                              values=shape, add=pairs)
    assert documented_scaled("docs/bench.md", "--pairs -- srun -N 16", "one node, 2 tasks; sizes of a check",
                             values=shape, add=pairs) == words
    proc = run(commprof_cmd(*words), env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(js.read_text())
    assert doc["world_size"] == 2 and {(s["a"], s["b"]) for s in doc["samples"]} == {(0, 1)}
    b = tmp_path / "b.json"
    words = documented_scaled("docs/bench.md", "--max-bytes 4G -- srun", "one node, 2 tasks; sizes of a check",
                              values={"--max-bytes": "64K", **shape}, add=["--iters", "3", "--warmup", "1",
                                                                            "--json", b])
    env["MASTER_PORT"] = "29717"
    proc = run(commprof_cmd(*words), env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(b.read_text())
    assert doc["world_size"] == 2 and max(r["bytes"] for r in doc["rows"]) == 64 * 1024
    assert all(r[m]["wrong"] == 0 for r in doc["rows"] for m in ("out_of_place", "in_place") if r[m])


def test_srun_starts_one_record_per_task_around_torchrun(local_slurm, tmp_path):
    """Pattern (b) under SLURM: srun starts one commprof record per task, each
    around its own torchrun agent (node rank = SLURM_PROCID), all writing one
    folder; the records know from srun that they are two, and the last one
    merges."""
    out = str(tmp_path / "rec")
    env = local_slurm.env(venv_env())
    script = (f'exec {PY} -m commprof record -o {out} -- {PY} -m torch.distributed.run --nnodes 2 '
              f'--node-rank $SLURM_PROCID --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29733 '
              f'{MULTI} --steps 6')
    proc = run(["srun", "-n", "2", "bash", "-c", script], env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("trace.parquet") == 1
    t = commprof.load(out)
    assert t.meta["ranks_recorded"] == 2 and t.meta["world_size"] == 2
    ids = {m["run_id"] for m in t.ranks}
    assert len(ids) == 1 and ids.pop().startswith("slurm-")
    assert sorted(m["node_rank"] for m in t.ranks) == [0, 1]     # torchrun's GROUP_RANK
    assert len({m["record_pid"] for m in t.ranks}) == 2


def test_srun_with_one_folder_per_task_is_reported_as_one_job(local_slurm, tmp_path):
    """Pattern (c) under SLURM: every srun task records into its own folder;
    both derive the run id slurm-JOB.STEP, and the report joins them."""
    env = local_slurm.env(venv_env())
    script = (f'exec {PY} -m commprof record -o {tmp_path}/node$SLURM_PROCID -- {PY} -m torch.distributed.run '
              f'--nnodes 2 --node-rank $SLURM_PROCID --nproc-per-node 1 --master-addr 127.0.0.1 '
              f'--master-port 29755 {MULTI} --steps 6')
    proc = run(["srun", "-n", "2", "bash", "-c", script], env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folders = [str(tmp_path / f"node{k}") for k in range(2)]
    ids = {commprof.load(f).meta["run_id"] for f in folders}
    assert len(ids) == 1 and ids.pop().startswith("slurm-")
    t = commprof.load(folders)
    assert isinstance(t, commprof.api.Trace) and t.meta["ranks_recorded"] == 2
    rep = run(commprof_cmd("report", *folders), env=env)
    assert rep.returncode == 0, rep.stderr
    bd = t.report().tables["breakdown"].frame
    assert len(bd) == 1 and int(bd["gpus"].iloc[0]) == 2


def test_slurm_sweep_one_job_per_cell(local_slurm, tmp_path):
    study = str(tmp_path / "study")
    env = local_slurm.env(venv_env())
    proc = run(commprof_cmd("sweep", "-o", study, "--launcher", "slurm", "--nproc", "1,2", "--gpus-per-node", "2",
                            "--time", "00:05:00", "--cell-timeout", "300",
                            "--", PY, MULTI, "--steps", "5"), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for n in (1, 2):
        with open(os.path.join(study, "default", str(n), "sweep.json")) as fh:
            st = json.load(fh)
        assert st["status"] == "done" and st["launcher"] == "slurm" and st["job_id"].isdigit()
        t = commprof.load(os.path.join(study, "default", str(n)))
        assert t.meta["world_size"] == n and t.meta["launcher"] == "srun"
        assert {m["slurm_job_id"] for m in t.ranks} == {st["job_id"]}
        assert "#SBATCH --ntasks=%d" % n in open(os.path.join(study, "default", str(n), "sweep.sbatch")).read()
    bd = commprof.load(study).report().tables["breakdown"].frame
    assert sorted(bd["gpus"]) == [1, 2]


def test_workers_and_dask_give_the_same_trace_and_report(local_slurm, tmp_path):
    """--workers 2 (processes) and --dask write the same trace as one
    process, and the same report. The Dask side is the GPU guide's recipe on
    the local SLURM: a scheduler writing its file into $HOME, srun starting
    the workers (one node, 2 workers here; 8 nodes there), the guide's
    import command reading the address from that file."""
    import importlib.util
    import subprocess

    import pyarrow.parquet as pq

    from commprof.cli import main

    outs = {}
    for how, extra in (("one", ["--workers", "1"]), ("two", ["--workers", "2"])):
        outs[how] = str(tmp_path / f"{how}.parquet")
        assert main(["import", "kineto", KINETO, "-o", outs[how], *extra]) == 0
    if importlib.util.find_spec("distributed") is None:
        pytest.skip("the 'distributed' package is not installed")
    outs["dask"] = str(tmp_path / "dask.parquet")
    env = local_slurm.env(venv_env({"HOME": str(tmp_path)}))
    sched = str(tmp_path / "sched.json")
    started = [subprocess.Popen(["dask", "scheduler", "--scheduler-file", sched, "--port", "0",
                                 "--dashboard-address", ":0"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        started.append(subprocess.Popen(["srun", "-N", "1", "--ntasks-per-node", "1", "dask", "worker",
                                         "--scheduler-file", sched, "--nworkers", "2", "--nthreads", "1",
                                         "--dashboard-address", ":0"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True))
        line = documented_scaled("docs/gpu.md", "--dask $(python", "one node, 2 workers; the repository's files",
                                 outputs={"/shared/profiles": KINETO, "/shared/trace.parquet": outs["dask"]},
                                 shell=True)
        # the scheduler file exists before the import reads it, as on the launch node
        proc = subprocess.run(["bash", "-c", f"until [ -s {sched} ]; do sleep 0.2; done; {line}"], env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        for p in reversed(started):
            os.killpg(p.pid, 15)
            p.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = columns_of(pq.read_table(outs["one"]))
    ref_rep = commprof.load(outs["one"]).report()
    for how in ("two", "dask"):
        assert columns_of(pq.read_table(outs[how])) == ref
        rep = commprof.load(outs[how]).report()
        for name in ("breakdown", "kernels", "gpu_breakdown", "collectives"):
            a, b = ref_rep.tables[name].frame, rep.tables[name].frame
            a, b = (x.drop(columns=[c for c in ("path",) if c in x]) for x in (a, b))
            assert a.equals(b), name
    assert main(["import", "kineto", KINETO, "-o", str(tmp_path / "x.parquet"), "--workers", "0"]) == 2
