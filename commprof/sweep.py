"""``commprof sweep``: run a scaling study — every (configuration, GPU
count) cell under ``commprof record`` into ``STUDY/<configuration>/<N>/`` —
locally, as one SLURM job per cell, or as printed scripts only.

A plan comes from a TOML file, the command line, or both (the command line
wins)::

    output = "study"
    command = "torchrun --standalone --nproc_per_node={nproc} train.py --framework {framework}"
    nproc = [1, 2, 4, 8]
    launcher = "local"            # local | slurm (--dry-run: print the commands / scripts only)
    gpus_per_node = 4             # SLURM layout: nodes = ceil(N / gpus_per_node)
    record_args = ["--flush-interval", "1"]
    cell_timeout = 3600           # seconds; a cell running longer is stopped, marked failed
    [vary]
    loader = ["native", "dali"]
    [vary.framework]              # a value may bring its own placeholders
    ddp = {launch = "torchrun --standalone --nproc_per_node={nproc}"}
    horovod = {launch = "horovodrun --gloo -np {nproc} -H localhost:{nproc}"}
    [slurm]
    partition = "gpu"
    time = "00:30:00"
    sbatch_args = ["--exclusive"]
    request_gpus = false          # add --gpus-per-node to each job
    pairs = true                  # first: commprof bench --pairs over the largest cell's ranks

Placeholders: ``{nproc}``, ``{nodes}``, ``{tasks_per_node}``,
``{gpus_per_node}``, ``{cell}`` (the cell's folder), every varied key, and
the keys a varied value brings. With ``pairs`` (``--pairs``) the sweep
first measures every node pair alone (``commprof bench --pairs`` over the
largest cell's ranks and nodes) into ``STUDY/pairs/``; the study report
then shows its findings beside a slow-node finding. A cell whose folder holds a complete trace
from a successful run is skipped (the sweep resumes); a failing cell is
reported, its attempt kept aside (``<N>.failed-<k>``), and the others still
run. Standard library only (the report at the end reads the traces in
``commprof report``'s way)."""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .errors import UsageError
from .trace.files import atomic_write

LAUNCHERS = ("local", "slurm")
#: keys the recorder detects itself: varied, they are not added as labels
DETECTED = ("framework", "loader", "model", "batch_size")
STATE = "sweep.json"
#: the folder, inside the study, of the pairs bench run before the cells
PAIRS = "pairs"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class Plan:
    command: str = ""
    nproc: List[int] = field(default_factory=lambda: [1])
    vary: Dict[str, Dict[str, Dict[str, str]]] = field(default_factory=dict)
    output: str = "study"
    launcher: str = "local"
    gpus_per_node: int = 1
    record_args: List[str] = field(default_factory=list)
    cell_timeout: float = 0.0
    slurm: Dict[str, object] = field(default_factory=dict)
    pairs: bool = False


@dataclass
class Cell:
    config: str        # folder name of the configuration
    values: Dict[str, str]
    nproc: int
    folder: str
    command: List[str]
    labels: Dict[str, str]
    #: the template does not place the ranks itself ({nproc}, {nodes},
    #: {tasks_per_node} absent): commprof does (local: record --nproc N, a
    #: plain process at N = 1; SLURM: srun inside the job)
    auto: bool = False
    #: the pairs bench (``commprof bench --pairs``), not a recorded cell
    pairs: bool = False

    @property
    def name(self) -> str:
        return PAIRS if self.pairs else f"{self.config}/{self.nproc}"

    @property
    def product(self) -> str:
        """What a successful run leaves in its folder."""
        return "pairs.json" if self.pairs else "trace.parquet"


# -- the plan -------------------------------------------------------------------
def _ints(text) -> List[int]:
    if isinstance(text, list):
        vals = text
    else:
        vals = [v for v in str(text).replace(" ", "").split(",") if v]
    try:
        out = [int(v) for v in vals]
    except (TypeError, ValueError):
        raise UsageError(f"sweep: --nproc expects GPU counts like 1,2,4,8, got {text!r}")
    if not out or min(out) < 1:
        raise UsageError(f"sweep: GPU counts must be >= 1, got {text!r}")
    return out


def _vary_from_toml(vary) -> Dict[str, Dict[str, Dict[str, str]]]:
    out: Dict[str, Dict[str, Dict[str, str]]] = {}
    for key, values in (vary or {}).items():
        if isinstance(values, dict):
            out[key] = {str(v): {str(k): str(x) for k, x in (extra or {}).items()}
                        for v, extra in values.items()}
        elif isinstance(values, list):
            out[key] = {str(v): {} for v in values}
        else:
            raise UsageError(f"sweep: vary.{key} must be a list of values or a table of value = {{...}}")
    return out


