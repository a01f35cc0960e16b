"""The GPU check itself, run on CPU (``--dry-run``: gloo, tiny runs, a
simulated device): the one chance on a borrowed GPU must not be spent on a
bug in the check's own code."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_gpu_check_dry_run_passes_and_writes_its_summary(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "gpu_check.py")
    proc = subprocess.run([sys.executable, script, "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(tmp_path / "gpu_check.json") as fh:
        summary = json.load(fh)
    assert summary["ok"] is True and summary["dry_run"] is True
    assert {"r50-plain", "r50-recorded", "r50-kernels", "r18-plain", "r18-recorded", "r18-recorded-comm-hook",
            "nccl-micro"} <= set(summary["runs"])
    assert all(c["ok"] for c in summary["checks"].values())
    assert "collectives timed on the device" in summary["checks"]
    assert set(summary["overhead"]) == {"r50", "r18", "r18 comm-hook"}
    # both DDP timing points (process-group hooks, timed comm hook) pass the device checks
    for name in ("r18-rec", "r18-rec-hook"):
        assert summary["checks"][f"{name}: device rows"]["ok"], name
    for run in summary["runs"].values():
        assert os.path.exists(run["log"])
