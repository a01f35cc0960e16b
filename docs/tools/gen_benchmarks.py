"""Writes docs/benchmarks.md from the newest result of each benchmark
(``benchmarks/results/<benchmark>/<date>-<commit>[-variant].<ext>``), so
the page cannot disagree with its files; tests/e2e/test_docs.py checks it
is current.

    python docs/tools/gen_benchmarks.py            # rewrite docs/benchmarks.md
    python docs/tools/gen_benchmarks.py --check    # exit 1 if it differs
"""
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.dirname(HERE)
ROOT = os.path.dirname(DOCS)
RESULTS = os.path.join(ROOT, "benchmarks", "results")
NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-([0-9a-f]{7,40})(?:-(.+))?\.(md|txt)$")

#: benchmark -> what it measures (one line); the order of the page
WHAT = {
    "overhead_paired": "recording overhead per step, recording switched on and off inside one run (paired blocks)",
    "overhead": "recording overhead per step, separate interleaved runs",
    "hook_cost": "where a DDP step's recording cost goes (per instrument, per hook path)",
    "report_speed": "`commprof report` of a large multi-host trace vs a bare scan of its columns",
    "export_speed": "`commprof export chrome` of a large trace",
    "kineto_speed": "`commprof import kineto` + report vs Holistic Trace Analysis",
    "findings_power": "the findings' false-accusation rate and detection limit",
    "collmodel_logs": "the collective cost model fitted on real 2-node nccl-tests logs, predicting 4 and 8 nodes",
    "failure_repeat": "a job that dies, recorded repeatedly: the failure named every time",
    "predict_validate": "`commprof predict --validate` on the one-machine cluster (shaped links)",
    "lr_study": "the learning-rate scaling study of workloads/lr_study.py",
    "demo": "`make demo`: the README's bottleneck table",
    "bench": "`commprof bench` on this machine's CPU ranks (gloo): the nccl-tests table and the alpha-beta fit",
    "native_build": "building the native DDP hooks (what `commprof record` does once per torch version)",
    "gpu_check": "the GPU check (tests/gpu/gpu_check.py) on a GPU machine: its checks, and the recording "
                 "overhead on the GPU",
    "shaped_links": "the one-machine cluster's shaped links (network namespaces, tc): the bench's fitted bandwidth "
                    "against the link rate, the cost model fitted at 2-4 nodes predicting 8",
}


def results():
    out = {}
    for bench in sorted(os.listdir(RESULTS)):
        folder = os.path.join(RESULTS, bench)
        if not os.path.isdir(folder):
            continue
        files = []
        for f in sorted(os.listdir(folder)):
            m = NAME.match(f)
            if m:
                files.append((m.group(1), m.group(2), m.group(3) or "", f))
        if files:
            out[bench] = files
    return out


#: benchmark -> what runs it, where that is not a script of benchmarks/ or workloads/ nor `commprof <benchmark>`
COMMAND = {
    "demo": "`make demo` (the exact commands in each file)",
    "native_build": "`commprof.record.native.build()` timed (the exact command in each file)",
    "shaped_links": "the cluster tests that measure them, with `pytest -s` (the exact command in each file)",
    "gpu_check": "`python3 tests/gpu/gpu_check.py` on the GPU machine (the exact commands in each file)",
}


def _script(bench: str) -> str:
    for folder in ("benchmarks", "workloads"):
        if os.path.exists(os.path.join(ROOT, folder, bench + ".py")):
            return f"Script: `{folder}/{bench}.py`"
    return "Command: " + COMMAND.get(bench, f"`commprof {bench}` (the exact command in each file)")


def _commit_time(commit: str) -> int:
    """When a result's commit was made (newest first on the page); 0 where
    git does not know it."""
    import subprocess

    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", commit], cwd=ROOT, capture_output=True,
                             text=True, timeout=30)
        return int(out.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def _demote(text: str) -> str:
    lines = []
    fence = False
    for line in text.rstrip().split("\n"):
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"^#{1,4} ", line):
            line = "###" + line.lstrip("#").rstrip() if line.startswith("# ") else "##" + line
        lines.append(line)
    return "\n".join(lines)


def render() -> str:
    out = ["# Benchmarks", "",
           "Generated from `benchmarks/results/` by `python docs/tools/gen_benchmarks.py`: for each benchmark the",
           "newest result files as they were written (command, date, commit and machine in each; the newest commit",
           "first), then the older",
           "ones by name. Machine, unless a file says otherwise: the 2-core, 24 GiB CI VM without a GPU, torch",
           "2.14.1, gloo. Speed and memory goals are met here, not in timed unit tests.", ""]
    res = results()
    order = [b for b in WHAT if b in res] + [b for b in res if b not in WHAT]
    for bench in order:
        files = res[bench]
        newest = max(d for d, _, _, _ in files)
        out += [f"## {bench}", "", WHAT.get(bench, ""), "",
                _script(bench), ""]
        for d, c, variant, f in sorted(files, key=lambda x: (x[0], _commit_time(x[1]), x[3]), reverse=True):
            if d != newest:
                continue
            out += [f"### {d}, commit {c}" + (f" ({variant})" if variant else ""), "",
                    f"`benchmarks/results/{bench}/{f}`", ""]
            with open(os.path.join(RESULTS, bench, f), encoding="utf-8") as fh:
                text = fh.read()
            out += ([_demote(text)] if f.endswith(".md") else ["```", text.rstrip(), "```"]) + [""]
        older = [f for d, _, _, f in files if d != newest]
        if older:
            out += ["Older results: " + ", ".join(f"`{f}`" for f in older) + ".", ""]
    return "\n".join(out).rstrip() + "\n"


def main():
    from page import main as write_page

    write_page(os.path.join(DOCS, "benchmarks.md"), render, "python docs/tools/gen_benchmarks.py")


if __name__ == "__main__":
    main()