def _vary_from_cli(items: List[str]) -> Dict[str, Dict[str, Dict[str, str]]]:
    out: Dict[str, Dict[str, Dict[str, str]]] = {}
    for item in items or []:
        for part in item.split():
            if "=" not in part:
                raise UsageError(f"sweep: --vary expects KEY=V1,V2,..., got {part!r}")
            key, vals = part.split("=", 1)
            values = [v for v in vals.split(",") if v]
            if not key or not values:
                raise UsageError(f"sweep: --vary expects KEY=V1,V2,..., got {part!r}")
            out[key.strip()] = {v: {} for v in values}
    return out


#: each key of a plan (a Plan field, a TOML key) and how a value from the
#: TOML file or the command line becomes the field's
_FROM_TOML = {
    "command": str, "nproc": _ints, "vary": _vary_from_toml, "output": str, "launcher": str,
    "gpus_per_node": int, "record_args": lambda v: [str(a) for a in v], "cell_timeout": lambda v: float(v or 0),
    "slurm": lambda v: dict(v or {}), "pairs": bool,
}


def load_plan(path: Optional[str] = None, **cli) -> Plan:
    """The plan from ``path`` (TOML) with command-line values on top."""
    plan = Plan()
    if path:
        import tomllib

        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"sweep: {path}: not valid TOML: {exc}")
        known = set(_FROM_TOML)
        unknown = sorted(set(doc) - known)
        if unknown:
            raise UsageError(f"sweep: {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for key, value in doc.items():
            try:
                setattr(plan, key, _FROM_TOML[key](value))
            except (TypeError, ValueError) as exc:
                raise UsageError(f"sweep: {path}: {key} = {value!r}: {exc}")
    for key in ("command", "nproc", "output", "launcher", "gpus_per_node", "cell_timeout", "pairs"):
        if cli.get(key):
            setattr(plan, key, _FROM_TOML[key](cli[key]))
    if cli.get("vary"):
        plan.vary.update(_vary_from_cli(cli["vary"]))
    if cli.get("record_args"):
        plan.record_args += list(cli["record_args"])
    for key in ("partition", "time"):
        if cli.get(key):
            plan.slurm[key] = cli[key]
    if cli.get("sbatch_args"):
        plan.slurm["sbatch_args"] = list(plan.slurm.get("sbatch_args", [])) + shlex.split(cli["sbatch_args"])
    if not plan.command.strip():
        raise UsageError("sweep: no command: give it after -- or as command = \"...\" in the plan")
    if plan.launcher not in LAUNCHERS:
        raise UsageError(f"sweep: launcher {plan.launcher!r}: choose from {', '.join(LAUNCHERS)}")
    if plan.gpus_per_node < 1:
        raise UsageError("sweep: gpus_per_node must be >= 1")
    return plan


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x"


def pairs_cell(plan: Plan) -> Cell:
    """The pairs bench over the largest cell's ranks (its nodes at SLURM)."""
    n = max(plan.nproc)
    return Cell(PAIRS, {}, n, os.path.join(plan.output, PAIRS), [], {}, auto=True, pairs=True)


def cells(plan: Plan) -> List[Cell]:
    """Every (configuration, N) cell of the plan, configurations in plan
    order, GPU counts ascending; the pairs bench first where asked."""
    out = [pairs_cell(plan)] if plan.pairs else []
    return out + _study_cells(plan)


def _study_cells(plan: Plan) -> List[Cell]:
    keys = list(plan.vary)
    combos = list(itertools.product(*[list(plan.vary[k].items()) for k in keys])) if keys else [()]
    out = []
    for combo in combos:
        values = {k: v for k, (v, _extra) in zip(keys, combo)}
        extra: Dict[str, str] = {}
        for _v, ex in combo:
            extra.update(ex)
        config = "_".join(f"{_slug(k)}-{_slug(v)}" for k, v in values.items()) or "default"
        labels = {k: v for k, v in values.items() if k not in DETECTED}
        for n in sorted(set(plan.nproc)):
            nodes = math.ceil(n / plan.gpus_per_node)
            folder = os.path.join(plan.output, config, str(n))
            subs = dict(extra, **values, nproc=str(n), nodes=str(nodes), tasks_per_node=str(min(n, plan.gpus_per_node)),
                        gpus_per_node=str(plan.gpus_per_node), cell=folder)
            # a value's own placeholders may use the others ({nproc} inside launch = "...")
            for k in list(extra):
                subs[k] = _fill(extra[k], subs, f"vary value {k}")
            command = _fill(plan.command, subs, "command")
            placed = any(f"{{{k}}}" in text for k in ("nproc", "nodes", "tasks_per_node")
                         for text in [plan.command] + list(extra.values()))
            out.append(Cell(config, values, n, folder, shlex.split(command), labels, auto=not placed))
    return out


def _fill(template: str, subs: Dict[str, str], what: str) -> str:
    def one(m):
        if m.group(1) not in subs:
            raise UsageError(f"sweep: {what}: unknown placeholder {{{m.group(1)}}}; "
                             f"known: {', '.join('{' + k + '}' for k in sorted(subs))}")
        return subs[m.group(1)]
    return _PLACEHOLDER.sub(one, template)


# -- running cells ----------------------------------------------------------------
def bench_pairs_command(cell: Cell, plan: Plan) -> List[str]:
    """``commprof bench --pairs`` into the cell's folder: locally over N
    ranks, at SLURM through srun inside the job (its nodes)."""
    out = os.path.join(cell.folder, "pairs")
    cmd = [sys.executable, "-m", "commprof", "bench", "--pairs", "--json", out + ".json",
           "--report", out + ".html"]
    if plan.launcher == "slurm":
        return cmd + ["--", "srun", "--ntasks", str(cell.nproc)]
    return cmd + ["--nproc", str(cell.nproc)]


def record_command(cell: Cell, plan: Plan) -> List[str]:
    if cell.pairs:
        return bench_pairs_command(cell, plan)
    cmd = [sys.executable, "-m", "commprof", "record", "-o", cell.folder]
    for k, v in cell.labels.items():
        cmd += ["--label", f"{k}={v}"]
    cmd += list(plan.record_args)
    command = list(cell.command)
    if plan.launcher == "slurm":
        cmd += ["--run-id", f"sweep-{cell.config}-{cell.nproc}"]
        if cell.auto and command[:1] != ["srun"]:
            command = ["srun", "--ntasks", str(cell.nproc)] + command
    elif cell.auto and cell.nproc > 1:
        cmd += ["--nproc", str(cell.nproc)]
    return cmd + ["--"] + command


def state(cell: Cell) -> dict:
    try:
        with open(os.path.join(cell.folder, STATE)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def complete(cell: Cell) -> bool:
    """A successful run with its merged trace (the pairs bench: its results): the sweep skips it."""
    return state(cell).get("status") == "done" and os.path.isfile(os.path.join(cell.folder, cell.product))


def _write_state(cell: Cell, doc: dict) -> None:
    os.makedirs(cell.folder, exist_ok=True)
    atomic_write(os.path.join(cell.folder, STATE), json.dumps(doc, indent=1))


def _set_aside(cell: Cell) -> Optional[str]:
    """A previous failed attempt moves to ``<N>.failed-<k>`` (nothing lost)."""
    if not os.path.exists(cell.folder):
        return None
    k = 1
    while os.path.exists(f"{cell.folder}.failed-{k}"):
        k += 1
    os.replace(cell.folder, f"{cell.folder}.failed-{k}")
    return f"{cell.folder}.failed-{k}"


def run_local(cell: Cell, plan: Plan) -> dict:
    os.makedirs(cell.folder, exist_ok=True)
    cmd = record_command(cell, plan)
    t0 = time.time()
    doc = {"cell": cell.name, "command": cell.command, "record": cmd, "launcher": "local", "started": t0,
           "status": "running"}
    _write_state(cell, doc)
    with open(os.path.join(cell.folder, "sweep.log"), "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=plan.cell_timeout or None)
            status = "done" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc, status = 124, "failed"
    if status == "done" and not os.path.isfile(os.path.join(cell.folder, cell.product)):
        status = "failed"
    doc.update(status=status, rc=rc, seconds=round(time.time() - t0, 2))
    if rc == 124 and plan.cell_timeout:
        doc["reason"] = f"ran past cell_timeout ({plan.cell_timeout:g} s)"
    _write_state(cell, doc)
    return doc


def sbatch_script(cell: Cell, plan: Plan) -> str:
    n, g = cell.nproc, plan.gpus_per_node
    nodes = math.ceil(n / g)
    lines = ["#!/bin/bash", f"#SBATCH --job-name=commprof-{cell.config}-{n}", f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks={n}", f"#SBATCH --ntasks-per-node={min(n, g)}",
             f"#SBATCH --output={os.path.abspath(cell.folder)}/slurm-%j.out"]
    if plan.slurm.get("request_gpus"):
        lines.append(f"#SBATCH --gpus-per-node={g}")
    for key in ("partition", "time", "account", "qos"):
        if plan.slurm.get(key):
            lines.append(f"#SBATCH --{key}={plan.slurm[key]}")
    for arg in plan.slurm.get("sbatch_args", []) or []:
        lines.append(f"#SBATCH {arg}")
    rc = shlex.quote(os.path.join(os.path.abspath(cell.folder), "sweep.rc"))
    lines += ["", "# env:// rendezvous for torch.distributed (kept if already set)",
              'export MASTER_ADDR="${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)}"',
              'export MASTER_PORT="${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}"',
              f"cd {shlex.quote(os.getcwd())}", shlex.join(record_command(cell, plan)),
              f"echo $? > {rc}", ""]
    return "\n".join(lines)


def submit_slurm(cell: Cell, plan: Plan) -> dict:
    os.makedirs(cell.folder, exist_ok=True)
    script = os.path.join(cell.folder, "sweep.sbatch")
    with open(script, "w") as fh:
        fh.write(sbatch_script(cell, plan))
    sbatch = shutil.which("sbatch")
    doc = {"cell": cell.name, "command": cell.command, "launcher": "slurm", "started": time.time()}
    if not sbatch:
        doc.update(status="failed", reason="sbatch not found")
        _write_state(cell, doc)
        return doc
    proc = subprocess.run([sbatch, "--parsable", script], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["failed"]
        doc.update(status="failed", reason=lines[-1] if lines[-1].startswith("sbatch") else f"sbatch: {lines[-1]}")
    else:
        doc.update(status="running", job_id=proc.stdout.strip().split(";")[0])
    _write_state(cell, doc)
    return doc


def _job_alive(job_id: str) -> bool:
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return proc.returncode == 0 and bool(proc.stdout.strip())


def wait_slurm(cell: Cell, doc: dict, plan: Plan) -> dict:
    deadline = time.time() + plan.cell_timeout if plan.cell_timeout else None
    while _job_alive(doc["job_id"]):
        if deadline and time.time() > deadline:
            subprocess.run(["scancel", doc["job_id"]], capture_output=True)
            doc.update(status="failed", rc=124, reason=f"ran past cell_timeout ({plan.cell_timeout:g} s)")
            _write_state(cell, doc)
            return doc
        time.sleep(1.0)
    try:
        rc = int(open(os.path.join(cell.folder, "sweep.rc")).read().strip())
    except (OSError, ValueError):
        rc = None
    ok = rc == 0 and os.path.isfile(os.path.join(cell.folder, cell.product))
    doc.update(status="done" if ok else "failed", rc=rc, seconds=round(time.time() - doc["started"], 2))
    if rc is None:
        doc["reason"] = "the job ended without running the cell (cancelled, or failed to start)"
    _write_state(cell, doc)
    return doc


def sweep(plan: Plan, force: bool = False, dry_run: bool = False, out=sys.stdout) -> int:
    """Run the plan; returns 0 when every cell is complete, 1 if any failed.
    ``dry_run``: print each cell's command (local) or job script (slurm)."""
    from .progress import Bar

    todo = cells(plan)
    if dry_run:
        for c in todo:
            state_now = "complete, would be skipped" if complete(c) and not force else "would run"
            out.write(f"# {c.name} ({state_now})\n")
            out.write(sbatch_script(c, plan) + "\n" if plan.launcher == "slurm" else
                      shlex.join(record_command(c, plan)) + "\n\n")
        return 0
    results: List[dict] = []
    with Bar("sweep", len(todo), "cells") as bar:
        pending = []
        for c in todo:
            if complete(c) and not force:
                results.append(dict(state(c), status="skipped (complete)"))
                bar.advance(description=f"sweep: {c.name} complete")
                continue
            moved = _set_aside(c)
            if plan.launcher == "local":
                bar.advance(0, description=f"sweep: running {c.name}")
                doc = run_local(c, plan)
                if moved:
                    doc["previous_attempt"] = moved
                results.append(doc)
                bar.advance()
            else:
                pending.append((c, submit_slurm(c, plan)))
        for c, doc in pending:
            if doc.get("status") == "running":
                bar.advance(0, description=f"sweep: waiting for job {doc['job_id']} ({c.name})")
                doc = wait_slurm(c, doc, plan)
            results.append(doc)
            bar.advance()
    failed = [r for r in results if r.get("status") == "failed"]
    width = max(len(c.name) for c in todo)
    out.write(f"commprof sweep: {len(todo)} cells in {plan.output}/\n")
    for r in results:
        extra = ""
        if r.get("status") == "failed":
            log = os.path.join(plan.output, r["cell"], "sweep.log")
            extra = f"  exit {r.get('rc')}" + (f": {r['reason']}" if r.get("reason") else "") + \
                f"  (log: {log if os.path.exists(log) else os.path.join(plan.output, r['cell'])})"
        secs = f"{r['seconds']:8.1f} s" if isinstance(r.get("seconds"), (int, float)) else " " * 10
        out.write(f"  {r['cell'].ljust(width)}  {str(r.get('status')):<20} {secs}{extra}\n")
    out.flush()
    return 1 if failed else 0
