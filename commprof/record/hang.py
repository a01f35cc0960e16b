"""``commprof record --hang-timeout S``: notice a job that stopped making
progress and say where every rank is (anchors: PyTorch's flight recorder,
Horovod's stall check).

Ranks (with ``Config.progress``) rewrite a small progress file at every
journal flush: step, collectives completed, the last one completed and the
ones in flight (group, seq, op, bytes, since when); the in-flight ones and
the last completion are then read from the ranks' collective rings
(``trace/ring.py``: written at every issue and completion, readable when a
rank cannot answer). The watchdog thread in
``commprof record`` reads them; when no rank's (step, completed count) has
changed for S seconds, it asks its ranks for their Python stacks
(faulthandler on ``STACK_SIGNAL``: a C-level handler, so it answers even
while the main thread is blocked inside a collective), then writes
``hang.json`` and ``hang.txt`` into the output folder (``hang.<host>.*``
when several ``commprof record`` share the folder): per rank the last
completed and the in-flight collectives, the ranks the others wait for,
collectives the ranks disagree on, and every thread's stack. With
``--hang-kill`` it then ends the job; ``commprof record`` exits with
status 124."""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import threading
import time
from typing import Dict, List, Optional

from ..trace.files import atomic_write
from ..trace.journal import PROGRESS_SUFFIX, STACKS_SUFFIX

#: the signal a rank dumps its threads' stacks on (a real-time signal
#: nobody else uses; faulthandler's handler is C-level)
STACK_SIGNAL = signal.SIGRTMIN + 5


def install_stack_dump(shard_dir: str, host: str, pid: int) -> None:
    """In a rank: dump every thread's Python stack to a file on STACK_SIGNAL."""
    import faulthandler

    prev = signal.getsignal(STACK_SIGNAL)
    fh = open(os.path.join(shard_dir, f"{host}.{pid}{STACKS_SUFFIX}"), "a")
    faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True,
                          chain=prev not in (signal.SIG_DFL, signal.SIG_IGN, None))
    install_stack_dump.file = fh  # kept open for the process's life


def read_progress(shard_dir: str) -> Dict[str, dict]:
    out = {}
    for path in glob.glob(os.path.join(shard_dir, "*" + PROGRESS_SUFFIX)):
        try:
            with open(path) as fh:
                out[os.path.basename(path)[: -len(PROGRESS_SUFFIX)]] = json.load(fh)
        except (OSError, ValueError):
            continue
    return out


def with_rings(progress: Dict[str, dict], shard_dir: str) -> Dict[str, dict]:
    """The ranks' in-flight collectives and last completion from their
    collective rings (trace/ring.py), which are written at every issue and
    completion: newer than a progress file (written at a flush), and
    readable whether or not the rank can still answer."""
    from ..trace import ring

    out = {}
    for key, p in progress.items():
        recs = ring.read_process(shard_dir, str(p.get("host")), int(p.get("pid") or 0))
        if not recs:
            out[key] = p
            continue
        done = [r for r in recs if r["t_done"] is not None]
        last = max(done, key=lambda r: r["t_done"]) if done else None
        out[key] = dict(p, ring=True,
                        inflight=[{"group": r["group"], "seq": r["seq"], "op": r["op"], "bytes": r["bytes"],
                                   "since_ns": r["t_issue"]} for r in recs if r["t_done"] is None],
                        last=p.get("last") if last is None else {"group": last["group"], "seq": last["seq"],
                                                                 "op": last["op"], "bytes": last["bytes"],
                                                                 "at_ns": last["t_done"]})
    return out


def diagnose(progress: Dict[str, dict]) -> dict:
    """Where every rank is and who waits for whom, from the progress files."""
    now_wall = time.time_ns()
    ranks = []
    for key, p in sorted(progress.items(), key=lambda kv: kv[1].get("rank", 0)):
        age = (now_wall - int(p.get("wall_ns", now_wall))) / 1e9
        infl = []
        for c in p.get("inflight") or []:
            infl.append({**c, "for_s": round((int(p["mono_ns"]) - int(c["since_ns"])) / 1e9 + age, 3)})
        last = p.get("last")
        if last:
            last = {**last, "ago_s": round((int(p["mono_ns"]) - int(last["at_ns"])) / 1e9 + age, 3)}
        ranks.append({"rank": p.get("rank"), "host": p.get("host"), "pid": p.get("pid"), "step": p.get("step"),
                      "completed": p.get("done"), "last_completed": last, "in_flight": infl, "key": key,
                      "in_flight_from": "ring" if p.get("ring") else "progress file"})
    world = max([int(p.get("world_size") or 0) for p in progress.values()] + [len(ranks)])
    findings: List[str] = []
    waiting_for: List[int] = []
    mismatches: List[dict] = []
    groups = sorted({c["group"] for r in ranks for c in r["in_flight"]})
    for g in groups:
        frontier = min(c["seq"] for r in ranks for c in r["in_flight"] if c["group"] == g)
        at = {r["rank"]: next((c for c in r["in_flight"] if c["group"] == g and c["seq"] == frontier), None)
              for r in ranks}
        inside = {rk: c for rk, c in at.items() if c is not None}
        sigs: Dict[tuple, List[int]] = {}
        for rk, c in inside.items():
            sigs.setdefault((c["op"], c["bytes"]), []).append(rk)
        if len(sigs) > 1:
            parts = [f"{op} {nbytes if nbytes is not None else '?'} B on rank(s) {_ranks(rs)}"
                     for (op, nbytes), rs in sorted(sigs.items(), key=lambda kv: -len(kv[1]))]
            odd = sorted(min(sigs.values(), key=len))
            mismatches.append({"group": g, "seq": frontier, "signatures": parts, "odd_ranks": odd})
            findings.append(f"group {g} seq {frontier}: the ranks are in different collectives ({'; '.join(parts)}): "
                            f"their sequences diverged; rank(s) {_ranks(odd)} issued a different collective "
                            "(skipped or added one)")
        missing = sorted(r["rank"] for r in ranks if r["rank"] not in inside)
        missing += list(range(len(ranks), world)) if len(ranks) < world else []
        if missing and inside:
            c0 = next(iter(inside.values()))
            waiting_for.extend(missing)
            findings.append(f"group {g} seq {frontier} ({c0['op']}, {c0['bytes']} B): rank(s) {_ranks(sorted(inside))} "
                            f"wait in it for {max(c['for_s'] for c in inside.values()):.1f} s; rank(s) "
                            f"{_ranks(missing)} never issued it: the others wait for them")
    if not groups:
        findings.append("no rank is inside a collective: the job is stuck outside communication "
                        "(data loading, a deadlock in user code, I/O); see the stacks")
    return {"ranks": ranks, "world_size": world, "waiting_for": sorted(set(waiting_for)),
            "mismatches": mismatches, "findings": findings}


