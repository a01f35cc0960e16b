"""commprof owns one top-level import name: a fresh (non-editable) install
has ``commprof.analyzers`` and no ``analyzers``."""
import os
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow
def test_fresh_install_has_commprof_analyzers_only(tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), ROOT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    top = sorted(p for p in os.listdir(target) if not p.endswith((".dist-info", ".egg-info")) and p != "bin")
    assert top == ["commprof"], top
    assert os.path.isfile(target / "commprof" / "analyzers" / "scaling.py")
    # the native process-group hooks' source ships, so an installed commprof can build them
    assert os.path.isfile(target / "commprof" / "record" / "_pghooks.cpp")
    env = {"PYTHONPATH": str(target), "PATH": os.environ["PATH"], "PYTHONNOUSERSITE": "1"}
    code = ("import commprof.analyzers, commprof.analyzers.scaling, commprof.render\n"
            "assert commprof.analyzers.__file__.startswith({t!r}), commprof.analyzers.__file__\n"
            "try:\n    import analyzers\nexcept ImportError:\n    print('no analyzers')\n"
            "else:\n    print('analyzers at', analyzers.__file__)\n").format(t=str(target))
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r})\n" + code],
                         capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "no analyzers"
