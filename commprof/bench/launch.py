"""``commprof bench``: run the worker on every rank, print the nccl-tests
table, write the JSON results and (``--model``) the alpha-beta model."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

from ..errors import UsageError
from ..trace.files import atomic_write
from .worker import elsewhere_path

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(launcher: List[str], nproc: Optional[int], worker_args: List[str]) -> List[str]:
    if nproc is not None:
        if launcher:
            raise UsageError("give either --nproc or a launcher after --, not both")
        if nproc < 1:
            raise UsageError("--nproc must be at least 1")
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                WORKER] + worker_args
    if not launcher:
        raise UsageError("commprof bench: give --nproc N or a launcher after -- (torchrun ..., srun ..., mpirun ...)")
    exe = os.path.basename(launcher[0])
    torchrun = exe == "torchrun" or "torch.distributed.run" in launcher
    return launcher + ([WORKER] if torchrun else [sys.executable, WORKER]) + worker_args


def model_of(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Alpha-beta pieces per collective and dtype from benchmark results."""
    from ..analyzers.alphabeta import fit

    groups: Dict[tuple, List[tuple]] = {}
    for r in doc.get("rows", []):
        m = r.get("out_of_place") or r.get("in_place")
        if m and m.get("time_us"):
            t_us = m.get("median_us") or m["time_us"]
            groups.setdefault((r["op"], r["dtype"]), []).append((r["bytes"], t_us * 1e-6))
    ops: Dict[str, Any] = {}
    for (op, dtype), pts in groups.items():
        if len(pts) < 2:
            continue
        sizes, times = zip(*pts)
        ops.setdefault(op, {})[dtype] = fit(sizes, times)
    # the measured rows travel with the model: commprof predict --bench / commprof model fit the cost model
    # (analyzers/collmodel.py) to them
    meas = [{"op": r["op"], "bytes": r["bytes"], "ranks": r.get("ranks") or doc.get("world_size"),
             "ranks_per_node": r.get("ranks_per_node") or doc.get("ranks_per_node"),
             "out_of_place": r.get("out_of_place"), "in_place": r.get("in_place")}
            for r in doc.get("rows", []) if r.get("out_of_place") or r.get("in_place")]
    return {"model": "alpha-beta (Hockney): T(S) = alpha + S / beta", "world_size": doc.get("world_size"),
            "backend": doc.get("backend"), "device": doc.get("device"), "source": doc.get("source", "bench"),
            "ops": ops, "measurements": meas}


def model_table(model: Dict[str, Any]) -> str:
    lines = ["# alpha-beta fit: T(S) = alpha + S / beta (least squares on relative residuals)",
             "#  collective      type  from (B)    to (B)   alpha (us)  beta (GB/s)      R^2  max rel. residual"]
    for op, by_dtype in model.get("ops", {}).items():
        for dtype, pieces in by_dtype.items():
            for p in pieces:
                lines.append(f"  {op:>14} {dtype:>9} {int(p['min_bytes']):>9} {int(p['max_bytes']):>9} "
                             f"{p['alpha_s'] * 1e6:12.2f} {p['beta_Bps'] / 1e9:12.3f} {p['r2']:8.4f} "
                             f"{p['max_rel_residual']:18.3f}")
    return "\n".join(lines) + "\n"


def extras_table(doc: Dict[str, Any]) -> str:
    """The non-blocking overlap and pipelined all_reduce results."""
    lines = []
    if doc.get("overlap"):
        lines += ["# non-blocking all_reduce overlapped with compute (OSU: overlap = 1 - (total - compute) / comm)",
                  "#       size    comm (us)  compute (us)  non-blocking total (us)  overlap %"]
        for r in doc["overlap"]:
            lines.append(f"{r['bytes']:12d} {r['comm_us']:12.1f} {r['compute_us']:13.1f} "
                         f"{r['nonblocking_total_us']:24.1f} {r['overlap_pct']:10.1f}")
    if doc.get("pipeline"):
        ks = sorted({int(k) for r in doc["pipeline"] for k in r["time_us_by_k"]})
        lines += ["# all_reduce of S pipelined in k async chunks: time (us) per k",
                  "#       size " + "".join(f"{'k=' + str(k):>11}" for k in ks) + "   best k  gain %"]
        for r in doc["pipeline"]:
            t = {int(k): v for k, v in r["time_us_by_k"].items()}
            lines.append(f"{r['bytes']:12d} " + "".join(f"{t.get(k, float('nan')):11.1f}" for k in ks)
                         + f"   {r['best_k']:6d}  {r['gain_pct']:6.1f}")
    return "\n".join(lines) + ("\n" if lines else "")


