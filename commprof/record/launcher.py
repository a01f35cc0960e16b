"""``commprof record``: run a command unchanged with every Python process it
starts instrumented, then merge the per-rank shards.

Injection is through the environment only (never by rewriting the user's
command): a bootstrap folder with a ``sitecustomize.py`` goes first on
PYTHONPATH, which torchrun, mp.spawn, horovodrun, deepspeed and srun all
pass to their ranks; the settings travel as COMMPROF_* variables *and* as a
JSON file beside sitecustomize.py.

Process handling: the command runs in its own process group, which gets the
terminal when there is one; SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to commprof
are forwarded to that group. When the command ends, stragglers in its group
and rank processes of this run that are still alive are terminated, so no
process is left behind. commprof exits with the command's exit status (and
dies of the same signal if the command did)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

from ..errors import UsageError
from ..trace.journal import HOROVOD_TIMELINE_FILE, find_shards, meta_path_of, side_files
from ..trace.parquet import TRACE_FILE
from . import bootstrap, shared
from .procs import alive as _alive, own_rank_pids
from .config import Config

BOOTSTRAP_DIR = ".bootstrap"


def detect_launcher(cmd: List[str]) -> str:
    exe = os.path.basename(cmd[0])
    if exe in ("torchrun", "horovodrun", "deepspeed", "srun", "mpirun", "mpiexec", "jsrun", "aprun"):
        return {"mpiexec": "mpirun"}.get(exe, exe)
    if exe.startswith("python") or exe.endswith(".py"):
        if "-m" in cmd:
            mod = cmd[cmd.index("-m") + 1] if cmd.index("-m") + 1 < len(cmd) else ""
            if mod in ("torch.distributed.run", "torch.distributed.launch"):
                return "torchrun"
            if mod.startswith("deepspeed"):
                return "deepspeed"
            if mod.startswith("horovod"):
                return "horovodrun"
        return "python"
    return exe


def with_nproc(cmd: List[str], nproc: int) -> List[str]:
    """``--nproc N``: launch the command's script through torchrun."""
    if os.path.basename(cmd[0]).startswith("python") and len(cmd) > 1:
        interpreter, rest = cmd[0], cmd[1:]
    elif cmd[0].endswith(".py"):
        interpreter, rest = sys.executable, cmd
    else:
        raise UsageError(f"--nproc needs a Python script or 'python SCRIPT ...', not {cmd[0]!r}")
    return [interpreter, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}"] + rest


def prepare_out_dir(out_dir: str) -> None:
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f".commprof-probe-{os.getpid()}")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise UsageError(f"output location {out_dir!r} is not writable: {exc.strerror or exc}")
    if os.path.exists(os.path.join(out_dir, TRACE_FILE)) or \
            any(find_shards(os.path.join(out_dir, "shards"))):
        raise UsageError(f"{out_dir!r} already holds a recording; choose another -o")


#: seconds stragglers get between SIGTERM and SIGKILL: the command's own
#: process group, then rank processes of this run still alive
GROUP_GRACE_S, RANK_GRACE_S = 2.0, 5.0


