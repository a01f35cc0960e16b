"""The GPU features' CPU paths: kernel mode runs torch.profiler on the
chosen steps and merges its trace; telemetry without NVML says so once and
records nothing; without CUDA no device times are claimed."""
import sys

import pytest

from commprof import assemble
from helpers import TINY

pytestmark = pytest.mark.slow  # launches training processes

PY = sys.executable


def test_kernel_mode_and_telemetry_without_a_gpu(record):
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", "6"], "--kernels", "2:2", "--telemetry", "on", "--keep-shards")
    assert proc.returncode == 0, proc.stderr
    run = assemble.load(out)
    assert run.meta["kernel_window"] == [2, 4]
    import os

    kin = [f for f in os.listdir(os.path.join(out, "shards")) if f.startswith("kineto.")]
    assert len(kin) == 2  # one torch.profiler trace per rank, merged (no GPU kernels on CPU)
    ev = run.table.to_pandas()
    assert not (ev["category"] == "kernel").any()
    assert (ev[ev["category"] == "step"].groupby("rank").size() == 6).all()
    # telemetry: one line per rank, no samples
    lines = [ln for ln in proc.stderr.splitlines() if "GPU telemetry off" in ln]
    assert len(lines) == 2
    assert not ev["name"].astype(str).str.startswith("gpu.").any()
    # no CUDA: no device times claimed
    assert ev["dev_start"].isna().all()
    # the training itself is unchanged
    assert len(proc.results[0]["losses"]) == 6


def test_bad_kernel_window(record):
    proc, _ = record([PY, TINY], "--kernels", "x:y")
    assert proc.returncode == 2 and "--kernels expects START:COUNT" in proc.stderr