def _merge_bench(out_dir: str, doc: Dict[str, Any], cmd: List[str]) -> None:
    """The ranks' shards -> DIR/trace.parquet (source ``bench``), plus DIR/bench.json."""
    import shutil
    import time
    import uuid

    from ..assemble import merge
    from ..trace.parquet import TRACE_FILE

    shard_dir = os.path.join(out_dir, "shards")
    base = {"source": "bench", "bench_mode": doc.get("mode") or "collectives", "run_id": uuid.uuid4().hex[:12],
            "command": cmd, "launcher": "bench",
            "backend": doc.get("backend"), "device": doc.get("device"), "framework": "bench",
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    merge(shard_dir, os.path.join(out_dir, TRACE_FILE), base)
    shutil.rmtree(shard_dir, ignore_errors=True)
    atomic_write(os.path.join(out_dir, "bench.json"), json.dumps(doc, indent=1))
    sys.stderr.write(f"commprof: bench trace -> {os.path.join(out_dir, TRACE_FILE)}\n")


def bench(args) -> int:
    from ..convert.nccltests import table

    launcher = list(args.cmd)
    if launcher and launcher[0] == "--":
        launcher = launcher[1:]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        wargs = ["--ops", args.ops, "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                 "--dtypes", args.dtypes, "--warmup", str(args.warmup), "--iters", str(args.iters), "--out", out]
        out_dir = os.path.abspath(args.output) if getattr(args, "output", None) else None
        if out_dir:
            from ..record.launcher import prepare_out_dir

            prepare_out_dir(out_dir)
            wargs += ["--trace-dir", os.path.join(out_dir, "shards")]
        if getattr(args, "pairs", False):
            wargs += ["--pairs", "--pairs-bytes", str(args.pairs_bytes or 0)]
            wargs += ["--max-pairs", str(args.max_pairs)] if args.max_pairs else []
        wargs += ["--overlap"] if args.overlap else []
        wargs += ["--pipeline"] if args.pipeline else []
        cmd = worker_command(launcher, args.nproc, wargs)
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.setdefault("COMMPROF_BENCH_PORT", str(_free_port()))
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            proc = subprocess.run(cmd, env=env)
        except FileNotFoundError:
            raise UsageError(f"command not found: {cmd[0]}")
        if proc.returncode != 0:
            raise UsageError(f"the benchmark failed (exit status {proc.returncode})")
        if not os.path.exists(out):
            return _elsewhere(elsewhere_path(out), args, out_dir)
        with open(out) as fh:
            doc = json.load(fh)
    doc["source"] = "bench"
    if out_dir:
        _merge_bench(out_dir, doc, cmd)
    if doc.get("mode") == "pairs":
        return _pairs_out(doc, args)
    sys.stdout.write(table(doc))
    sys.stdout.write(extras_table(doc))
    if args.json:
        atomic_write(args.json, json.dumps(doc, indent=1))
    if args.model:
        model = model_of(doc)
        atomic_write(args.model, json.dumps(model, indent=1))
        sys.stdout.write(model_table(model))
    wrong = sum((r.get(m) or {}).get("wrong", 0) for r in doc["rows"] for m in ("out_of_place", "in_place"))
    return 1 if wrong else 0


def _elsewhere(pointer: str, args, out_dir: Optional[str]) -> int:
    """This node ran ranks of the benchmark but not rank 0 (a launcher per
    node: torchrun per node, mpirun, pdsh): rank 0's node writes the results
    and prints the report; this one says where they are and exits 0."""
    try:
        with open(pointer) as fh:
            where = json.load(fh)
    except (OSError, ValueError):
        raise UsageError("the benchmark exited 0 but no rank wrote results or said where they are "
                         "(is this a torch.distributed job?)")
    files = [f for f in (getattr(args, "json", None), getattr(args, "model", None), getattr(args, "report", None))
             if f] + ([out_dir] if out_dir else [])
    nodes = where.get("nodes")
    sys.stderr.write(f"commprof: bench: this node ({where.get('host')}) ran ranks of a {where.get('world_size')}-rank "
                     f"benchmark on {nodes} node{'' if nodes == 1 else 's'}; rank 0 ran on {where.get('rank0_host')}, "
                     f"whose "
                     f"commprof bench prints the report" + (f" and writes {', '.join(files)}" if files else "")
                     + " there\n")
    if out_dir:
        shards = os.path.join(out_dir, "shards")
        if os.path.isdir(shards) and os.listdir(shards):
            sys.stderr.write(f"commprof: bench: this node's ranks wrote their trace shards to {shards}: rank 0's "
                             f"node merges them when -o is a folder all nodes share; otherwise its trace holds "
                             f"only its own node's ranks\n")
    return 0


def _pairs_out(doc: Dict[str, Any], args) -> int:
    """``--pairs``: the report (terminal or ``--format``; ``--report FILE``
    in the format its extension names) and the JSON."""
    from .. import render
    from ..analyzers.report import pairs_report

    report = pairs_report(doc)
    fmt = getattr(args, "format", None) or "table"
    sys.stdout.write(render.get(fmt).render(report))
    if getattr(args, "report", None):
        atomic_write(args.report, render.get(render.format_for_path(args.report) or "md").render(report))
    if args.json:
        atomic_write(args.json, json.dumps(doc, indent=1))
    return 0
