"""workloads/resnet.py: every framework and every loader runs 2 ranks on
CPU on the small real dataset and its loss goes down. Each loader runs
under two frameworks and each framework under at least one loader; a
loader sees the framework only through its rank and world size, so the
other six of the twelve pairs add launches, not code paths."""
import json
import os
import sys

import pytest

from helpers import ROOT, run, venv_env

sys.path.insert(0, os.path.join(ROOT, "workloads"))
from make_dataset import make  # noqa: E402

pytestmark = pytest.mark.slow  # launches training processes

PY = sys.executable
RESNET = os.path.join(ROOT, "workloads", "resnet.py")
ARGS = ["--image-size", "32", "--steps", "16", "--lr", "0.2", "--no-val"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("digits"))
    make(out, size=32)
    return out


def launch(framework, zero=0):
    if framework == "horovod":
        return ["horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", PY, RESNET, "--framework", "horovod"]
    cmd = ["torchrun", "--standalone", "--nproc_per_node=2", RESNET, "--framework", framework]
    return cmd + (["--zero-stage", str(zero)] if framework == "deepspeed" else [])


#: (framework, ZeRO stage, loader)
COMBINATIONS = [("ddp", 0, "native"), ("ddp", 0, "dali"), ("horovod", 0, "synthetic"), ("horovod", 0, "dali"),
                ("deepspeed", 0, "native"), ("deepspeed", 2, "synthetic")]


@pytest.mark.parametrize("framework,zero,loader", COMBINATIONS)
def test_combination_trains(framework, zero, loader, data, tmp_path):
    result = tmp_path / "result.json"
    proc = run(launch(framework, zero) + ["--loader", loader, "--data", data, "--result", str(result)] + ARGS,
               timeout=400, env=venv_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(result.read_text())
    assert r["world_size"] == 2 and r["framework"] == framework and r["steps"] == 16
    first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
    assert last < 0.8 * first, r["losses"]


def test_default_run_validates(tmp_path):
    """The recording guide's first command as written: ResNet-18 on
    generated images, one process, the workload's defaults; its per-epoch
    loss, LR, validation accuracy and samples/s land in the trace as
    metrics, and the run is labelled."""
    import commprof
    from helpers import commprof_cmd, documented_record

    options, cmd = documented_record("docs/recording.md", "-- python workloads/resnet.py")
    out = str(tmp_path / "run1")
    proc = run(commprof_cmd("record", "-o", out, *options, "--", *cmd), timeout=400, env=venv_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    t = commprof.load(out)
    assert t.meta["framework"] == "none" and t.meta["world_size"] == 1 and t.meta["model"] == "resnet18"
    ev = t.events()
    m = ev[ev["category"].astype(str) == "metric"].groupby(ev["name"].astype(str))["value"].last()
    assert {"loss", "lr", "top1", "top5", "samples_per_s"} <= set(m.index), m
    assert 0 <= m["top1"] <= m["top5"] <= 100 and m["samples_per_s"] > 0 and m["loss"] > 0


def test_resnet50_records_as_the_guides_show_it(tmp_path):
    """The recording guide's and the GPU guide's ResNet-50 command (4 and 8
    GPUs there; 2 CPU ranks, 3 small steps here): torchrun's ranks recorded,
    the model named, DDP's gradient all_reduces in the report."""
    import commprof
    from helpers import commprof_cmd, documented_scaled

    out = str(tmp_path / "run")
    small = ["--steps", "3", "--image-size", "32", "--samples", "64", "--batch-size", "4", "--no-val"]
    words = documented_scaled("docs/recording.md", "--arch resnet50", "2 CPU ranks, 3 small steps",
                              values={"--nproc_per_node": 2}, outputs={"run2": out}, after=small)
    assert documented_scaled("docs/gpu.md", "--arch resnet50", "2 CPU ranks, 3 small steps",
                             values={"--nproc_per_node": 2}, outputs={"run": out}, after=small) == words
    proc = run(commprof_cmd(*words), timeout=400, env=venv_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = commprof.load(out)
    assert t.meta["world_size"] == 2 and t.meta["ranks_recorded"] == 2 and t.meta["model"] == "resnet50"
    colls = t.report().tables["collectives"].frame
    assert (colls["op"] == "all_reduce").any(), colls
