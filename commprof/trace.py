"""Reading and merging traces.

A *run* on disk is one of:
- a merged trace file (``trace.parquet``),
- a record folder (``DIR`` with ``trace.parquet`` or ``shards/``),
- a folder of shards: finished per-rank ``rank*.parquet`` files and the
  journals (``*.arrows`` + ``*.meta.json``) of ranks that never finished
  (killed): those are salvaged up to their last complete batch.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import schema
from .recorder import read_journal, write_trace
from .schema import TraceFormatError

TRACE_FILE = "trace.parquet"


@dataclass
class Run:
    path: str
    table: pa.Table
    meta: Dict[str, Any]
    ranks: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return int(self.meta.get("world_size") or 1)


# ------------------------------------------------------------------ reading
def _read_parquet(path: str, columns: Optional[Sequence[str]] = None) -> Tuple[pa.Table, Dict, List]:
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        if os.path.getsize(path) == 0:
            raise TraceFormatError(f"{path}: empty file") from exc
        raise TraceFormatError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from exc
    version, run, ranks = _meta_of(path, pf.metadata.metadata)
    try:
        table = pf.read(columns=[c for c in columns if c in pf.schema_arrow.names] if columns else None)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise TraceFormatError(f"{path}: truncated or corrupt Parquet ({_first_line(exc)})") from exc
    try:
        table = schema.conform(table, version)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None
    return table, run, ranks


def _meta_of(path: str, metadata):
    try:
        return schema.decode_meta(metadata)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def find_shards(folder: str) -> Tuple[List[str], List[str]]:
    """(finished shard files, orphaned journals) in ``folder``."""
    shards = sorted(glob.glob(os.path.join(folder, "rank*.parquet")))
    done = {tuple(os.path.basename(s).split(".")[1:3]) for s in shards}
    journals = []
    for j in sorted(glob.glob(os.path.join(folder, "*.arrows"))):
        host_pid = tuple(os.path.basename(j)[: -len(".arrows")].rsplit(".", 1))
        if host_pid not in done:
            journals.append(j)
    return shards, journals


def salvage_journal(path: str) -> Tuple[Optional[pa.Table], Dict[str, Any]]:
    meta_path = path[: -len(".arrows")] + ".meta.json"
    meta: Dict[str, Any] = {}
    try:
        with open(meta_path) as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        meta = {}
    batches = read_journal(path)
    if not batches:
        return None, meta
    rank = int(meta.get("rank", -1))
    meta["status"] = "salvaged"
    meta["events"] = sum(b.num_rows for b in batches)
    table = pa.Table.from_batches([schema.add_rank(b, rank) for b in batches], schema=schema.TRACE_SCHEMA)
    return table, meta


HOROVOD_TIMELINE_FILE = "horovod_timeline.json"


def _with_kernels(folder: str, table: pa.Table, meta: Dict[str, Any]) -> pa.Table:
    """Append what other tools wrote beside the rank's shard, moved onto the
    rank's clock: kernel mode's torch.profiler window
    (``kineto.<host>.<pid>.json.gz``) and, for rank 0, the Horovod timeline."""
    kpath = os.path.join(folder, f"kineto.{meta.get('host')}.{meta.get('pid')}.json.gz")
    hpath = os.path.join(folder, HOROVOD_TIMELINE_FILE)
    has_h = int(meta.get("rank", -1)) == 0 and os.path.exists(hpath)
    if not os.path.exists(kpath) and not has_h:
        return table
    from . import kineto

    clock = meta.get("clock") or {}
    offset = -(int(clock.get("wall_ns_at_start", 0)) - int(clock.get("mono_ns_at_start", 0)))
    steps = table.filter(pc.equal(table.column("category"), "step"))
    ends = sorted(zip(steps.column("t_end").to_pylist(), steps.column("step").to_pylist()))
    end_times = [e for e, _ in ends]
    last = (ends[-1][1] + 1) if ends else 0

    def step_of(t):
        import bisect

        i = bisect.bisect_left(end_times, t)
        return ends[i][1] if i < len(ends) else last

    rows: List[tuple] = []
    if os.path.exists(kpath):
        krows, kmeta = kineto.convert(kineto._load(kpath), kpath, rank=int(meta.get("rank", 0)),
                                      kernels_only=True, clock_offset_ns=offset, step_of_time=step_of)
        meta["kernels"] = kmeta["kernels"]
        rows += krows
    if has_h:
        from . import horovod_timeline

        hrows, summary = horovod_timeline.convert(horovod_timeline.parse(hpath), -offset)
        meta["horovod_timeline"] = summary
        rows += [(step_of(r[5]),) + r[1:] for r in hrows]
    if not rows:
        return table
    extra = schema.add_rank(schema.rows_to_batch(rows), int(meta.get("rank", 0)))
    return pa.concat_tables([table, pa.Table.from_batches([extra])]).unify_dictionaries()


def iter_shard_tables(folder: str) -> Iterator[Tuple[pa.Table, Dict[str, Any]]]:
    shards, journals = find_shards(folder)
    for s in shards:
        table, _run, ranks = _read_parquet(s)
        meta = ranks[0] if ranks else {}
        yield _with_kernels(folder, table, meta), meta
    for j in journals:
        table, meta = salvage_journal(j)
        if table is not None:
            yield _with_kernels(folder, table, meta), meta


def _resolve(path: str) -> Tuple[str, str]:
    """('file', path) or ('shards', folder)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    if os.path.isfile(path):
        return "file", path
    merged = os.path.join(path, TRACE_FILE)
    if os.path.isfile(merged):
        return "file", merged
    for folder in (os.path.join(path, "shards"), path):
        if os.path.isdir(folder):
            shards, journals = find_shards(folder)
            if shards or journals:
                return "shards", folder
    raise TraceFormatError(f"{path}: no commprof trace here (no {TRACE_FILE}, no shards)")


