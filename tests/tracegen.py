"""Small hand-built traces with known answers (for analyzer tests)."""
import pyarrow as pa

from commprof.trace import schema
from commprof.trace.parquet import write_trace

MS = 1_000_000


def row(step, category, name, t0, t1, source="x", detail=None, nbytes=None, dtype=None, group=None,
        group_size=None, seq=None, blocking=None, items=None, value=None):
    return schema.Event(step, category, name, source, detail, int(t0), int(t1), bytes=nbytes, dtype=dtype,
                        group=group, group_size=group_size, seq=seq, blocking=blocking, items=items,
                        value=value)


def ddp_rank(rank, world, steps, data_ms=2, fwd_ms=10, bwd_ms=20, opt_ms=3, bucket_ms=8, buckets=2,
             bucket_bytes=4 * MS, batch=32, t0=0, arrive_ms=0.0, seq0=0, period_ms=None, bcast_ms=None,
             bcast_bytes=38_560):
    """Rows of one DDP-like rank: each step = data, forward, backward with
    ``buckets`` async allreduces (issued evenly inside backward, plus
    ``arrive_ms`` of lateness), a comm_wait tail, the optimizer, the step.
    With ``period_ms`` every step starts on a fixed period (ranks in lockstep).
    With ``bcast_ms`` each forward starts with DDP's blocking buffer
    broadcast of that length (``bcast_bytes``)."""
    rows = []
    t = t0
    for s in range(steps):
        if period_ms is not None:
            t = t0 + s * period_ms * MS
        start = t
        rows.append(row(s, "data", "dataloader", t, t + data_ms * MS, source="DataLoader", items=batch))
        t += data_ms * MS
        if bcast_ms is not None:
            rows.append(row(s, "comm", "broadcast", t, t + int(bcast_ms * MS), source="torch.distributed",
                            detail="_broadcast_coalesced", nbytes=bcast_bytes, dtype="torch.float32", group="0",
                            group_size=world, seq=1_000_000 + s, blocking=True))
            t += int(bcast_ms * MS)
        rows.append(row(s, "compute", "forward", t, t + fwd_ms * MS, source="nn.Module", detail="M", items=batch))
        t += fwd_ms * MS
        b0 = t
        issues = [b0 + int((bwd_ms * (b + 1) / buckets + arrive_ms) * MS) for b in range(buckets)]
        ends = [i + bucket_ms * MS for i in issues]
        for b, (i, e) in enumerate(zip(issues, ends)):
            rows.append(row(s, "comm", "all_reduce", i, e, source="ddp_reducer", detail="default",
                            nbytes=bucket_bytes, dtype="torch.float32", group="0", group_size=world,
                            seq=seq0 + s * buckets + b, blocking=False))
        last = issues[-1] if buckets else b0 + bwd_ms * MS
        end_bw = max(ends + [b0 + bwd_ms * MS])
        rows.append(row(s, "compute", "backward", b0, last, source="autograd"))
        if buckets:
            rows.append(row(s, "wait", "comm_wait", last, end_bw, source="autograd"))
        t = end_bw
        rows.append(row(s, "compute", "optimizer", t, t + opt_ms * MS, source="torch.optim"))
        t += opt_ms * MS
        end = start + period_ms * MS if period_ms is not None else t
        rows.append(row(s, "step", "step", start, end, source="torch.optim", items=batch))
    return rows


def write_run(path, ranks_rows, meta=None, rank_metas=None):
    """ranks_rows: {rank: rows}. Writes one merged trace file."""
    tables = [schema.rows_to_table(rows, r) for r, rows in sorted(ranks_rows.items())]
    table = pa.concat_tables(tables).unify_dictionaries()
    world = len(ranks_rows)
    run = {"world_size": world, "framework": "ddp", "loader": "native", "model": "M", "launcher": "test"}
    run.update(meta or {})
    metas = rank_metas or [{"rank": r, "world_size": world} for r in sorted(ranks_rows)]
    write_trace(table, str(path), run, metas)
    return str(path)


def modelled_run(world, steps, hop_s=50e-6, bus_Bps=1e9, sizes=(2e6, 8e6, 16e6), ready_frac=(0.3, 0.7, 1.0),
                 data_ms=(2.0, 6.0), fwd_ms=10.0, bwd_ms=30.0, opt_ms=4.0, seed=0, late_rank=-1, late_ms=0.0,
                 comm_time=None):
    """{rank: rows} of a DDP-like job whose communication follows a known
    model exactly: bucket k (``sizes[k]`` bytes) is ready at
    ``ready_frac[k]`` of each rank's backward, its all_reduce starts when
    the last rank has it ready and the previous bucket is done, and lasts
    hop_s x (N - 1) + S x 2(N-1)/N / bus_Bps; each rank's data time is
    uniform in ``data_ms`` every step (jitter: the slowest rank gates);
    ``late_rank`` waits ``late_ms`` longer for its data every step.
    ``comm_time(size, world, rnd)``, where given, times the buckets instead
    (e.g. ``tests/netsim.py``: a generator that is not the model)."""
    import random

    rnd = random.Random(seed * 7919 + world)
    t = [0.0] * world  # seconds, per rank
    rows = {r: [] for r in range(world)}
    seq = 0
    for s in range(steps):
        data = [rnd.uniform(*data_ms) / 1e3 + (late_ms / 1e3 if r == late_rank else 0.0) for r in range(world)]
        b0 = [t[r] + data[r] + fwd_ms / 1e3 for r in range(world)]
        b1 = [b + bwd_ms / 1e3 for b in b0]
        end = 0.0
        ends = []
        for k, (size, frac) in enumerate(zip(sizes, ready_frac)):
            ready = [b + frac * bwd_ms / 1e3 for b in b0]
            start = max(max(ready), end)
            if comm_time is not None:
                dur = comm_time(size, world, rnd) if world > 1 else 0.0
            else:
                dur = hop_s * (world - 1) + size * 2 * (world - 1) / world / bus_Bps if world > 1 else 0.0
            end = start + dur
            ends.append((ready, end))
        for r in range(world):
            ns = lambda x: int(round(x * 1e9))  # noqa: E731
            rr = rows[r]
            rr.append(row(s, "data", "dataloader", ns(t[r]), ns(t[r] + data[r]), source="DataLoader", items=32))
            rr.append(row(s, "compute", "forward", ns(t[r] + data[r]), ns(b0[r]), source="nn.Module", detail="M",
                          items=32))
            if world > 1:
                for k, (ready, e) in enumerate(ends):
                    rr.append(row(s, "comm", "all_reduce", ns(ready[r]), ns(e), source="ddp_reducer",
                                  detail="default", nbytes=int(sizes[k]), dtype="torch.float32", group="0",
                                  group_size=world, seq=seq + k, blocking=False))
            rr.append(row(s, "compute", "backward", ns(b0[r]), ns(b1[r]), source="autograd"))
            done = max(b1[r], end) if world > 1 else b1[r]
            if done > b1[r]:
                rr.append(row(s, "wait", "comm_wait", ns(b1[r]), ns(done), source="autograd"))
            rr.append(row(s, "compute", "optimizer", ns(done), ns(done + opt_ms / 1e3), source="torch.optim"))
            rr.append(row(s, "step", "step", ns(t[r]), ns(done + opt_ms / 1e3), source="torch.optim", items=32))
            t[r] = done + opt_ms / 1e3
        seq += len(sizes)
    return rows
