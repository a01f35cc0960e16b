"""Assembling a run: from what is on disk to one trace.

A *run* on disk is one of:
- a merged trace file (``trace.parquet``),
- a record folder (``DIR`` with ``trace.parquet`` or ``shards/``),
- a folder of shards: the ranks' journals (``*.cpj`` + ``*.meta.json``;
  those of killed ranks are salvaged up to their last complete block) and
  any Parquet shards ``rank*.parquet``.

A shard folder may also hold side files other tools wrote while the job
ran — kernel mode's torch.profiler windows (``kineto.<host>.<pid>.json.gz``)
and rank 0's Horovod timeline — which are converted (:mod:`commprof.convert`)
onto each rank's clock and appended to its events. This module is the one
place that uses both :mod:`commprof.trace` and :mod:`commprof.convert`; the
trace package itself reads only its own files.
"""
from __future__ import annotations

import bisect
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.compute as pc

from .trace import ends, journal, parquet, ring, schema
from .trace.journal import HOROVOD_TIMELINE_FILE, find_shards
from .trace.metadata import batch_size, run_metadata
from .trace.parquet import TRACE_FILE
from .trace.schema import TraceFormatError


@dataclass
class Run:
    path: str
    table: pa.Table
    meta: Dict[str, Any]
    ranks: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return int(self.meta.get("world_size") or 1)


#: ``detail`` of a collective a rank was inside when it ended (from its
#: ring; its ``t_end`` is its issue time)
IN_FLIGHT = "in flight when the rank ended"
#: ring records per rank kept in the metadata of a failed run
LAST_KEPT = 32


def stale_records(recs: List[Dict[str, Any]]) -> set:
    """ids of the ring records without a completion that cannot be in
    flight: a later step's collective on the same group completed after
    them (a group runs its collectives in order, and a training step
    waits for its own). Their completion was not seen (a slot rewritten
    while its done-callback ran); they are not what the rank was inside."""
    last_done: Dict[str, int] = {}
    for r in recs:
        if r["t_done"] is not None:
            last_done[r["group"]] = max(last_done.get(r["group"], -1), int(r["step"]))
    return {id(r) for r in recs
            if r["t_done"] is None and int(r["step"]) < last_done.get(r["group"], -1)}


def _ring_rows(folder: str, table: pa.Table, meta: Dict[str, Any]) -> List[tuple]:
    """The ring records a killed rank's journal lacks (the last flush did
    not come): completed ones as collectives, those in flight as
    collectives marked IN_FLIGHT. How the rank ended, the collectives it
    was inside (any rank) and its ring's last ones go to ``meta["end"]``."""
    meta["end"] = end = ends.end_of(folder, meta)
    recs = ring.read_process(folder, str(meta.get("host")), int(meta.get("pid") or 0))
    if not recs:
        return []
    t_min = min(r["t_issue"] for r in recs)
    comm = table.filter(pc.and_(pc.equal(table.column("category"), "comm"),
                                pc.greater_equal(table.column("t_start"), t_min)))
    have = set(zip(comm.column("group").to_pylist(), comm.column("seq").to_pylist()))
    rows: List[tuple] = []
    inflight = []
    # a rank that closed its journal flushed all it wanted there (rows it left
    # out, as before it became a rank, stay out); its ring still says what it
    # was inside when it ended
    closed = meta.get("status") == "complete"
    stale = stale_records(recs)
    for r in recs:
        if (r["group"], r["seq"]) in have or id(r) in stale:     # (a stale one's times are unknown)
            continue
        done = r["t_done"] is not None
        if not done:
            inflight.append({k: r[k] for k in ("group", "seq", "op", "bytes", "dtype", "source", "step")})
        if closed:
            continue
        t1 = r["t_done"] if done else r["t_issue"]
        rows.append(schema.Event(r["step"], "comm", r["op"], r["source"], None if done else IN_FLIGHT,
                                 r["t_issue"], t1, None, None, r["bytes"], r["dtype"], r["group"],
                                 r["group_size"] or None, r["seq"], r["source"] != "ddp_reducer"))
    end["in_flight"] = inflight
    end["recovered"] = len(rows) - len(inflight)
    # the step the rank reached: its last issued collective's (in flight or
    # not; the metadata's may be a flush old)
    end["step"] = recs[-1]["step"]
    # the last collectives, for the cross-rank match of a failed run
    # (trace.metadata.run_metadata keeps them only when the run failed)
    end["last"] = [[r["group"], r["seq"], r["op"], r["bytes"], r["dtype"], r["source"], r["t_done"] is not None,
                    r["writer"]] for r in recs[-LAST_KEPT:]]
    return rows