def load(path: str, columns: Optional[Sequence[str]] = None) -> Run:
    kind, where = _resolve(path)
    if kind == "file":
        table, run, ranks = _read_parquet(where, columns)
        if not run:
            run = run_metadata(ranks)
        return Run(where, table, run, ranks)
    tables, metas = [], []
    for table, meta in iter_shard_tables(where):
        tables.append(table)
        metas.append(meta)
    if not tables:
        raise TraceFormatError(f"{path}: shards hold no events")
    table = pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()
    if columns:
        table = table.select([c for c in columns if c in table.column_names])
    return Run(where, table, run_metadata(metas), metas)


def open_run(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]], str, str]:
    """Metadata of a run without reading its events: (run meta, rank metas,
    kind, where) with kind 'file' or 'shards'."""
    kind, where = _resolve(path)
    if kind == "file":
        try:
            pf = pq.ParquetFile(where)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
            if os.path.getsize(where) == 0:
                raise TraceFormatError(f"{where}: empty file") from exc
            raise TraceFormatError(f"{where}: not a readable Parquet file ({_first_line(exc)})") from exc
        version, run, ranks = _meta_of(where, pf.metadata.metadata)
        if version > schema.SCHEMA_VERSION or version < schema.MIN_READ_VERSION:
            raise TraceFormatError(f"{where}: schema version {version} is "
                                   + ("newer than this commprof reads" if version > schema.SCHEMA_VERSION
                                      else "older than the oldest readable") + f" ({schema.SCHEMA_VERSION})")
        missing = [c for c in schema.REQUIRED_COLUMNS if c not in pf.schema_arrow.names]
        if missing:
            raise TraceFormatError(f"{where}: missing required column(s): " + ", ".join(missing))
        return (run or run_metadata(ranks)), ranks, kind, where
    metas = []
    shards, journals = find_shards(where)
    for s in shards:
        _v, _run, ranks = _meta_of(s, pq.ParquetFile(s).metadata.metadata)
        metas.extend(ranks[:1])
    for j in journals:
        try:
            with open(j[: -len(".arrows")] + ".meta.json") as fh:
                m = json.load(fh)
        except (OSError, ValueError):
            m = {}
        m["status"] = "salvaged"
        metas.append(m)
    return run_metadata(metas), metas, kind, where


def iter_chunks(path: str, columns: Optional[Sequence[str]] = None,
                max_rows: int = 4_000_000) -> Iterator[pa.Table]:
    """The events of a run in chunks of whole ranks (about ``max_rows``
    rows each, never splitting a rank), conformed to the trace schema.
    A merged file is read row group by row group (each holds one rank);
    a shard folder shard by shard."""
    kind, where = _resolve(path)
    pending: List[pa.Table] = []
    rows = 0

    def flush():  # shard folders
        nonlocal pending, rows
        out = pa.concat_tables(pending, promote_options="permissive").unify_dictionaries() \
            if len(pending) > 1 else pending[0]
        pending, rows = [], 0
        return out

    if kind == "shards":
        for table, _meta in iter_shard_tables(where):
            if columns:
                table = table.select([c for c in columns if c in table.column_names])
            pending.append(table)
            rows += table.num_rows
            if rows >= max_rows:
                yield flush()
        if pending:
            yield flush()
        return
    pf = pq.ParquetFile(where)
    version, _run, _ranks = _meta_of(where, pf.metadata.metadata)
    names = pf.schema_arrow.names
    wanted = list(columns or names) + [c for c in schema.REQUIRED_COLUMNS if columns and c not in columns]
    cols = [c for c in wanted if c in names]
    rank_idx = names.index("rank")
    md = pf.metadata
    # Plan chunks from the row-group statistics, then read each chunk's row
    # groups in one multi-threaded call; the next chunk is read in the
    # background while the caller analyses the current one.
    plan: List[List[int]] = [[]]
    rows, last_rank = 0, None
    for i in range(md.num_row_groups):
        stats = md.row_group(i).column(rank_idx).statistics
        lo, hi = (stats.min, stats.max) if stats is not None and stats.has_min_max else (None, None)
        if plan[-1] and rows >= max_rows and (lo is None or lo != last_rank):
            plan.append([])
            rows = 0
        plan[-1].append(i)
        rows += md.row_group(i).num_rows
        last_rank = hi
    plan = [p for p in plan if p]

    def read(groups):
        try:
            t = pf.read_row_groups(groups, columns=cols, use_threads=True)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
            raise TraceFormatError(f"{where}: truncated or corrupt Parquet ({_first_line(exc)})") from exc
        t = schema.conform(t, version)
        return t.select([c for c in columns if c in t.column_names]) if columns else t

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(read, plan[0]) if plan else None
        for k in range(len(plan)):
            table = future.result()
            future = pool.submit(read, plan[k + 1]) if k + 1 < len(plan) else None
            yield table


