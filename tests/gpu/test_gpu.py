"""GPU checks (skipped without CUDA): run tests/gpu/gpu_check.py briefly."""
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_gpu_check(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "gpu_check.py")
    # the check's own budget stops starting runs after 300 s; each run has its own timeout
    proc = subprocess.run([sys.executable, script, "--steps", "20", "--budget-s", "300",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
