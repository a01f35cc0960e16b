"""Several ``commprof record`` processes writing one folder (one per node,
the folder on a shared filesystem): who takes part, one run id for all, and
a merge that happens exactly once, when the last participant finishes.

Layout: ``DIR/.nodes/run.json`` (the run id and the number of participants
expected, written once: the first participant creates it with an atomic
link) and ``DIR/.nodes/<host>.<pid>.json`` per participant (state
``running`` -> ``done``). A participant that finishes marks itself done
*before* it takes the merge lock (``os.mkdir`` of ``DIR/.nodes/merging``:
atomic on local and network filesystems) and looks at the others only
while holding it, so whichever participant takes the lock last sees every
one done and merges; nobody merges twice, and a late participant never
races a merge in progress. ``commprof merge DIR`` merges by hand (a node
that died without marking itself done)."""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Dict, List, Optional

from ..trace.files import atomic_write

NODES_DIR = ".nodes"
RUN_FILE = "run.json"
LOCK_DIR = "merging"


def _nodes(out_dir: str) -> str:
    return os.path.join(out_dir, NODES_DIR)


def read_run(out_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(_nodes(out_dir), RUN_FILE)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def participants(out_dir: str) -> List[dict]:
    out = []
    d = _nodes(out_dir)
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for name in names:
        if name == RUN_FILE or not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(d, name)) as fh:
                out.append(json.load(fh))
        except (OSError, ValueError):
            continue
    return out


class Participant:
    """This ``commprof record`` as one of the folder's writers."""

    def __init__(self, out_dir: str, run_id: str, expected: int):
        self.out_dir = out_dir
        self.host = socket.gethostname()
        self.pid = os.getpid()
        d = _nodes(out_dir)
        os.makedirs(d, exist_ok=True)
        self.path = os.path.join(d, f"{self.host}.{self.pid}.json")
        self.run = self._join(run_id, expected)
        self._write("running")

    def _join(self, run_id: str, expected: int) -> dict:
        """The folder's run (created by the first participant)."""
        final = os.path.join(_nodes(self.out_dir), RUN_FILE)
        tmp = f"{final}.{self.host}.{self.pid}"
        with open(tmp, "w") as fh:
            json.dump({"run_id": run_id, "expected": expected, "created_by": f"{self.host}.{self.pid}"}, fh)
        try:
            os.link(tmp, final)       # atomic create-if-absent
        except FileExistsError:
            pass
        finally:
            os.remove(tmp)
        for _ in range(100):
            run = read_run(self.out_dir)
            if run is not None:
                return run
            time.sleep(0.01)
        raise OSError(f"{final} unreadable")

    def _write(self, state: str) -> None:
        atomic_write(self.path, json.dumps({"host": self.host, "pid": self.pid, "state": state,
                                            "t": time.time()}))

    def finish(self) -> bool:
        """Mark this participant done; True when it is the one to merge (it
        then holds the merge lock until :meth:`release`)."""
        self._write("done")
        lock = os.path.join(_nodes(self.out_dir), LOCK_DIR)
        while True:
            try:
                os.mkdir(lock)
                break
            except FileExistsError:
                if merged(self.out_dir):
                    return False
                time.sleep(0.05)
            except FileNotFoundError:
                # the last participant merged, released the lock and removed
                # the folder's .nodes/ between our marking done and our try
                if merged(self.out_dir):
                    return False
                raise
        ps = participants(self.out_dir)
        done = [p for p in ps if p.get("state") == "done"]
        if not merged(self.out_dir) and len(done) == len(ps) and len(done) >= int(self.run.get("expected") or 1):
            self._holding = True
            return True
        os.rmdir(lock)
        return False

    _holding = False

    def waiting_for(self) -> List[str]:
        ps = participants(self.out_dir)
        missing = max(0, int(self.run.get("expected") or 1) - len(ps))
        return [f"{p['host']}.{p['pid']}" for p in ps if p.get("state") != "done"] + \
            [f"{missing} participant(s) not started"] * bool(missing)

    def release(self) -> None:
        if self._holding:
            self._holding = False
            try:
                os.rmdir(os.path.join(_nodes(self.out_dir), LOCK_DIR))
            except OSError:
                pass


def merged(out_dir: str) -> bool:
    from ..trace.parquet import TRACE_FILE

    return os.path.exists(os.path.join(out_dir, TRACE_FILE))


def expected_participants(cmd: List[str], environ: Dict[str, str], nodes: Optional[int]) -> int:
    """How many ``commprof record`` processes will write this folder:
    ``--nodes``; else the srun step's task count when commprof itself is an
    srun task; else torchrun's ``--nnodes`` (the maximum of a range); else 1."""
    if nodes:
        return nodes
    if environ.get("SLURM_STEP_ID") not in (None, "", "batch", "extern", "4294967294") \
            and environ.get("SLURM_PROCID") is not None and environ.get("SLURM_STEP_NUM_TASKS"):
        try:
            return max(1, int(environ["SLURM_STEP_NUM_TASKS"]))
        except ValueError:
            pass
    v = _option(cmd, "--nnodes")
    if v:
        try:
            return max(1, int(v.split(":")[-1]))
        except ValueError:
            pass
    return 1


def _option(cmd: List[str], name: str) -> Optional[str]:
    names = {name, name.replace("-", "_")} | {name.replace("_", "-")}
    for i, a in enumerate(cmd):
        for n in names:
            if a == n and i + 1 < len(cmd):
                return cmd[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return None


def job_id(cmd: List[str], environ: Dict[str, str]) -> Optional[str]:
    """An id every node of one job derives alike (so that per-node folders
    are reported as the one job they are): the Slurm job (and step), else
    torchrun's rendezvous id or its master address and port on multi-node
    runs; None when nothing identifies the job beyond this process."""
    if environ.get("SLURM_JOB_ID"):
        step = environ.get("SLURM_STEP_ID")
        return f"slurm-{environ['SLURM_JOB_ID']}" + (f".{step}" if step not in (None, "") else "")
    rdzv = _option(cmd, "--rdzv-id") or _option(cmd, "--rdzv_id")
    if rdzv and rdzv != "none":
        return f"rdzv-{rdzv}"
    nnodes = _option(cmd, "--nnodes")
    addr = _option(cmd, "--master-addr") or _option(cmd, "--master_addr")
    if nnodes and nnodes != "1" and addr:
        port = _option(cmd, "--master-port") or _option(cmd, "--master_port") or "29500"
        return f"torchrun-{addr}:{port}"
    return None
