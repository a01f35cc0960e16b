"""What the tests share besides fixtures: the repository's paths, the
environment a launched process gets, and ways to run commprof and read a
workload's results, the commands the docs show. Fixtures stay in conftest.py."""
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "workloads", "tiny.py")


def venv_env(extra=None):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("COMMPROF_OUT_DIR", None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # a native crash (SIGABRT, SIGSEGV) prints every thread's Python stack
    env["PYTHONFAULTHANDLER"] = "1"
    # DeepSpeed JIT-compiles an op on first use: kept with the environment (make install builds it)
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    if extra:
        env.update(extra)
    return env


#: the lines of a crashed process's stderr that say why (faulthandler's
#: stacks, C++'s terminate, gloo's and c10's errors)
_CRASH = re.compile(r"Fatal Python error|terminate called|what\(\)|Thread 0x|Current thread|^\s+File \"|"
                    r"EnforceNotMet|c10::Error|Segmentation fault|Aborted")


def why_failed(proc, tail=2000):
    """A failed process's stderr for an assertion: the lines that say why
    it crashed, wherever they are (a torchrun job's summary pushes them far
    from the end), then its last ``tail`` characters."""
    err = proc.stderr or ""
    crash = [line for line in err.splitlines() if _CRASH.search(line)][:60]
    return ("\n".join(crash) + "\n...\n" if crash else "") + err[-tail:]


def commprof_cmd(*args):
    return [sys.executable, "-m", "commprof", *args]


def run(cmd, timeout=240, env=None, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env or venv_env(), cwd=ROOT, **kw)


def results(folder):
    """The tiny workload's per-rank results (``--result-dir``), by rank."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as fh:
                r = json.load(fh)
            out[r["rank"]] = r
    return out


def run_in_pty(cmd, columns=100, env=None, timeout=240):
    """Run ``cmd`` with stdout and stderr on a real pseudo-terminal of
    ``columns`` columns (what a person at a terminal sees); returns
    (exit code, everything written, ANSI escapes included)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time as _time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = dict(env or venv_env())
    env.pop("COLUMNS", None)
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True, env=env, cwd=ROOT)
    os.close(slave)
    out, deadline = b"", _time.monotonic() + timeout
    try:
        while _time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(), out.decode("utf-8", "replace")


# -- the commands the docs show ----------------------------------------------
#: pages whose commands are checked (the CLI reference is generated from the parser itself)
PAGES = ["README.md"] + sorted(p for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
                               if os.path.basename(p) not in ("cli.md", "benchmarks.md", "changelog.md"))
#: the user's scripts the docs' commands name, which a test replaces by one of its own
DOC_SCRIPTS = ("train.py", "train_hvd.py", "train_ds.py", "train_with_dali.py", "train_with_mp_spawn.py")


def documented(pages=None):
    """(page:line, command) of every commprof command in a shell block of
    ``pages`` (paths from the repository root; default PAGES), and in the
    example column of the README's table of commands."""
    out = []
    for page in [os.path.join(ROOT, p) for p in pages] if pages else PAGES:
        lines = open(page).read().splitlines()
        inside, lang, i = False, "", 0
        while i < len(lines):
            m = re.match(r"^\s*```(\w*)", lines[i])
            if m:
                inside, lang = not inside, m.group(1)
            elif inside and lang in ("sh", "bash", "shell", "console", ""):
                s = lines[i].strip()
                s = s[2:] if s.startswith("$ ") else s
                if s.startswith("commprof "):
                    where = f"{os.path.relpath(page, ROOT)}:{i + 1}"
                    while s.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        s = s[:-1] + " " + lines[i].strip()
                    out.append((where, s))
            elif not inside and lines[i].startswith("|") and page.endswith("README.md"):
                # the example column of the README's table of commands
                for m in re.finditer(r"`(commprof [^`]+)`", lines[i].split("|")[-2] if lines[i].count("|") > 2 else ""):
                    out.append((f"{os.path.relpath(page, ROOT)}:{i + 1}", m.group(1)))
            i += 1
    return out