def _reap_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + GROUP_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_ranks(shard_dir: str) -> List[int]:
    """Terminate rank processes of this run (on this host) still alive after
    the command returned, e.g. torchrun workers orphaned by a killed agent."""
    pids = own_rank_pids(shard_dir)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + RANK_GRACE_S
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _package_parent() -> str:
    """The folder that holds the ``commprof`` package (put on the ranks' PYTHONPATH)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(config: Config, boot_dir: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(config.to_env())
    env["COMMPROF_RECORD_PID"] = str(os.getpid())
    parts = [boot_dir, _package_parent()]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def record(cmd: List[str], out_dir: str, options: Optional[Dict[str, Any]] = None, nproc: Optional[int] = None,
           keep_shards: bool = False, horovod_timeline: bool = False, nodes: Optional[int] = None,
           run_id: Optional[str] = None, hang_timeout: float = 0.0, hang_kill: bool = False) -> int:
    """Run ``cmd`` with every rank recorded into ``out_dir``. ``options``:
    the recorder's Config fields as ``commprof record``'s options give them
    (config.from_options); the other arguments are the launcher's own."""
    if not cmd:
        raise UsageError("no command to record (usage: commprof record [options] -- CMD ...)")
    if nproc is not None:
        if nproc < 1:
            raise UsageError("--nproc must be at least 1")
        cmd = with_nproc(cmd, nproc)
    if nodes is not None and nodes < 1:
        raise UsageError("--nodes must be at least 1")
    if hang_timeout < 0:
        raise UsageError("--hang-timeout must be >= 0 seconds")
    options = dict(options or {})
    out_dir = os.path.abspath(out_dir)
    expected = shared.expected_participants(cmd, dict(os.environ), nodes)
    run_id = run_id or shared.job_id(cmd, dict(os.environ)) or uuid.uuid4().hex[:12]
    participant = None
    if expected > 1 or shared.read_run(out_dir) is not None:
        participant = _join_shared(out_dir, run_id, expected)
        run_id = participant.run["run_id"]
    else:
        prepare_out_dir(out_dir)
    from .instruments import ALL

    config = Config(out_dir=out_dir, run_id=run_id, command=tuple(cmd), launcher=detect_launcher(cmd),
                    progress=hang_timeout > 0, **options)
    unknown = [d for d in list(config.disable) + list(config.fault_inject) if d not in ALL]
    if unknown:
        raise UsageError(f"unknown instrument(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    boot_dir = os.path.join(out_dir, f"{BOOTSTRAP_DIR}.{socket.gethostname()}.{os.getpid()}")
    bootstrap.write_bootstrap(boot_dir, config)
    shard_dir = os.path.join(out_dir, "shards")
    os.makedirs(shard_dir, exist_ok=True)
    env = child_env(config, boot_dir)
    if horovod_timeline:
        env["HOROVOD_TIMELINE"] = os.path.join(shard_dir, HOROVOD_TIMELINE_FILE)

    if config.native_hooks and "ddp" not in config.disable and config.ddp_timing == "auto":
        _ensure_native(cmd)
    watchdog = None
    if hang_timeout > 0:
        from .hang import Watchdog

        watchdog = Watchdog(out_dir, shard_dir, hang_timeout, kill=hang_kill)
    returncode = _run(cmd, env, watchdog)
    if watchdog is not None:
        watchdog.stop()
        if watchdog.fired and hang_kill:
            returncode = HANG_EXIT_CODE

    _reap_ranks(shard_dir)
    _echo_fatal_reports(shard_dir)
    shutil.rmtree(boot_dir, ignore_errors=True)
    job_exit = {"host": socket.gethostname(), "code": returncode, "hang": bool(watchdog and watchdog.fired)}
    if returncode < 0:
        job_exit["signal"] = _signal_name(-returncode)
    if participant is None:
        _merge(out_dir, shard_dir, config, keep_shards, job_exit)
    elif participant.finish():
        try:
            _merge(out_dir, shard_dir, config, keep_shards, job_exit)
        finally:
            participant.release()
            if os.path.exists(os.path.join(out_dir, TRACE_FILE)):
                shutil.rmtree(os.path.join(out_dir, shared.NODES_DIR), ignore_errors=True)
    else:
        sys.stderr.write(f"commprof: {socket.gethostname()} done; the last participant merges "
                         f"(waiting for: {', '.join(participant.waiting_for()) or 'none'})\n")
    return returncode


def _ensure_native(cmd: List[str]) -> None:
    """Build the native process-group hooks (``native.py``) once per torch
    version, before the job starts: a recorded rank never compiles. In a
    subprocess (torch is not imported here); where it fails, one line says
    so and the Python hooks time DDP."""
    from . import native

    if os.environ.get("COMMPROF_NATIVE") == "0" or shutil.which(cmd[0]) is None:
        return
    if native.build_dir() is None or native.built():
        return
    sys.stderr.write("commprof: building the native process-group hooks, once per torch version "
                     "(~40 s; --no-native-hooks skips it)\n")
    sys.stderr.flush()
    try:
        proc = subprocess.run([sys.executable, "-c", "from commprof.record import native; native.build()"],
                              capture_output=True, text=True, timeout=900)
        ok, why = proc.returncode == 0, (proc.stderr.strip().splitlines() or ["?"])[-1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, why = False, repr(exc)
    if not ok:
        sys.stderr.write(f"commprof: could not build them ({why[:200]}); DDP is timed by the Python hooks\n")


#: exit status of ``commprof record --hang-timeout S --hang-kill`` when it ended a hung job
HANG_EXIT_CODE = 124


def _join_shared(out_dir: str, run_id: str, expected: int) -> "shared.Participant":
    if shared.merged(out_dir):
        raise UsageError(f"{out_dir!r} already holds a recording; choose another -o")
    existing = shared.read_run(out_dir)
    if existing is not None:
        ps = shared.participants(out_dir)
        if ps and all(p.get("state") == "done" for p in ps) and len(ps) >= int(existing.get("expected") or 1):
            raise UsageError(f"{out_dir!r} holds a finished recording that was not merged "
                             "(commprof merge DIR merges it); choose another -o")
    elif any(find_shards(os.path.join(out_dir, "shards"))):
        raise UsageError(f"{out_dir!r} already holds a recording; choose another -o")
    try:
        os.makedirs(os.path.join(out_dir, "shards"), exist_ok=True)
        return shared.Participant(out_dir, run_id, expected)
    except OSError as exc:
        raise UsageError(f"output location {out_dir!r} is not writable: {exc.strerror or exc}")


def _run(cmd: List[str], env: Dict[str, str], watchdog=None) -> int:
    tty = None
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            tty = 0
    except OSError:
        tty = None
    try:
        child = subprocess.Popen(cmd, env=env, process_group=0)
    except FileNotFoundError:
        raise UsageError(f"command not found: {cmd[0]}")
    except PermissionError:
        raise UsageError(f"permission denied: {cmd[0]}")
    if tty is not None:
        old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(tty, child.pid)
        except OSError:
            tty = None
        signal.signal(signal.SIGTTOU, old_ttou)

    def forward(signum, frame):
        try:
            os.killpg(child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    if watchdog is not None:
        watchdog.start(child.pid)
    try:
        while True:
            try:
                returncode = child.wait()
                break
            except InterruptedError:  # pragma: no cover
                continue
    finally:
        if tty is not None:
            old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(tty, os.getpgrp())
            except OSError:
                pass
            signal.signal(signal.SIGTTOU, old_ttou)
        _reap_group(child.pid)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return returncode


def merge_folder(out_dir: str, force: bool = False) -> None:
    """``commprof merge DIR``: merge a folder's shards by hand (e.g. a shared
    folder whose last participant died before it could merge)."""
    out_dir = os.path.abspath(out_dir)
    shard_dir = os.path.join(out_dir, "shards")
    if not os.path.isdir(out_dir):
        raise UsageError(f"{out_dir}: no such folder")
    if shared.merged(out_dir):
        raise UsageError(f"{out_dir!r} is already merged ({TRACE_FILE})")
    if not any(find_shards(shard_dir)):
        raise UsageError(f"{out_dir!r} holds no shards or journals to merge")
    run = shared.read_run(out_dir) or {}
    running = [f"{p['host']}.{p['pid']}" for p in shared.participants(out_dir) if p.get("state") != "done"]
    if running and not force:
        raise UsageError(f"participant(s) {', '.join(running)} have not finished; wait, or --force if they died")
    config = Config(out_dir=out_dir, run_id=run.get("run_id") or uuid.uuid4().hex[:12], launcher="")
    _merge(out_dir, shard_dir, config, keep_shards=False)
    if shared.merged(out_dir):
        shutil.rmtree(os.path.join(out_dir, shared.NODES_DIR), ignore_errors=True)


def _echo_fatal_reports(shard_dir: str) -> None:
    """faulthandler reports of ranks whose job had enabled faulthandler (to
    stderr) go to stderr, as they would have without commprof."""
    import glob

    from ..trace.journal import FATAL_SUFFIX
    from .forensics import JOB_ENABLED

    for path in sorted(glob.glob(os.path.join(shard_dir, "*" + FATAL_SUFFIX))):
        try:
            with open(path, errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        if text.startswith(JOB_ENABLED) and text[len(JOB_ENABLED):].strip():
            name = os.path.basename(path)[: -len(FATAL_SUFFIX)]
            sys.stderr.write(f"commprof: fatal error in {name} (its faulthandler report):\n"
                             + text[len(JOB_ENABLED):].lstrip("\n"))


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _merge(out_dir: str, shard_dir: str, config: Config, keep_shards: bool,
           job_exit: Optional[Dict[str, Any]] = None) -> None:
    from ..assemble import merge
    from .log import warn

    shards, journals = find_shards(shard_dir)
    if not shards and not journals:
        warn("no process recorded any event (did the command run a training loop?)")
        return
    base = {"run_id": config.run_id, "command": list(config.command), "launcher": config.launcher,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if config.labels:
        base["labels"] = dict(config.labels)
    if job_exit is not None:
        base["job_exit"] = job_exit
    out_path = os.path.join(out_dir, TRACE_FILE)
    try:
        run = merge(shard_dir, out_path, base)
    except Exception as exc:
        warn(f"merging the shards failed ({exc}); they are kept in {shard_dir}")
        return
    if not keep_shards:
        for path in shards + [meta_path_of(j) for j in journals] + journals + side_files(shard_dir):
            try:
                os.remove(path)
            except OSError:
                pass
        try:
            os.rmdir(shard_dir)
        except OSError:
            pass
    salv = run.get("salvaged_ranks") or []
    note = f", salvaged from killed rank(s) {salv}" if salv else ""
    sys.stderr.write(f"commprof: {run.get('ranks_recorded')} rank(s), world size "
                     f"{run.get('world_size')}{note} -> {out_path}\n")


def exit_like(returncode: int) -> int:
    """Exit status for commprof itself: the child's code, or die of its signal."""
    if returncode < 0:
        sig = -returncode
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL / SIGSTOP cannot be caught anyway
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), sig)
        return 128 + sig
    return returncode
