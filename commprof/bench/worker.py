"""The benchmark in one rank (run by ``commprof bench``; any launcher).

For each collective and message size S (bytes, nccl-tests' S: the full
array for reduce_scatter / all_gather / all_to_all), ``--warmup``
untimed iterations, then ``--iters`` timed ones back to back (CUDA events
on GPU, the host clock on CPU), out-of-place and in-place where
torch.distributed has the variant; the time of one call is the mean over
the timed iterations, the maximum over ranks (a collective is as slow as
its slowest rank); on CPU each iteration is also timed alone, its slowest
rank taken, and the median over iterations kept (``median_us``: what the
alpha-beta model fits, robust to the scheduling outliers of a busy host,
and the same statistic ``commprof model`` takes from a bench trace). Then one more call on fresh inputs whose result is
checked element by element: ``#wrong`` counts the elements that differ,
summed over ranks, as nccl-tests counts them.

Inputs are small integers (``(rank + 1) * (i % 7 + 1)``), so every sum is
exact in every dtype used here and the check can be exact too."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
DTYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double", "int32": "int32"}


def _rank_world():
    from commprof.record.ranks import from_env

    info = from_env()
    return info.rank, info.world_size, info.local_rank


def _pattern(torch, n, rank, dtype, device):
    i = torch.arange(n, device=device, dtype=torch.int64)
    return ((rank + 1) * (i % 7 + 1)).to(dtype)


def _sum_pattern(torch, n, world, dtype, device):
    i = torch.arange(n, device=device, dtype=torch.int64)
    return (world * (world + 1) // 2 * (i % 7 + 1)).to(dtype)


class Case:
    """One collective at one size: builds buffers, runs it, checks it."""

    def __init__(self, torch, dist, op, nbytes, dtype, device, rank, world, in_place):
        self.t, self.d, self.op = torch, dist, op
        self.world, self.rank, self.dtype, self.device = world, rank, dtype, device
        self.count, self.nbytes = Case.size(torch, op, nbytes, dtype, world)
        self.in_place = in_place
        self.reset()

    @staticmethod
    def size(torch, op, nbytes, dtype, world):
        """(count, bytes) of a message of about ``nbytes``."""
        elt = torch.empty((), dtype=dtype).element_size()
        count = max(1, nbytes // elt)
        if op in ("reduce_scatter", "all_gather", "all_to_all"):
            count = max(world, count // world * world)  # the full array, a multiple of n
        return count, count * elt

    def reset(self):
        torch, n, w, r = self.t, self.count, self.world, self.rank
        if self.op == "all_reduce":
            self.buf = _pattern(torch, n, r, self.dtype, self.device)
        elif self.op == "reduce_scatter":
            self.inp = _pattern(torch, n, r, self.dtype, self.device)
            self.out = self.inp[r * (n // w):(r + 1) * (n // w)] if self.in_place else \
                torch.empty(n // w, dtype=self.dtype, device=self.device)
        elif self.op == "all_gather":
            self.out = torch.empty(n, dtype=self.dtype, device=self.device)
            part = _pattern(torch, n // w, r, self.dtype, self.device)
            if self.in_place:
                self.out[r * (n // w):(r + 1) * (n // w)] = part
                self.inp = self.out[r * (n // w):(r + 1) * (n // w)]
            else:
                self.inp = part
        elif self.op == "broadcast":
            self.buf = _pattern(torch, n, r, self.dtype, self.device)
        elif self.op == "all_to_all":
            self.inp = _pattern(torch, n, r, self.dtype, self.device)
            self.out = torch.empty(n, dtype=self.dtype, device=self.device)

    def run(self, async_op=False):
        d = self.d
        if self.op == "all_reduce":
            return d.all_reduce(self.buf, async_op=async_op)
        if self.op == "reduce_scatter":
            return d.reduce_scatter_tensor(self.out, self.inp, async_op=async_op)
        if self.op == "all_gather":  # all_gather_single: torch 2.14's name, the old one deprecated
            gather = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
            return gather(self.out, self.inp, async_op=async_op)
        if self.op == "broadcast":
            return d.broadcast(self.buf, src=0, async_op=async_op)
        return d.all_to_all_single(self.out, self.inp, async_op=async_op)

    def wrong(self) -> int:
        """Elements that differ from the exact expected result (this rank)."""
        torch, n, w, r = self.t, self.count, self.world, self.rank
        if self.op == "all_reduce":
            got, want = self.buf, _sum_pattern(torch, n, w, self.dtype, self.device)
        elif self.op == "reduce_scatter":
            got = self.out
            want = _sum_pattern(torch, n, w, self.dtype, self.device)[r * (n // w):(r + 1) * (n // w)]
        elif self.op == "all_gather":
            got = self.out
            want = torch.cat([_pattern(torch, n // w, k, self.dtype, self.device) for k in range(w)])
        elif self.op == "broadcast":
            got, want = self.buf, _pattern(torch, n, 0, self.dtype, self.device)
        else:  # rank k's chunk r arrives as chunk k
            got = self.out
            chunk = n // w
            want = torch.cat([_pattern(torch, n, k, self.dtype, self.device)[r * chunk:(r + 1) * chunk]
                              for k in range(w)])
        return int((got != want).sum().item())

    @property
    def has_in_place(self) -> bool:
        return self.op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast")

    @property
    def has_out_of_place(self) -> bool:
        return self.op in ("reduce_scatter", "all_gather", "all_to_all")


def _clock(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _max_over_ranks(torch, dist, device, values):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t.tolist()]


def _compute_for(torch, device, seconds: float):
    """A compute kernel (matmuls) calibrated to take about ``seconds``."""
    n = 256
    a = torch.randn(n, n, device=device)

    def work(reps):
        x = a
        for _ in range(reps):
            x = torch.mm(x, a).clamp_(-1, 1)
        return x

    t0 = _clock(torch, device)
    work(4)
    per = max((_clock(torch, device) - t0) / 4, 1e-7)
    reps = max(1, int(round(seconds / per)))
    return lambda: work(reps)


def _overlap(torch, dist, device, rank, world, args, max_bytes):
    """Per size (1 KiB .. max, x4): the blocking all_reduce alone (t_comm),
    compute alone (t_cpu, calibrated to about t_comm), and the non-blocking
    all_reduce started before the compute and waited for after it
    (t_total); overlap % = 100 * (1 - (t_total - t_cpu) / t_comm), clipped to
    0..100 (OSU's non-blocking collective benchmarks' definition)."""
    out = []
    for nbytes in sizes(1024, max_bytes, 4):
        buf = torch.ones(max(1, nbytes // 4), device=device)
        reps = max(3, args.iters // 2)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        dist.barrier()
        t0 = _clock(torch, device)
        for _ in range(reps):
            dist.all_reduce(buf)
        t_comm = (_clock(torch, device) - t0) / reps
        (t_comm,) = _max_over_ranks(torch, dist, device, [t_comm])
        compute = _compute_for(torch, device, t_comm)
        dist.barrier()
        t0 = _clock(torch, device)
        for _ in range(reps):
            compute()
        t_cpu = (_clock(torch, device) - t0) / reps
        dist.barrier()
        t0 = _clock(torch, device)
        for _ in range(reps):
            work = dist.all_reduce(buf, async_op=True)
            compute()
            work.wait()
        t_total = (_clock(torch, device) - t0) / reps
        t_cpu, t_total = _max_over_ranks(torch, dist, device, [t_cpu, t_total])
        ov = 100.0 * (1.0 - (t_total - t_cpu) / t_comm) if t_comm > 0 else float("nan")
        out.append({"bytes": buf.numel() * 4, "comm_us": t_comm * 1e6, "compute_us": t_cpu * 1e6,
                    "nonblocking_total_us": t_total * 1e6, "overlap_pct": min(100.0, max(0.0, ov))})
    return out


def _pipeline(torch, dist, device, rank, world, args, max_bytes):
    """Per large size (the top three of the sweep): one all_reduce of S
    split into k chunks issued asynchronously back to back, then all waited
    for, k = 1, 2, 4, ... 64; time per k and the best k."""
    out = []
    top = [s for s in sizes(8, max_bytes)][-3:]
    for nbytes in top:
        buf = torch.ones(max(64, nbytes // 4), device=device)
        times = {}
        for k in (1, 2, 4, 8, 16, 32, 64):
            chunks = list(buf.chunk(k))
            reps = max(3, args.iters // 4)
            for _ in range(max(1, args.warmup // 2)):
                for w in [dist.all_reduce(c, async_op=True) for c in chunks]:
                    w.wait()
            dist.barrier()
            t0 = _clock(torch, device)
            for _ in range(reps):
                for w in [dist.all_reduce(c, async_op=True) for c in chunks]:
                    w.wait()
            (t,) = _max_over_ranks(torch, dist, device, [(_clock(torch, device) - t0) / reps])
            times[k] = t * 1e6
        best = min(times, key=times.get)
        out.append({"bytes": buf.numel() * 4, "time_us_by_k": times, "best_k": best,
                    "gain_pct": 100.0 * (1 - times[best] / times[1])})
    return out


def sizes(lo: int, hi: int, factor: int = 2):
    s = max(1, lo)
    while s <= hi:
        yield s
        s *= factor


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="commprof bench worker (one rank)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=0, help="0: 64 MiB on CPU, 4 GiB on GPU")
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backend", default="auto")
    p.add_argument("--out", required=True, help="rank 0 writes the results (JSON) here; the first local rank of every "
                   "other node writes OUT.elsewhere (rank 0's host)")
    p.add_argument("--trace-dir", default=None,
                   help="every rank writes its timed calls here as a commprof shard (source 'bench')")
    p.add_argument("--overlap", action="store_true",
                   help="also: blocking vs non-blocking all_reduce overlapped with compute (OSU-style)")
    p.add_argument("--pipeline", action="store_true",
                   help="also: the largest all_reduces split into k = 1, 2, 4 ... 64 async chunks")
    p.add_argument("--pairs", action="store_true",
                   help="instead of the collectives: point-to-point exchanges between every pair of nodes")
    p.add_argument("--pairs-bytes", type=int, default=0, help="bytes each way per exchange (0: 4 MiB CPU, 256 MiB GPU)")
    p.add_argument("--max-pairs", type=int, default=None, help="node pairs at most (whole rounds kept at random)")
    return p


class _Timer:
    """Times a case's calls (CUDA events around the loop on a GPU, each call
    on the host clock on CPU), notes every timed call for the trace, and
    checks a case's result."""

    def __init__(self, torch, dist, device):
        self.torch, self.dist, self.device = torch, dist, device
        self.events: list = []   # (op, detail, t0 ns, t1 ns, bytes, dtype, seq) of every timed call

    def note(self, case, mode, spans) -> None:
        for t0, t1 in spans:
            self.events.append((case.op, mode, t0, t1, case.nbytes, str(case.dtype), len(self.events)))

    def timed(self, case, iters, mode):
        """(mean seconds per call, median seconds per call), each the slowest rank's."""
        torch, dist, device = self.torch, self.dist, self.device
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            dist.barrier()
            host0 = time.monotonic_ns()
            start.record()
            for _ in range(iters):
                case.run()
            end.record()
            end.synchronize()
            sec = start.elapsed_time(end) / 1e3 / iters
            # one event per call, each the mean device time (CUDA events around the loop)
            step = int(sec * 1e9)
            self.note(case, mode, [(host0 + i * step, host0 + (i + 1) * step) for i in range(iters)])
            t = torch.tensor([sec, sec], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t[0].item()), float(t[1].item())
        dist.barrier()
        each = []
        spans = []
        for _ in range(iters):
            t0 = time.monotonic_ns()
            case.run()
            t1 = time.monotonic_ns()
            spans.append((t0, t1))
            each.append((t1 - t0) / 1e9)
        self.note(case, mode, spans)
        # per call the slowest rank (the same statistic `commprof model` takes from the trace)
        t = torch.tensor([sum(each) / iters] + each, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0].item()), statistics.median(t[1:].tolist())

    def checked(self, case) -> int:
        """Ranks whose result of one call is wrong."""
        case.reset()
        case.run()
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
        w = self.torch.tensor([case.wrong()], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(w)
        return int(w.item())


def _collectives(torch, dist, device, rank, world, args, max_bytes, timer: _Timer) -> List[dict]:
    """One row per (dtype, op, size): out-of-place and in-place time,
    median and wrong ranks."""
    results: List[dict] = []
    for dname in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        dtype = getattr(torch, dname)
        for op in [o.strip() for o in args.ops.split(",") if o.strip()]:
            if op not in OPS:
                raise SystemExit(f"unknown op {op!r}; choose from {', '.join(OPS)}")
            for nbytes in sizes(args.min_bytes, max_bytes):
                row = {"op": op, "dtype": DTYPES.get(dname, dname), "redop": "sum" if op in ("all_reduce",
                       "reduce_scatter") else "none", "root": 0 if op == "broadcast" else -1, "ranks": world}
                if results and results[-1]["op"] == op and results[-1]["dtype"] == row["dtype"] \
                        and results[-1]["bytes"] == Case.size(torch, op, nbytes, dtype, world)[1]:
                    continue  # small sizes rounded up to the same count: not timed twice
                for mode in ("out_of_place", "in_place"):
                    case = Case(torch, dist, op, nbytes, dtype, device, rank, world, mode == "in_place")
                    row["bytes"], row["count"] = case.nbytes, case.count
                    if (mode == "in_place" and not case.has_in_place) or \
                            (mode == "out_of_place" and not case.has_out_of_place):
                        row[mode] = None
                        continue
                    for _ in range(args.warmup):
                        case.run()
                    sec, med = timer.timed(case, args.iters, mode)
                    row[mode] = {"time_us": sec * 1e6, "median_us": med * 1e6, "wrong": timer.checked(case)}
                results.append(row)
    return results


def _write_results(torch, dist, device, rank, world, backend, args, results, overlap, pipeline) -> None:
    """The ranks' hosts gathered (the cost model needs the ranks per node);
    rank 0 writes the results."""
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    per_host: Dict[str, int] = {}
    for h in hosts:
        per_host[str(h)] = per_host.get(str(h), 0) + 1
    ppn = max(per_host.values())
    for r in results:
        r["ranks_per_node"] = ppn
    if rank == 0:
        _write_json(args.out, {"overlap": overlap, "pipeline": pipeline, "backend": backend, "world_size": world,
                               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "warmup": args.warmup, "iters": args.iters, "hosts": hosts, "nodes": len(per_host),
                               "ranks_per_node": ppn, "rows": results})
    else:
        _write_elsewhere(args.out, hosts, world, len(per_host))


def _write_json(path: str, doc: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def elsewhere_path(out: str) -> str:
    """Where a rank that is not rank 0 says where the results went: a
    launcher per node (torchrun per node, mpirun, pdsh) runs one ``commprof
    bench`` per node, and only the node holding rank 0 gets the results."""
    return out + ".elsewhere"


def _write_elsewhere(out: str, hosts: List[Any], world: int, nodes: int) -> None:
    """The first local rank of a node without rank 0 writes the pointer
    (the others of that node write the same, to a name of their own
    first)."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        _write_json(elsewhere_path(out), {"rank0_host": str(hosts[0]), "world_size": world, "nodes": nodes,
                                          "host": socket.gethostname()})


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    import torch
    import torch.distributed as dist

    rank, world, local = _rank_world()
    cuda = torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("COMMPROF_BENCH_PORT", "29531"))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    max_bytes = args.max_bytes or ((4 << 30) if device.type == "cuda" else (64 << 20))
    if args.pairs:
        return _pairs_main(torch, dist, device, rank, world, backend, args)
    wall0, mono0 = time.time_ns(), time.monotonic_ns()
    timer = _Timer(torch, dist, device)
    results = _collectives(torch, dist, device, rank, world, args, max_bytes, timer)
    overlap = _overlap(torch, dist, device, rank, world, args, max_bytes) if args.overlap else []
    pipeline = _pipeline(torch, dist, device, rank, world, args, max_bytes) if args.pipeline else []
    if args.trace_dir:
        _write_shard(args.trace_dir, timer.events, rank, world, local, backend, device, wall0, mono0)
    _write_results(torch, dist, device, rank, world, backend, args, results, overlap, pipeline)
    _leave(torch, dist, device)
    return 0


def _leave(torch, dist, device) -> None:
    """Leave safely (torch 2.14 + gloo abort at exit otherwise, see
    docs/known-issues.md): the last collective's tensor must be released by
    the worker threads before the group goes."""
    dist.barrier()
    last = torch.zeros(1, device=device)
    dist.all_reduce(last)
    deadline = time.monotonic() + 10
    while last._use_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    dist.destroy_process_group()


def _pairs_main(torch, dist, device, rank, world, backend, args) -> int:
    """``--pairs``: the rounds of analyzers/pairs.plan, each pair exchanging
    S bytes both ways at once (isend + irecv), ``--warmup`` untimed then
    ``--iters`` timed, then 2 x ``--iters`` exchanges of 8 bytes (latency);
    a barrier between rounds. Per iteration the slower of the two sides."""
    from commprof.analyzers.pairs import plan

    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    rounds = plan([str(h) for h in hosts], args.max_pairs)
    nbytes = args.pairs_bytes or ((256 << 20) if device.type == "cuda" else (4 << 20))
    big = torch.ones(max(1, nbytes // 4), device=device)
    big_in = torch.empty_like(big)
    small, small_in = torch.ones(2, device=device), torch.empty(2, device=device)
    mine = []   # (round, a, b, kind, iteration, bytes, seconds)
    events = []  # this rank's exchanges for the trace: (op, kind, t0, t1, bytes, dtype, seq, round, group)
    wall0, mono0 = time.time_ns(), time.monotonic_ns()

    def exchange(peer, out, into):
        for req in (dist.isend(out, peer), dist.irecv(into, peer)):
            req.wait()
        if device.type == "cuda":
            torch.cuda.synchronize()

    for k, rnd in enumerate(rounds):
        pair = next(((a, b) for a, b in rnd if rank in (a, b)), None)
        if pair is not None:
            peer = pair[1] if rank == pair[0] else pair[0]
            for kind, out, into, iters in (("bw", big, big_in, args.iters), ("lat", small, small_in, 2 * args.iters)):
                for _ in range(args.warmup):
                    exchange(peer, out, into)
                for i in range(iters):
                    m0 = time.monotonic_ns()
                    exchange(peer, out, into)
                    m1 = time.monotonic_ns()        # one clock read for the JSON and the trace alike
                    mine.append((k, pair[0], pair[1], kind, i, out.numel() * 4, (m1 - m0) / 1e9))
                    events.append(("send_recv", kind, m0, m1, out.numel() * 4, "torch.float32",
                                   i, k, f"pair {pair[0]}-{pair[1]}"))
        dist.barrier()
    if args.trace_dir:
        _write_shard(args.trace_dir, events, rank, world, int(os.environ.get("LOCAL_RANK", "0")), backend, device,
                     wall0, mono0, group_size=2)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        slowest: Dict[tuple, list] = {}
        for part in everyone:
            for k, a, b, kind, i, nb, sec in part or []:
                key = (k, a, b, kind, i)
                slowest[key] = [nb, max(sec, slowest.get(key, [0, 0.0])[1])]
        samples = [{"round": k, "a": a, "b": b, "host_a": hosts[a], "host_b": hosts[b], "kind": kind,
                    "iteration": i, "bytes": nb, "seconds": sec} for (k, a, b, kind, i), (nb, sec) in
                   sorted(slowest.items())]
        _write_json(args.out, {"mode": "pairs", "backend": backend, "world_size": world, "hosts": hosts,
                               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "warmup": args.warmup, "iters": args.iters, "bytes": big.numel() * 4,
                               "rounds": rounds, "samples": samples})
    else:
        _write_elsewhere(args.out, hosts, world, len(set(map(str, hosts))))
    _leave(torch, dist, device)
    return 0


def _write_shard(folder, events, rank, world, local, backend, device, wall0, mono0,
                 group_size: Optional[int] = None) -> None:
    """This rank's timed calls as a commprof shard: one comm event per call
    (source ``bench``, detail out_of_place / in_place, group ``bench``); with
    ``--pairs`` one per exchange (op send_recv, detail bw / lat, the round as
    the step, the iteration as seq, group ``pair A-B``)."""
    import socket

    from commprof.trace.journal import shard_name
    from commprof.trace.parquet import write_trace
    from commprof.trace.schema import Event, rows_to_table

    rows = [Event(e[7] if len(e) > 7 else 0, "comm", e[0], "bench", e[1], e[2], e[3], bytes=e[4], dtype=e[5],
                  group=e[8] if len(e) > 8 else "bench", group_size=group_size or world, seq=e[6], blocking=True)
            for e in events]
    host, pid = socket.gethostname(), os.getpid()
    meta = {"rank": rank, "world_size": world, "local_rank": local, "host": host, "pid": pid,
            "rank_source": "bench", "status": "complete", "backend": backend, "device": str(device),
            "clock": {"wall_ns_at_start": wall0, "mono_ns_at_start": mono0, "boot_id": _boot_id()}}
    os.makedirs(folder, exist_ok=True)
    write_trace(rows_to_table(rows, rank), os.path.join(folder, shard_name(rank, host, pid)), {}, [meta])


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.exit(main())