def strip_comment(cmd: str) -> str:
    return re.sub(r"\s+#\s.*$", "", cmd).strip()


def documented_record(page, contains, script=None):
    """The ``commprof record`` command that ``page`` shows containing
    ``contains`` (exactly one), as (record options, command): the test
    runs what the docs show, its output folder given by the test, the
    user's script (one of DOC_SCRIPTS) replaced by ``script`` (a list: a
    test workload and its arguments). tests/e2e/test_doc_commands.py finds
    these calls and counts their commands as run."""
    import shlex

    found = [c for _, c in documented([page]) if c.startswith("commprof record ") and contains in c]
    assert len(found) == 1, f"{page}: {len(found)} record commands contain {contains!r}"
    words = shlex.split(strip_comment(found[0]))
    sep = words.index("--")
    options, cmd = words[2:sep], words[sep + 1:]
    if "-o" in options:
        i = options.index("-o")
        del options[i:i + 2]
    return options, _with_script(cmd, script, f"{page}: {found[0]!r}")


def _with_script(words, script, what):
    """``words`` with the user's script (one of DOC_SCRIPTS) replaced by
    ``script`` (a list); without ``script``, asserts there is none."""
    users = [w for w in words if w in DOC_SCRIPTS]
    if script is None:
        assert not users, f"{what} names the user's script {users[0]}: give one"
        return words
    assert len(users) == 1, f"{what} names no user's script to replace"
    i = words.index(users[0])
    return words[:i] + list(script) + words[i + 1:]


def documented_scaled(page, contains, why, *, script=None, values=None, outputs=None, add=(), after=(),
                      shell=False):
    """The ``commprof ...`` command that ``page`` shows containing
    ``contains`` (exactly one), as the words after ``commprof``, run at a
    size this machine holds: ``values`` gives an option's value here
    ({option: value}, the option's first occurrence: ``-n 64`` becomes
    ``-n 2``), ``outputs`` the files and folders the command writes
    ({the docs' name: the test's path}), ``add`` options placed before the
    launcher's ``--`` (sizes, iterations), ``after`` arguments appended to
    the training command (its steps and image size), ``script`` stands for the user's
    script (one of DOC_SCRIPTS); ``shell``: the command line for bash (its
    ``$(...)`` kept), outputs replaced only. ``why`` says what the
    substitutions are for. Everything else is as written: the subcommand, its other options,
    the launcher and its options. tests/e2e/test_doc_commands.py finds
    these calls and counts their commands as run, scaled."""
    import shlex

    assert why, "say why the command runs scaled"
    found = [c for _, c in documented([page]) if contains in c]
    assert len(found) == 1, f"{page}: {len(found)} commands contain {contains!r}"
    if shell:       # a command line with the shell's own syntax ($(...)): run by bash, outputs replaced
        assert not (values or add or after or script), "a shell command line takes outputs only"
        line = strip_comment(found[0])
        for name, path in (outputs or {}).items():
            assert re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w/.])", line), f"{page}: {line!r} writes no {name}"
            line = re.sub(rf"(?<![\w/.]){re.escape(name)}(?![\w/.])", str(path), line)
        return line
    words = shlex.split(strip_comment(found[0]))[1:]
    for option, value in (values or {}).items():
        assert option in words, f"{page}: {found[0]!r} has no {option}"
        words[words.index(option) + 1] = str(value)
    for name, path in (outputs or {}).items():      # after the subcommand (`bench -o bench`)
        assert name in words[1:], f"{page}: {found[0]!r} writes no {name}"
        words[words.index(name, 1)] = str(path)
    words = _with_script(words, script, f"{page}: {found[0]!r}")
    sep = words.index("--") if "--" in words else len(words)
    if after:
        assert sep < len(words), f"{page}: {found[0]!r} runs no command to give arguments to"
    return words[:sep] + [str(a) for a in add] + words[sep:] + [str(a) for a in after]


def columns_of(table):
    """An Arrow table as {column: values}, nulls as None: two traces compared
    exactly, column by column."""
    df = table.to_pandas()
    return {c: df[c].astype(object).where(df[c].notna(), None).tolist() for c in df.columns}