def _with_side_files(folder: str, table: pa.Table, meta: Dict[str, Any]) -> pa.Table:
    """Append what other tools wrote beside the rank's shard, moved onto the
    rank's clock: kernel mode's torch.profiler window and, for rank 0, the
    Horovod timeline; and the rank's ring records its journal lacks."""
    from .convert import horovod_timeline, kineto

    rrows = _ring_rows(folder, table, meta)
    if rrows:
        table = pa.concat_tables([table, schema.rows_to_table(rrows, int(meta.get("rank", 0)))]).unify_dictionaries()

    kpath = journal.kernel_trace_path(folder, meta.get("host"), meta.get("pid"))
    hpath = os.path.join(folder, HOROVOD_TIMELINE_FILE)
    has_h = int(meta.get("rank", -1)) == 0 and os.path.exists(hpath)
    if not os.path.exists(kpath) and not has_h:
        return table
    clock = meta.get("clock") or {}
    offset = -(int(clock.get("wall_ns_at_start", 0)) - int(clock.get("mono_ns_at_start", 0)))
    steps = table.filter(pc.equal(table.column("category"), "step"))
    ends = sorted(zip(steps.column("t_end").to_pylist(), steps.column("step").to_pylist()))
    end_times = [e for e, _ in ends]
    last = (ends[-1][1] + 1) if ends else 0

    def step_of(t):
        i = bisect.bisect_left(end_times, t)
        return ends[i][1] if i < len(ends) else last

    rows: List[tuple] = []
    if os.path.exists(kpath):
        try:
            krows, kmeta = kineto.convert(kineto.load(kpath), kpath, rank=int(meta.get("rank", 0)),
                                          kernels_only=True, clock_offset_ns=offset, step_of_time=step_of)
        except TraceFormatError as exc:
            # a torn or foreign kernel file costs its kernels, never the rank
            meta["kernels_error"] = str(exc)
            sys.stderr.write(f"commprof: kernel trace left out: {exc}\n")
        else:
            meta["kernels"] = kmeta["kernels"]
            rows += krows
    if has_h:
        hrows, summary = horovod_timeline.convert(horovod_timeline.parse(hpath), -offset)
        meta["horovod_timeline"] = summary
        rows += [r._replace(step=step_of(r.t_start)) for r in hrows]
    if not rows:
        return table
    extra = schema.rows_to_table(rows, int(meta.get("rank", 0)))
    return pa.concat_tables([table, extra]).unify_dictionaries()


def iter_shard_tables(folder: str) -> Iterator[Tuple[pa.Table, Dict[str, Any]]]:
    """(table, rank metadata) of every shard and salvaged journal, with its
    side files."""
    shards, journals = find_shards(folder)
    for s in shards:
        table, _run, ranks = parquet.read_file(s)
        meta = ranks[0] if ranks else {}
        yield _with_side_files(folder, table, meta), meta
    for j in journals:
        table, meta = journal.load_journal(j)
        if table is None and meta.get("host") and ring.read_process(folder, str(meta["host"]),
                                                                     int(meta.get("pid") or 0)):
            # killed before its first flush: what its ring holds is all there is
            table = schema.TRACE_SCHEMA.empty_table()
            meta["status"] = "salvaged"
        if table is not None:
            out = _with_side_files(folder, table, meta)
            meta["events"] = out.num_rows
            yield out, meta


