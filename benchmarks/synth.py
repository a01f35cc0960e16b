"""Synthetic commprof traces of realistic shape (for benchmarks, not tests).

Per rank and step: one data wait, forward (model + loss), backward split
into compute and the DDP wait, ``--buckets`` bucketed allreduces, the
optimizer, the step event, and one metric every 50 steps. Timings are drawn
around a ResNet-50-like profile with per-rank jitter and a slow rank.

    python benchmarks/synth.py OUT_DIR --ranks 64 --steps 1000 [--merge]
"""
import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from commprof import schema  # noqa: E402
from commprof.recorder import shard_name, write_trace  # noqa: E402
from commprof.trace import merge  # noqa: E402


def rank_table(rank, world, steps, buckets, seed=0):
    rng = np.random.default_rng(seed * 100003 + rank)
    slow = 1.15 if rank == world // 3 else 1.0
    per_step = 7 + buckets + (1 if buckets else 0)
    n = steps * per_step
    cols = {k: [] for k in schema.EVENT_COLUMNS}
    t = 1_000_000_000 + rank * 1000
    bucket_bytes = int(97_000_000 / max(buckets, 1))
    for s in range(steps):
        d = int(rng.normal(8e6, 1e6) * slow)
        fw = int(rng.normal(30e6, 2e6) * slow)
        loss = int(rng.normal(0.3e6, 0.05e6))
        bw = int(rng.normal(60e6, 3e6) * slow)
        opt = int(rng.normal(5e6, 0.5e6))
        start = t
        ev = [("data", "dataloader", "DataLoader", "_MultiProcessingDataLoaderIter", t, t + d, 256)]
        t += d
        ev.append(("compute", "forward", "nn.Module", "DistributedDataParallel(ResNet)", t, t + fw, 256))
        t += fw
        ev.append(("compute", "forward", "nn.Module", "CrossEntropyLoss", t, t + loss, 256))
        t += loss
        b0 = t
        comm = []
        issue = b0
        for b in range(buckets):
            issue = b0 + int(bw * (b + 1) / (buckets + 1))
            lat = int(rng.normal(9e6, 1e6))
            comm.append(("comm", "all_reduce", "ddp_reducer", "default", issue, issue + lat, None, b))
        last_issue = issue if buckets else b0 + bw
        ev.append(("compute", "backward", "autograd", None, b0, last_issue, None))
        end_bw = max([c[5] for c in comm] + [b0 + bw])
        if buckets:
            ev.append(("wait", "comm_wait", "autograd", "backward", last_issue, end_bw, None))
        t = end_bw
        ev.append(("compute", "optimizer", "torch.optim", "SGD", t, t + opt, None))
        t += opt
        ev.append(("step", "step", "torch.optim", None, start, t, 256))
        for cat, name, src, det, a, b, items in ev:
            for k, v in (("step", s), ("category", cat), ("name", name), ("source", src), ("detail", det),
                         ("t_start", a), ("t_end", b), ("dev_start", None), ("dev_end", None),
                         ("bytes", None), ("dtype", None), ("group", None), ("group_size", None),
                         ("seq", None), ("blocking", None), ("items", items), ("value", None)):
                cols[k].append(v)
        for cat, name, src, det, a, b, _, bi in comm:
            for k, v in (("step", s), ("category", cat), ("name", name), ("source", src), ("detail", det),
                         ("t_start", a), ("t_end", b), ("dev_start", None), ("dev_end", None),
                         ("bytes", bucket_bytes), ("dtype", "torch.float32"), ("group", "0"),
                         ("group_size", world), ("seq", s * buckets + bi), ("blocking", False),
                         ("items", None), ("value", None)):
                cols[k].append(v)
    arrays = []
    for f in schema.EVENT_FIELDS:
        a = pa.array(cols[f.name], type=f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
        arrays.append(a.dictionary_encode() if pa.types.is_dictionary(f.type) else a)
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema.JOURNAL_SCHEMA)
    return pa.Table.from_batches([schema.add_rank(batch, rank)])


def write(out_dir, ranks, steps, buckets=4):
    shard_dir = os.path.join(out_dir, "shards")
    os.makedirs(shard_dir, exist_ok=True)
    events = 0
    for r in range(ranks):
        table = rank_table(r, ranks, steps, buckets)
        events += table.num_rows
        meta = {"rank": r, "world_size": ranks, "host": f"node{r // 4}", "pid": 1000 + r,
                "models": {"DistributedDataParallel(ResNet)": 25_557_032}, "framework": "ddp",
                "loader": "native", "backend": "nccl", "status": "complete", "run_id": "synth"}
        write_trace(table, os.path.join(shard_dir, shard_name(r, meta["host"], meta["pid"])), {}, [meta])
    return shard_dir, events


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--buckets", type=int, default=4)
    p.add_argument("--merge", action="store_true", help="merge the shards into OUT/trace.parquet")
    args = p.parse_args()
    t0 = time.perf_counter()
    shard_dir, events = write(args.out, args.ranks, args.steps, args.buckets)
    shard_bytes = sum(os.path.getsize(os.path.join(shard_dir, f)) for f in os.listdir(shard_dir))
    print(f"{events} events in {args.ranks} shards: {shard_bytes} bytes "
          f"({shard_bytes / events:.2f} B/event), {time.perf_counter() - t0:.1f} s")
    if args.merge:
        t0 = time.perf_counter()
        path = os.path.join(args.out, "trace.parquet")
        merge(shard_dir, path, {"run_id": "synth"})
        size = os.path.getsize(path)
        print(f"merged: {size} bytes ({size / events:.2f} B/event), {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
