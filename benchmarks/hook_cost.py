"""Cost of commprof's hooks per training step, measured in one process
(not a test). A tiny model makes the step short so the hooks' cost is
visible: the same loop (DataLoader -> forward -> loss -> backward ->
optimizer) runs in alternating blocks with and without a recording session;
the difference of the medians is the cost per step (6 recorded events:
data, forward, loss forward, backward, optimizer, step).

    python benchmarks/hook_cost.py [--blocks 10] [--steps 300] [--no-nvtx]
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
    times = []
    it = iter(loader)
    for _ in range(steps):
        t0 = time.perf_counter_ns()
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
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--nvtx", action=argparse.BooleanOptionalAction, default=True,
                   help="emit NVTX ranges while recording (--no-nvtx: without)")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    ds = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
    loader = DataLoader(ds, batch_size=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plain, rec = [], []
    with tempfile.TemporaryDirectory() as tmp:
        block(model, loader, opt, args.steps)  # warm up
        for b in range(args.blocks):
            plain.append(block(model, loader, opt, args.steps))
            session.start(Config(out_dir=os.path.join(tmp, str(b)), run_id="bench", nvtx=args.nvtx),
                          hook_exits=False)
            rec.append(block(model, loader, opt, args.steps))
            session.stop()
        # the primitive every hook pays: clock reads, NVTX push/pop, one queued tuple
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
        session.stop()
    print(f"one recorded region (NVTX push/pop + 2 clock reads + queue): {prim / 1e3:.2f} us")
    p_med, r_med = statistics.median(plain), statistics.median(rec)
    diffs = sorted(r - p for r, p in zip(rec, plain))
    cost = statistics.median(diffs)
    print(f"median step: plain {p_med / 1e3:.1f} us, recorded {r_med / 1e3:.1f} us; "
          f"paired cost per step: median {cost / 1e3:.1f} us "
          f"(blocks' range {diffs[0] / 1e3:.1f} .. {diffs[-1] / 1e3:.1f} us), "
          f"{cost / 6 / 1e3:.2f} us/event; {args.blocks} alternating blocks of {args.steps} steps")


if __name__ == "__main__":
    main()
