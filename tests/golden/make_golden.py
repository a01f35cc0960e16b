"""Golden reports: ``report.md`` and ``report.json`` of a few generated
traces, compared exactly by tests/e2e/test_golden.py.

Regenerate (after a change that is meant to change the report):

    .venv/bin/python tests/golden/make_golden.py

Each scenario writes its traces with tests/tracegen.py (deterministic) into
a temporary folder and runs ``commprof report`` there as a user would, with
relative paths, so the outputs hold no machine-specific text."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
sys.path[:0] = [TESTS, ROOT]

import tracegen  # noqa: E402

MS = tracegen.MS
KINETO = os.path.join(TESTS, "data", "kineto", "resnet_nccl_2gpu_rank0.json.gz")


def _ddp2(d):
    """2 DDP ranks, rank 1 arriving 3 ms late at every bucket."""
    tracegen.write_run(os.path.join(d, "ddp2.parquet"),
                       {r: tracegen.ddp_rank(r, 2, 12, arrive_ms=3.0 * r) for r in range(2)})
    return ["ddp2.parquet"]


def _study(d):
    """Two configurations (native, dali loaders) at 1, 2 and 4 GPUs; the
    1-GPU runs are plain (no framework), communication grows with N."""
    paths = []
    for loader, data_ms in (("native", 4), ("dali", 1)):
        for n in (1, 2, 4):
            rows = {r: tracegen.ddp_rank(r, n, 10, data_ms=data_ms, buckets=0 if n == 1 else 2,
                                         bucket_ms=2 * n, arrive_ms=0.5 * r) for r in range(n)}
            meta = {"loader": loader, "framework": "none" if n == 1 else "ddp"}
            name = f"{loader}{n}.parquet"
            tracegen.write_run(os.path.join(d, name), rows, meta=meta)
            paths.append(name)
    return paths


def _bcast(d):
    """DDP's per-forward buffer broadcast costing 3 ms of a step."""
    tracegen.write_run(os.path.join(d, "bcast.parquet"),
                       {r: tracegen.ddp_rank(r, 2, 8, bcast_ms=3.0) for r in range(2)})
    return ["bcast.parquet"]


def _kineto(d):
    """The real 2-GPU Kineto fixture (rank 0), imported."""
    subprocess.run([sys.executable, "-m", "commprof", "import", "kineto", KINETO, "-o", "kineto.parquet"],
                   cwd=d, check=True, capture_output=True, env=_env())
    return ["kineto.parquet"]


SCENARIOS = {"ddp2": _ddp2, "study": _study, "bcast": _bcast, "kineto": _kineto}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def render(name: str) -> dict:
    """{file name: text} of one scenario's golden outputs."""
    with tempfile.TemporaryDirectory() as d:
        paths = SCENARIOS[name](d)
        out = {}
        for fmt, fname in (("md", "report.md"), ("json", "report.json")):
            proc = subprocess.run([sys.executable, "-m", "commprof", "report", *paths, "--format", fmt],
                                  cwd=d, capture_output=True, text=True, env=_env())
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: commprof report failed: {proc.stderr.strip()}")
            out[fname] = proc.stdout
        return out


def main(dest: str = HERE) -> None:
    for name in SCENARIOS:
        folder = os.path.join(dest, name)
        os.makedirs(folder, exist_ok=True)
        for fname, text in render(name).items():
            with open(os.path.join(folder, fname), "w") as fh:
                fh.write(text)
        print(f"wrote {folder}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else HERE)