def resolve(path: str) -> Tuple[str, str]:
    """('file', path) or ('shards', folder)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    merged = parquet.trace_file(path)
    if merged is not None:
        return "file", merged
    for folder in (os.path.join(path, "shards"), path):
        if os.path.isdir(folder):
            shards, journals = find_shards(folder)
            if shards or journals:
                return "shards", folder
    raise TraceFormatError(f"{path}: no commprof trace here (no {TRACE_FILE}, no shards)")


def load(path: str, columns: Optional[Sequence[str]] = None) -> Run:
    """A whole run in memory (small runs and tests; reports stream with
    :func:`iter_chunks`)."""
    kind, where = resolve(path)
    if kind == "file":
        table, run, ranks = parquet.read_file(where, columns)
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
    kind, where = resolve(path)
    if kind == "file":
        run, ranks = parquet.open_file(where)
        return (run or run_metadata(ranks)), ranks, kind, where
    metas = []
    shards, journals = find_shards(where)
    for s in shards:
        _v, _run, ranks = parquet.read_meta(s)
        metas.extend(ranks[:1])
    for j in journals:
        m = journal.read_journal_meta(j)
        if m.get("status") != "complete":
            m["status"] = "salvaged"
        metas.append(m)
    return run_metadata(metas), metas, kind, where


def iter_chunks(path: str, columns: Optional[Sequence[str]] = None,
                max_rows: int = 4_000_000, skip_empty: bool = False) -> Iterator[pa.Table]:
    """The events of a run in chunks of whole ranks (about ``max_rows``
    rows each, never splitting a rank), conformed to the trace schema.
    A merged file is read row group by row group (each holds one rank);
    a shard folder shard by shard. ``skip_empty``: a merged file's
    columns without a value in a chunk come as null-type columns
    (:func:`commprof.trace.parquet.iter_file_chunks`)."""
    kind, where = resolve(path)
    if kind == "file":
        yield from parquet.iter_file_chunks(where, columns, max_rows, skip_empty)
        return
    pending: List[pa.Table] = []
    rows = 0

    def flush():
        nonlocal pending, rows
        out = pa.concat_tables(pending, promote_options="permissive").unify_dictionaries() \
            if len(pending) > 1 else pending[0]
        pending, rows = [], 0
        return out

    for table, _meta in iter_shard_tables(where):
        if columns:
            table = table.select([c for c in columns if c in table.column_names])
        pending.append(table)
        rows += table.num_rows
        if rows >= max_rows:
            yield flush()
    if pending:
        yield flush()


def merge(folder: str, out_path: str, base_meta: Dict[str, Any]) -> Dict[str, Any]:
    """Merge every shard (and salvaged journal) of ``folder`` into one
    Parquet file, one shard in memory at a time. Returns the run metadata."""
    from .progress import track

    metas: List[Dict[str, Any]] = []
    batch_sizes: List[int] = []
    writer = parquet.TraceWriter(out_path)
    shards, journals = find_shards(folder)
    try:
        for table, meta in track(iter_shard_tables(folder), "merging", len(shards) + len(journals), "ranks"):
            metas.append(meta)
            steps = table.filter(pc.equal(table.column("category"), "step")).column("items")
            b = batch_size(steps.to_pylist())
            if b:
                batch_sizes.append(b)
            writer.write(table)
        if writer.empty:
            raise TraceFormatError(f"{folder}: no rank recorded any event")
        run = run_metadata(metas, base_meta)
        if batch_sizes and "batch_size" not in run:
            run["batch_size"] = Counter(batch_sizes).most_common(1)[0][0]
        writer.close(run, metas)
        return run
    except BaseException:
        writer.abort()
        raise


__all__ = ["Run", "load", "open_run", "iter_chunks", "merge", "resolve", "TRACE_FILE"]
