"""GPU checks (skipped without CUDA): run tests/gpu/gpu_check.py, whose
verdict (every planned check ran and passed) is the test's."""
import json
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_check  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_gpu_check(tmp_path):
    # every run has its own timeout; their sum (the plan) plus the checks' own time bounds the whole
    proc = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check.py"), "--steps", "20",
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=gpu_check.plan_total_s() + 120)
    with open(tmp_path / "gpu_check.json") as fh:
        summary = json.load(fh)
    assert summary["verdict"] == "pass", (summary.get("failed"), summary.get("not_run"), proc.stdout[-4000:])
    assert proc.returncode == 0
