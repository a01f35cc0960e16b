"""Every ``commprof ...`` command the README and the user guide show is
checked against the real command line: each one parses with commprof's own
parser (its subcommand, options and choices exist), a synopsis line names a
subcommand that exists, and every command that reads traces, logs or
profiler files runs and exits 0: report, export, diff, predict, model,
merge and import, on traces written here (``run``, ``run1`` ... stand for a
4-rank DDP run; ``run2`` / ``run4`` / ``run8`` for runs at those GPU counts;
``ddp/``, ``hvd/``, ``ds/`` for runs of those frameworks; a study of
runs at 2, 4 and 8 ranks for benchmarks/predict_validate.py's; a folder of
unmerged shards for ``merge``), Kineto files written by
benchmarks/kineto_gen.py, and the repository's nccl-tests logs for the
user's. The quick start's record command and those of the recording,
frameworks, failures and multi-node guides run in the end-to-end tests that record such jobs, as the docs show them
(``helpers.documented_record``: the user's script replaced by a test
workload); the srun examples, the bench commands, the README's sweep and
the multi-node guide's by-hand cluster command, the Dask recipe, the
ResNet-50 run and the ResNet sweep run at a size this machine holds
(``helpers.documented_scaled``: option values, outputs and added
arguments given in the call, with why). A command that launches ranks
and runs in no test fails."""
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers import ROOT, documented, strip_comment as _strip_comment, venv_env

sys.path.insert(0, os.path.join(ROOT, "tests"))
import tracegen  # noqa: E402

#: names the docs use for a recorded run; the test writes one trace and gives it every name
RUN_NAMES = ("run", "run1", "run_a", "run_b", "trace.parquet")
#: names of runs at a GPU count (their traces have that many ranks)
SIZED_RUNS = {"run2": 2, "run4": 4, "run8": 8}
#: studies benchmarks/predict_validate.py writes (real ResNet runs at 1 to 8 ranks): here a study
#: of synthetic runs at 2, 4 and 8 ranks stands for them
STUDIES = ("/tmp/commprof-predict-validate/resnet50", "/tmp/commprof-predict-validate/resnet18")
#: names of runs of one framework
FRAMEWORK_RUNS = {"ddp/": "ddp", "hvd/": "horovod", "ds/": "deepspeed"}
#: the user's files the docs name, and what stands for them here
USER_FILES = {"all_reduce_perf.log": os.path.join("tests", "fixtures", "nccl-tests",
                                                  "nccltests309-gjaion_2n_16g_allreduce.log")}
#: what launches ranks or training: run by the tests that record, benchmark or sweep such jobs
LAUNCHES = re.compile(r"^commprof (record|sweep|bench)\b")


def _is_synopsis(cmd: str) -> bool:
    return "[" in cmd.replace("$(", "") and "$(" not in cmd or "..." in cmd


COMMANDS = documented()


def test_the_docs_show_commands_at_all():
    assert len(COMMANDS) >= 30 and any(w.startswith("README.md") for w, _ in COMMANDS)


@pytest.mark.parametrize("where, cmd", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_documented_command_parses(where, cmd):
    from commprof.cli import build_parser

    parser = build_parser()
    cmd = _strip_comment(cmd)
    subcommands = set(parser._subparsers._group_actions[0].choices)   # type: ignore[union-attr]
    words = shlex.split(re.sub(r"\$\(.*\)", "X", cmd))      # a shell substitution: one word
    assert words[1] in subcommands, f"{where}: no subcommand {words[1]!r}"
    if _is_synopsis(cmd):
        return
    argv = words[1:]
    if argv[0] == "sweep" and "--" in argv:
        argv = argv[:argv.index("--")]
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `{cmd}` does not parse (exit {exc.code})")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """What the docs' commands read, written once: a 4-rank DDP trace under
    every name the docs give a run; runs at 2, 4 and 8 GPUs; a DDP, a
    Horovod and a DeepSpeed run; PyTorch profiler traces (Kineto JSON, two
    ranks, benchmarks/kineto_gen.py)."""
    d = tmp_path_factory.mktemp("docs")
    path = d / "demo.parquet"
    tracegen.write_run(path, {r: tracegen.ddp_rank(r, 4, 12, arrive_ms=r * 0.5) for r in range(4)})
    names = {name: str(path) for name in RUN_NAMES}
    for name, n in SIZED_RUNS.items():
        names[name] = tracegen.write_run(d / f"{name}.parquet",
                                         {r: tracegen.ddp_rank(r, n, 12, arrive_ms=r * 0.2) for r in range(n)})
    for n in SIZED_RUNS.values():
        os.makedirs(d / "study" / str(n))
        tracegen.write_run(d / "study" / str(n) / "trace.parquet",
                           {r: tracegen.ddp_rank(r, n, 12, arrive_ms=r * 0.2) for r in range(n)})
    names.update({name: str(d / "study") for name in STUDIES})
    for name, fw in FRAMEWORK_RUNS.items():
        names[name] = tracegen.write_run(d / f"{fw}.parquet", {r: tracegen.ddp_rank(r, 2, 12) for r in range(2)},
                                         meta={"framework": fw})
    kin = d / "kineto"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "kineto_gen.py"), str(kin), "--ranks", "2",
                    "--kernels", "400", "--steps", "3"], check=True, stdout=subprocess.DEVNULL, timeout=120)
    names["rank*.json.gz"] = str(kin / "rank*.json.gz")
    names.update({k: os.path.join(ROOT, v) for k, v in USER_FILES.items()})
    return names


def _unmerged(folder) -> str:
    """A recording folder holding its ranks' shards, not merged yet (4 ranks
    on one host, benchmarks/synth.py's shape)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from synth import write

    write(str(folder), 4, 20)
    return str(folder)


def _claims(function):
    """{page:line: test file} of the commands a test runs through
    ``helpers.<function>(page, text, ...)``: ``documented_record``, a record
    command as the docs show it (the user's script replaced by a test
    workload, the output folder the test's); ``documented_scaled``, any
    command at a size this machine holds (option values, outputs and added
    options given in the call, with why)."""
    call = re.compile(function + r'\(\s*"([^"]+)",\s*"([^"]+)"')
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True)):
        for page, text in call.findall(open(path).read()):
            where = [w for w, c in COMMANDS if w.startswith(page + ":") and text in c
                     and (function != "documented_record" or c.startswith("commprof record "))]
            assert len(where) == 1, f"{os.path.relpath(path, ROOT)}: {page} {text!r} names {len(where)} commands"
            found[where[0]] = os.path.relpath(path, ROOT)
    return found