# ------------------------------------------------------------------ merging
def run_metadata(ranks: List[Dict[str, Any]], base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run-level metadata derived from the ranks' metadata."""
    run: Dict[str, Any] = dict(base or {})
    if not ranks:
        return run
    run.setdefault("run_id", ranks[0].get("run_id"))
    run.setdefault("launcher", ranks[0].get("launcher"))
    run["world_size"] = max(int(r.get("world_size") or 1) for r in ranks)
    run["ranks_recorded"] = len(ranks)
    run["hosts"] = sorted({r.get("host") for r in ranks if r.get("host")})
    run["salvaged_ranks"] = sorted(r.get("rank") for r in ranks if r.get("status") == "salvaged")
    for key in ("torch", "cuda", "backend", "framework", "loader", "loader_workers", "model",
                "batch_size", "image_size", "dataset_size", "kernel_window", "zero_stage", "horovod", "deepspeed", "dali"):
        values = [r.get(key) for r in ranks if r.get(key) is not None]
        if values:
            counts = Counter(json.dumps(v, sort_keys=True) for v in values)
            run.setdefault(key, json.loads(counts.most_common(1)[0][0]))
    models: Dict[str, int] = {}
    for r in ranks:
        for name, n in (r.get("models") or {}).items():
            models[name] = max(models.get(name, 0), int(n))
    if models:
        top = max(models.items(), key=lambda kv: kv[1])[0]
        # "DistributedDataParallel(ResNet)" -> "ResNet"
        run.setdefault("model", top[top.index("(") + 1:-1] if top.endswith(")") and "(" in top else top)
        run.setdefault("model_params", max(models.values()))
    labels: Dict[str, str] = {}
    for r in ranks:
        labels.update(r.get("labels") or {})
    if labels:
        run["labels"] = {**labels, **(run.get("labels") or {})}
    run["schema_version"] = schema.SCHEMA_VERSION
    return run


def merge(folder: str, out_path: str, base_meta: Dict[str, Any]) -> Dict[str, Any]:
    """Merge every shard (and salvaged journal) of ``folder`` into one
    Parquet file, one shard in memory at a time. Returns the run metadata."""
    metas: List[Dict[str, Any]] = []
    tmp = out_path + ".tmp"
    writer = None
    batch_sizes: List[int] = []
    try:
        for table, meta in iter_shard_tables(folder):
            metas.append(meta)
            steps = table.filter(pc.equal(table.column("category"), "step")).column("items")
            vals = [v for v in steps.to_pylist() if v]
            if vals:
                batch_sizes.append(int(statistics.median(vals)))
            if writer is None:
                writer = pq.ParquetWriter(tmp, schema.TRACE_SCHEMA, compression="zstd",
                                          use_dictionary=True, write_statistics=True)
            writer.write_table(table.cast(schema.TRACE_SCHEMA), row_group_size=1 << 20)
        if writer is None:
            raise TraceFormatError(f"{folder}: no rank recorded any event")
        run = run_metadata(metas, base_meta)
        if batch_sizes and "batch_size" not in run:
            run["batch_size"] = Counter(batch_sizes).most_common(1)[0][0]
        writer.add_key_value_metadata({k.decode(): v.decode() for k, v in schema.encode_meta(run, metas).items()})
        writer.close()
        writer = None
        os.replace(tmp, out_path)
        return run
    finally:
        if writer is not None:
            writer.close()
            if os.path.exists(tmp):
                os.remove(tmp)


__all__ = ["Run", "load", "merge", "write_trace", "find_shards", "TRACE_FILE"]
