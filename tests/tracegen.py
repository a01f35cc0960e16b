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
