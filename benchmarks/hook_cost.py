"""Cost of commprof's hooks per training step, measured in one process
(not a test). A tiny model makes the step short so the hooks' cost is
visible: the same loop (DataLoader -> forward -> loss -> backward ->
optimizer) runs in alternating blocks with and without a recording session;
the difference of the medians is the cost per step. With ``--ddp`` the
model is wrapped in DistributedDataParallel (a gloo group of one process),
so the DDP comm-hook wrapper and its future callback run too.
``--per-instrument`` repeats the comparison with one instrument enabled at
a time (CPU time per step, ``time.process_time()``, next to wall time), so
each hook's share of the cost is measured, not guessed.

``--nproc 2`` runs the same paired blocks in a real 2-rank DDP job over gloo
(processes started here, the short-step MLP of ``benchmarks/overhead.py``):
every block wraps the model in a fresh DDP — plain blocks before a
recording session starts, recorded blocks inside one (their DDP timed
through the process group's hooks — DDP's C++ path — or, with
``--ddp-timing comm-hook``, through commprof's timed comm hook). Ranks
run the blocks in lockstep (the gradients' collectives pace them); a
block's first steps (DDP's bucket rebuild) are left out. The drift of a
noisy machine hits both halves of a pair alike, so the per-pair
difference resolves tens of µs where separate runs spread ±20 %.

    python benchmarks/hook_cost.py [--blocks 10] [--steps 300] [--no-nvtx] [--ddp] [--per-instrument]
    python benchmarks/hook_cost.py --nproc 2 [--blocks 16] [--steps 100] [--per-instrument]

``--hook-paths`` measures DDP's gradient path itself, without commprof
(world of one, gloo, the same MLP at ``--batch``): DDP's C++ allreduce
(no hook: the reducer copies each gradient into its bucket already divided
by the world size, one pass) vs torch's Python ``allreduce_hook`` (copy,
then ``div_`` over the bucket: a second pass, plus a Python future chain)
vs that hook with a done-callback vs with a ``then()`` chain (what
commprof adds: DDP waits for it, so completions are recorded in time). Interleaved, the order alternating.

    python benchmarks/hook_cost.py --hook-paths [--blocks 20] [--steps 40] [--batch 1]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from commprof.record import session  # noqa: E402
from commprof.record.config import Config  # noqa: E402


def block(model, loader, opt, steps):
    """(median wall ns, median CPU ns) per step over ``steps`` steps."""
    times, cpus = [], []
    it = iter(loader)
    for _ in range(steps):
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter_ns() - t0)
        cpus.append(time.process_time_ns() - c0)
    return statistics.median(times), statistics.median(cpus)


def paired(model, loader, opt, args, tmp, tag, disable=()):
    """Alternating blocks plain / recorded: (plain medians, recorded medians,
    per-block differences) for wall and CPU."""
    plain, rec = [], []
    for b in range(args.blocks):
        plain.append(block(model, loader, opt, args.steps))
        session.start(Config(out_dir=os.path.join(tmp, f"{tag}{b}"), run_id="bench", nvtx=args.nvtx,
                             disable=tuple(disable)), hook_exits=False)
        session.current().install_for("torch")
        rec.append(block(model, loader, opt, args.steps))
        session.stop()
    dw = sorted(r[0] - p[0] for r, p in zip(rec, plain))
    dc = sorted(r[1] - p[1] for r, p in zip(rec, plain))
    return plain, rec, dw, dc


SKIP = 10  # steps at the start of a 2-rank block left out (DDP rebuilds its buckets after step 0)


def _rank_main(rank, args, tmp, out):
    """One rank of the 2-rank paired measurement."""
    import json

    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=args.nproc)

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                             nn.ReLU(), nn.Linear(args.hidden, 10))

    ds = TensorDataset(torch.randn(args.batch * 64, args.dim), torch.randint(0, 10, (args.batch * 64,)))
    loader = DataLoader(ds, batch_size=args.batch, shuffle=True, drop_last=True)
    nets = {"plain": mlp(), "rec": mlp()}

    def run(kind):
        ddp = nn.parallel.DistributedDataParallel(nets[kind])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        block(ddp, loader, opt, SKIP)
        r = block(ddp, loader, opt, args.steps)
        dist.barrier()
        return r

    from commprof.record.instruments import ALL

    sets = [("all instruments", (), "auto"), ("all instruments, --ddp-timing comm-hook", (), "comm-hook")]
    if args.per_instrument:
        sets += [("ddp alone, --ddp-timing comm-hook", tuple(o for o in ALL if o != "ddp"), "comm-hook")]
        sets += [(f"{n} alone", tuple(o for o in ALL if o != n), "auto")
                 for n in ("ddp", "module", "autograd", "optim", "dataloader", "collectives")]
    run("plain")  # warm up
    rows = []
    for name, disable, ddp_timing in sets:
        pairs = []
        for b in range(args.blocks):
            first = b % 2  # alternate which half of the pair runs first
            res = {}
            for kind in (("rec", "plain") if first else ("plain", "rec")):
                if kind == "rec":
                    session.start(Config(out_dir=os.path.join(tmp, f"{len(rows)}-{b}-r{rank}"), run_id="bench",
                                         nvtx=args.nvtx, disable=disable, ddp_timing=ddp_timing),
                                  hook_exits=False)
                    session.current().install_for("torch")
                    res[kind] = run(kind)
                    session.stop()
                else:
                    res[kind] = run(kind)
            pairs.append((res["plain"], res["rec"]))
        rows.append((name, pairs))
    gathered = [None] * args.nproc
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(gathered, fh)
    dist.barrier()
    dist.destroy_process_group()


def two_ranks(args):
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(_rank_main, args=(args, tmp, out), nprocs=args.nproc, join=True)
        ranks = json.load(open(out))
    print(f"\n{args.nproc} ranks, DDP over gloo (MLP {args.dim}-{args.hidden}-{args.hidden}-10, batch {args.batch}), "
          f"{args.blocks} paired blocks of {args.steps} steps (+{SKIP} left out), NVTX {'on' if args.nvtx else 'off'}; "
          f"CPU = process_time of each rank (all its threads), cost = recorded - plain per pair\n")
    print("| recorded with | plain step wall (µs) | wall cost/step (µs) median [IQR] | "
          "CPU cost/step per rank (µs) median [IQR] | CPU cost / plain CPU |")
    print("|---|---:|---:|---:|---:|")
    for i, (name, _) in enumerate(ranks[0]):
        dw = sorted(p[1][0] - p[0][0] for p in ranks[0][i][1])
        dc = sorted(p[1][1] - p[0][1] for r in ranks for p in r[i][1])
        pw = statistics.median(p[0][0] for p in ranks[0][i][1])
        pc = statistics.median(p[0][1] for r in ranks for p in r[i][1])

        def iqr(v):
            q = statistics.quantiles(v, n=4)
            return f"{q[0] / 1e3:+.0f} .. {q[2] / 1e3:+.0f}"

        print(f"| {name} | {pw / 1e3:.0f} | {statistics.median(dw) / 1e3:+.1f} [{iqr(dw)}] | "
              f"{statistics.median(dc) / 1e3:+.1f} [{iqr(dc)}] | {statistics.median(dc) / pc * 100:+.2f} % |")


def hook_paths(args):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch.set_num_threads(1)

    def with_callback(state, bucket):
        fut = allreduce_hook(state, bucket)
        fut.add_done_callback(lambda f: None)
        return fut

    def chained(state, bucket):
        return allreduce_hook(state, bucket).then(lambda f: f.value())

    hooks = {"DDP's C++ path (no hook)": None, "torch allreduce_hook (Python)": allreduce_hook,
             "allreduce_hook + done-callback": with_callback, "allreduce_hook + then() chain": chained}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        ds = TensorDataset(torch.randn(args.batch * 64, args.dim), torch.randint(0, 10, (args.batch * 64,)))
        loader = DataLoader(ds, batch_size=args.batch, shuffle=True, drop_last=True)
        runs = {}
        for name, hook in hooks.items():
            torch.manual_seed(0)
            ddp = nn.parallel.DistributedDataParallel(nn.Sequential(
                nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                nn.Linear(args.hidden, 10)))
            if hook is not None:
                ddp.register_comm_hook(None, hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
            block(ddp, loader, opt, 20)
            runs[name] = (ddp, opt, [])
        # DDP's C++ path again, its collectives seen by process-group pre/post hooks (torch >= 2.10;
        # what commprof uses when no comm hook is registered): registered around that block only
        pg = dist.group.WORLD
        pg_hooks = hasattr(pg, "register_pre_hook")
        if pg_hooks:
            torch.manual_seed(0)
            ddp = nn.parallel.DistributedDataParallel(nn.Sequential(
                nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                nn.Linear(args.hidden, 10)))
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
            block(ddp, loader, opt, 20)
            runs["C++ path + process-group hooks"] = (ddp, opt, [])
        seen = []
        _ALLREDUCE = torch._C._distributed_c10d.HookOpName.ALLREDUCE if pg_hooks else None

        def pre(a):
            if a.name == _ALLREDUCE:
                t = a.input_tensors[0]
                seen.append((time.monotonic_ns(), t.numel() * t.element_size(), t.dtype))

        def post(a):
            a.work.get_future().add_done_callback(lambda f: seen.append(time.monotonic_ns()))

        names = list(runs)
        for b in range(args.blocks):
            for name in (names if b % 2 == 0 else names[::-1]):
                ddp, opt, res = runs[name]
                if name == "C++ path + process-group hooks":
                    pg.register_pre_hook(7, pre)
                    pg.register_post_hook(7, post)
                res.append(block(ddp, loader, opt, args.steps))
                if name == "C++ path + process-group hooks":
                    pg.unregister_pre_hook(7)
                    pg.unregister_post_hook(7)
                    seen.clear()
        dist.destroy_process_group()
    base = runs[names[0]][2]
    print(f"\nDDP gradient paths, world of one (gloo), MLP {args.dim}-{args.hidden}-{args.hidden}-10, batch "
          f"{args.batch}, {args.blocks} interleaved blocks of {args.steps} steps\n")
    print("| path | step wall (µs) | CPU/step (µs) | CPU vs C++ path, per block median [IQR] (µs) |")
    print("|---|---:|---:|---:|")
    for name in names:
        res = runs[name][2]
        d = sorted(r[1] - p[1] for r, p in zip(res, base))
        q = statistics.quantiles(d, n=4)
        print(f"| {name} | {statistics.median(r[0] for r in res) / 1e3:.0f} | "
              f"{statistics.median(r[1] for r in res) / 1e3:.0f} | {statistics.median(d) / 1e3:+.0f} "
              f"[{q[0] / 1e3:+.0f} .. {q[2] / 1e3:+.0f}] |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--nvtx", action=argparse.BooleanOptionalAction, default=True,
                   help="emit NVTX ranges while recording (--no-nvtx: without)")
    p.add_argument("--ddp", action="store_true", help="wrap the model in DDP (gloo, world of one)")
    p.add_argument("--per-instrument", action="store_true",
                   help="also measure each instrument alone (the others disabled)")
    p.add_argument("--nproc", type=int, default=0,
                   help="N >= 1: a real N-rank DDP job over gloo (paired blocks per rank, a fresh DDP per block)")
    p.add_argument("--dim", type=int, default=512, help="--nproc N: MLP input width")
    p.add_argument("--hidden", type=int, default=1024, help="--nproc N: MLP hidden width")
    p.add_argument("--batch", type=int, default=32,
                   help="--nproc N: batch per rank (1: the same hooks and buckets around almost no compute, "
                        "so their cost in µs stands out of the noise)")
    p.add_argument("--hook-paths", action="store_true",
                   help="DDP's C++ path vs Python comm hooks, without commprof (world of one)")
    args = p.parse_args()
    if args.hook_paths:
        return hook_paths(args)
    if args.nproc >= 1:
        return two_ranks(args)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    ds = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
    loader = DataLoader(ds, batch_size=32)
    with tempfile.TemporaryDirectory() as tmp:
        if args.ddp:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
            model = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        block(model, loader, opt, args.steps)  # warm up
        plain, rec, dw, dc = paired(model, loader, opt, args, tmp, "all")
        rows = [("all instruments", plain, rec, dw, dc)]
        if args.per_instrument:
            from commprof.record.instruments import ALL

            for name in ("optim", "autograd", "module", "dataloader", "ddp", "collectives"):
                if name == "ddp" and not args.ddp:
                    continue
                others = [n for n in ALL if n != name]
                rows.append((f"{name} alone",) + paired(model, loader, opt, args, tmp, name, others))
        # the primitive every hook pays: clock reads, NVTX push/pop, one queued row
        sess = session.start(Config(out_dir=os.path.join(tmp, "prim"), run_id="bench", nvtx=args.nvtx),
                             hook_exits=False)
        rec_ = sess.recorder
        n = 200_000
        t0 = time.perf_counter_ns()
        for _ in range(n):
            rec_.nvtx.push("forward")
            a = time.monotonic_ns()
            b = time.monotonic_ns()
            rec_.nvtx.pop()
            rec_.region("compute", "forward", "nn.Module", "M", a, b, 32)
        prim = (time.perf_counter_ns() - t0) / n
        t0 = time.perf_counter_ns()
        for _ in range(n):
            rec_.region("compute", "forward", "nn.Module", "M", 1, 2, 32)
        emit = (time.perf_counter_ns() - t0) / n
        rec_.flush()
        from commprof.trace.schema import Event

        batch = [Event(0, "compute", "forward", "nn.Module", "M", i, i + 1, items=32) for i in range(n)]
        t0 = time.perf_counter_ns()
        rec_.flusher.journal.append(batch)
        pack = (time.perf_counter_ns() - t0) / n
        session.stop()
    print(f"one recorded region (NVTX push/pop + 2 clock reads + queue): {prim / 1e3:.2f} us; "
          f"the emission alone (Event + deque.append): {emit / 1e3:.2f} us; "
          f"journal packing in the writer thread: {pack / 1e3:.2f} us/event")
    what = "DDP (world of one)" if args.ddp else "no DDP"
    print(f"\n{args.blocks} alternating blocks of {args.steps} steps, {what}, "
          f"NVTX {'on' if args.nvtx else 'off'}\n")
    print("| recorded with | plain step (µs) | wall cost/step (µs), median [range] "
          "| CPU cost/step (µs), median [range] |")
    print("|---|---:|---:|---:|")
    for name, plain, rec, dw, dc in rows:
        p_med = statistics.median(x[0] for x in plain)
        print(f"| {name} | {p_med / 1e3:.1f} | {statistics.median(dw) / 1e3:+.1f} [{dw[0] / 1e3:+.0f} .. "
              f"{dw[-1] / 1e3:+.0f}] | {statistics.median(dc) / 1e3:+.1f} [{dc[0] / 1e3:+.0f} .. "
              f"{dc[-1] / 1e3:+.0f}] |")
    if args.ddp:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