#: run as written (script and output folder the test's)
CLAIMED = _claims("documented_record")
#: run scaled to this machine
SCALED = _claims("documented_scaled")


def _runnable():
    out = []
    for where, cmd in COMMANDS:
        cmd = _strip_comment(cmd)
        if _is_synopsis(cmd) or where in CLAIMED or where in SCALED or LAUNCHES.search(cmd):
            continue
        out.append((where, cmd))
    return out


RUNNABLE = _runnable()


def test_record_commands_run_as_documented_by_their_tests():
    """Each page whose record commands a test runs as written (the
    README's quick start, the recording, frameworks, failures and
    multi-node guides) has them claimed, and every claim names one
    command."""
    pages = {w.split(":")[0] for w in CLAIMED}
    assert {"README.md", "docs/index.md", "docs/recording.md", "docs/frameworks.md", "docs/failures.md",
            "docs/multi-node.md"} <= pages, CLAIMED
    assert len(CLAIMED) >= 10, CLAIMED
    # at a size this machine holds: the srun examples, every bench command but none, the README's sweep
    assert {"README.md", "docs/recording.md", "docs/bench.md", "docs/multi-node.md"} <= \
        {w.split(":")[0] for w in SCALED}, SCALED
    assert len(SCALED) >= 11 and not set(SCALED) & set(CLAIMED), SCALED


def test_every_documented_command_runs_and_the_quick_start_does():
    """Every concrete command of the README and the guides runs in a test:
    here on the demo traces, or (what launches ranks) as written or scaled
    by the test that records, benchmarks or sweeps such a job."""
    ran = {c for _, c in RUNNABLE}
    assert "commprof report run" in ran                       # the README's second command
    assert any(c.startswith("commprof model tests/fixtures/") for c in ran)
    for sub in ("model", "predict", "import", "merge", "export", "diff"):    # every command that reads files
        assert any(c.startswith(f"commprof {sub} ") for c in ran), sub
    for where, cmd in COMMANDS:
        cmd = _strip_comment(cmd)
        if _is_synopsis(cmd) or cmd in ran:
            continue
        assert where in CLAIMED or where in SCALED, f"{where}: `{cmd}` runs in no test"


@pytest.mark.parametrize("where, cmd", RUNNABLE, ids=[w for w, _ in RUNNABLE])
def test_documented_commands_run(where, cmd, demo, tmp_path):
    words = shlex.split(cmd)[1:]
    out = []
    for w in words:
        if words[0] == "merge" and w in RUN_NAMES:
            out.append(_unmerged(tmp_path / "unmerged"))
        elif w in demo or w.rstrip("/") in demo:
            out.append(demo.get(w) or demo[w.rstrip("/")])
        elif w.endswith((".html", ".json", ".gz", ".parquet")) and not os.path.exists(os.path.join(ROOT, w)):
            out.append(str(tmp_path / os.path.basename(w)))      # an output file: written here
        else:
            out.append(w)
    line = shlex.join([sys.executable, "-m", "commprof", *out])
    # globs in the docs (nccl-tests logs) are the shell's: run through bash, from the repository root
    proc = subprocess.run(["bash", "-c", line.replace("'", "") if "*" in line else line], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=venv_env())
    assert proc.returncode == 0, f"{where}: `{cmd}`\n{proc.stderr[-2000:]}"
    wrote = [w for w in out if w.startswith(str(tmp_path)) and os.path.exists(w)
             and (os.path.isfile(w) or os.path.exists(os.path.join(w, "trace.parquet")))]
    assert proc.stdout.strip() or wrote, where
