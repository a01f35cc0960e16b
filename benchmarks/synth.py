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

from commprof.assemble import merge  # noqa: E402
from commprof.trace import schema  # noqa: E402
from commprof.trace.journal import shard_name  # noqa: E402
from commprof.trace.parquet import write_trace  # noqa: E402


def _dict(indices, values):
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(values, pa.string()))


def rank_table(rank, world, steps, buckets, seed=0):
    """One rank's events, fully vectorised (about 10 M events/s)."""
    rng = np.random.default_rng(seed * 100003 + rank)
    slow = 1.15 if rank == world // 3 else 1.0
    B = buckets
    d = (rng.normal(8e6, 1e6, steps) * slow).astype(np.int64)
    fw = (rng.normal(30e6, 2e6, steps) * slow).astype(np.int64)
    loss = rng.normal(0.3e6, 0.05e6, steps).astype(np.int64)
    bw = (rng.normal(60e6, 3e6, steps) * slow).astype(np.int64)
    opt = rng.normal(5e6, 0.5e6, steps).astype(np.int64)
    lat = rng.normal(9e6, 1e6, (steps, max(B, 1))).astype(np.int64)[:, :B]
    frac = (np.arange(1, B + 1) / (B + 1))[None, :]
    issue_rel = (bw[:, None] * frac).astype(np.int64)                    # from backward start
    end_bw_rel = np.maximum(bw, (issue_rel + lat).max(axis=1) if B else bw)
    last_issue_rel = issue_rel[:, -1] if B else bw
    dur = d + fw + loss + end_bw_rel + opt
    start = 1_000_000_000 + rank * 1000 + np.concatenate([[0], np.cumsum(dur)[:-1]])
    b0 = start + d + fw + loss
    # slots: data, fwd, loss, backward, [wait], optimizer, step, buckets...
    ts = [start, start + d, start + d + fw, b0]
    te = [start + d, start + d + fw, b0, b0 + last_issue_rel]
    cat = [1, 2, 2, 2]
    name = [0, 1, 1, 2]
    src = [0, 1, 1, 2]
    det = [0, 1, 2, -1]
    items = [256, 256, 256, -1]
    if B:
        for col, v in ((ts, b0 + last_issue_rel), (te, b0 + end_bw_rel), (cat, 4), (name, 3), (src, 2), (det, 3),
                       (items, -1)):
            col.append(v)
    ts += [b0 + end_bw_rel, start]
    te += [b0 + end_bw_rel + opt, start + dur]
    for col, v in ((cat, [2, 0]), (name, [4, 5]), (src, [3, 3]), (det, [4, -1]), (items, [-1, 256])):
        col += v
    k = len(ts)
    n = steps * (k + B)
    t_start = np.empty((steps, k + B), np.int64)
    t_end = np.empty((steps, k + B), np.int64)
    for j in range(k):
        t_start[:, j], t_end[:, j] = ts[j], te[j]
    if B:
        t_start[:, k:] = b0[:, None] + issue_rel
        t_end[:, k:] = t_start[:, k:] + lat
    slot = np.tile(np.arange(k + B), steps)
    is_b = slot >= k
    sl = np.minimum(slot, k - 1)
    cat_i = np.where(is_b, 3, np.array(cat)[sl])
    name_i = np.where(is_b, 6, np.array(name)[sl])
    src_i = np.where(is_b, 4, np.array(src)[sl])
    det_i = np.where(is_b, 5, np.array(det)[sl])
    items_a = np.where(is_b, -1, np.array(items)[sl])
    step = np.repeat(np.arange(steps, dtype=np.int32), k + B)
    seq = np.where(is_b, step.astype(np.int64) * max(B, 1) + (slot - k), -1)
    nullmask = ~is_b
    cats = ["step", "data", "compute", "comm", "wait"]
    cols = {
        "rank": pa.array(np.full(n, rank, np.int32)),
        "step": pa.array(step),
        "category": _dict(cat_i, cats),
        "name": _dict(name_i, ["dataloader", "forward", "backward", "comm_wait", "optimizer", "step", "all_reduce"]),
        "source": _dict(src_i, ["DataLoader", "nn.Module", "autograd", "torch.optim", "ddp_reducer"]),
        "detail": pa.DictionaryArray.from_arrays(
            pa.array(det_i, pa.int32(), mask=det_i < 0),
            pa.array(["_MultiProcessingDataLoaderIter", "DistributedDataParallel(ResNet)", "CrossEntropyLoss",
                      "backward", "SGD", "default"])),
        "t_start": pa.array(t_start.ravel()),
        "t_end": pa.array(t_end.ravel()),
        "dev_start": pa.nulls(n, pa.int64()),
        "dev_end": pa.nulls(n, pa.int64()),
        "bytes": pa.array(np.full(n, int(97_000_000 / max(B, 1)), np.int64), mask=nullmask),
        "dtype": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32), mask=nullmask),
                                                pa.array(["torch.float32"])),
        "group": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32), mask=nullmask), pa.array(["0"])),
        "group_size": pa.array(np.full(n, world, np.int32), mask=nullmask),
        "seq": pa.array(seq, mask=nullmask),
        "blocking": pa.array(np.zeros(n, bool), mask=nullmask),
        "items": pa.array(items_a.astype(np.int64), mask=items_a < 0),
        "value": pa.nulls(n, pa.float64()),
    }
    return pa.Table.from_arrays([cols[f.name] for f in schema.TRACE_SCHEMA], schema=schema.TRACE_SCHEMA)


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