def _ranks(rs) -> str:
    return ",".join(str(r) for r in rs)


def render_text(report: dict, stacks: Dict[str, str]) -> str:
    lines = [f"commprof: no rank made progress for {report['timeout_s']:.0f} s "
             f"(detected {report['detected_at']})", ""]
    lines += ["Diagnosis:"] + [f"  - {f}" for f in report["findings"]] + [""]
    lines.append("Per rank:")
    for r in report["ranks"]:
        last = r["last_completed"]
        lt = (f"{last['group']} #{last['seq']} {last['op']} {last['bytes']} B, {last['ago_s']:.1f} s ago"
              if last else "none")
        lines.append(f"  rank {r['rank']} ({r['host']} pid {r['pid']}), step {r['step']}: last completed: {lt}")
        for c in r["in_flight"]:
            lines.append(f"      in flight: {c['group']} #{c['seq']} {c['op']} {c['bytes']} B for {c['for_s']:.1f} s")
        if not r["in_flight"]:
            lines.append("      in flight: nothing")
    for r in report["ranks"]:
        st = stacks.get(r["key"])
        if st:
            lines += ["", f"Stacks of rank {r['rank']} ({r['host']} pid {r['pid']}):", st.rstrip()]
    return "\n".join(lines) + "\n"


class Watchdog:
    def __init__(self, out_dir: str, shard_dir: str, timeout: float, kill: bool = False):
        self.out_dir, self.shard_dir, self.timeout, self.kill = out_dir, shard_dir, timeout, kill
        self.fired = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pgid: Optional[int] = None
        from .shared import NODES_DIR

        shared_folder = os.path.isdir(os.path.join(out_dir, NODES_DIR))
        suffix = f".{socket.gethostname()}" if shared_folder else ""
        self.json_path = os.path.join(out_dir, f"hang{suffix}.json")
        self.text_path = os.path.join(out_dir, f"hang{suffix}.txt")

    def start(self, pgid: int) -> None:
        self._pgid = pgid
        self._thread = threading.Thread(target=self._loop, name="commprof-hang-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        seen: Dict[str, tuple] = {}
        changed: Dict[str, float] = {}
        poll = max(0.1, min(1.0, self.timeout / 4))
        while not self._stop.wait(poll):
            prog = read_progress(self.shard_dir)
            t = time.monotonic()
            for k, p in prog.items():
                state = (p.get("step"), p.get("done"))
                if seen.get(k) != state:
                    seen[k], changed[k] = state, t
            if prog and all(t - changed[k] >= self.timeout for k in prog):
                try:
                    self._fire(prog)
                except Exception as exc:  # never take the job down by accident
                    from .log import warn

                    warn(f"hang report failed: {exc!r}")
                return

    def _fire(self, prog: Dict[str, dict]) -> None:
        from .procs import own_rank_pids
        from .log import warn

        self.fired = True
        stacks_before = {}
        pids = own_rank_pids(self.shard_dir)
        for pid in pids:
            path = glob.glob(os.path.join(self.shard_dir, f"*.{pid}{STACKS_SUFFIX}"))
            stacks_before[pid] = os.path.getsize(path[0]) if path else 0
            try:
                os.kill(pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3.0
        stacks: Dict[str, str] = {}
        previous: Dict[str, int] = {}
        stable = 0
        while time.monotonic() < deadline:
            stacks = {}
            for pid in pids:
                for path in glob.glob(os.path.join(self.shard_dir, f"*.{pid}{STACKS_SUFFIX}")):
                    with open(path) as fh:
                        fh.seek(stacks_before.get(pid, 0))
                        text = fh.read()
                    if text:
                        stacks[os.path.basename(path)[: -len(STACKS_SUFFIX)]] = text
            # faulthandler writes thread by thread: done when every rank wrote and nothing grew for 0.2 s
            sizes = {k: len(v) for k, v in stacks.items()}
            stable = stable + 1 if sizes == previous else 0
            previous = sizes
            if len(stacks) >= len(pids) and stable >= 2:
                break
            time.sleep(0.1)
        report = diagnose(with_rings(read_progress(self.shard_dir) or prog, self.shard_dir))
        report["timeout_s"] = self.timeout
        report["detected_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        report["stacks"] = stacks
        atomic_write(self.json_path, json.dumps(report, indent=1, default=str))
        atomic_write(self.text_path, render_text(report, stacks))
        warn(f"no rank made progress for {self.timeout:g} s: {report['findings'][0] if report['findings'] else ''}"
             f" (details: {self.text_path})")
        if self.kill and self._pgid is not None:
            warn("--hang-kill: ending the job")
            try:
                os.killpg(self._pgid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
