"""``commprof import kineto``: every rank file converted by the columnar
importer (:mod:`.kineto_fast`) in worker processes or Dask tasks, written
into one trace rank by rank (memory bounded by a few ranks' events)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ..trace.schema import TraceFormatError
from .kineto import find_files


def _convert_one(job):
    """Worker: one rank file -> (Arrow IPC bytes of its table, rank metadata)."""
    import pyarrow as pa

    from .kineto_fast import convert_file

    path, rank = job
    table, meta = convert_file(path, rank)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes(), meta


def _tables(files: List[str], rank: Optional[int], workers: int, dask: Optional[str] = None):
    """(table, meta) per file, in file order, converted by ``workers``
    processes (or tasks on a Dask cluster); at most about 2 x workers ranks
    in memory at a time."""
    import pyarrow as pa

    jobs = [(f, rank) for f in files]
    if dask:
        from .dask_runner import map_ordered
        results = map_ordered(dask, _convert_one, jobs)
    elif workers <= 1 or len(files) == 1:
        results = map(_convert_one, jobs)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
        results = _bounded(pool, _convert_one, jobs, 2 * workers)
    for data, meta in results:
        yield pa.ipc.open_stream(data).read_all(), meta


def _bounded(pool, fn, jobs, depth):
    """pool.map in order with at most ``depth`` results pending."""
    from collections import deque

    with pool:
        pending: deque = deque()
        it = iter(jobs)
        for job in it:
            pending.append(pool.submit(fn, job))
            if len(pending) >= depth:
                break
        while pending:
            yield pending.popleft().result()
            for job in it:
                pending.append(pool.submit(fn, job))
                break


def import_kineto(inputs: List[str], out_path: str, rank: Optional[int] = None, workers: int = 0,
                  dask: Optional[str] = None, on_file=None) -> Dict[str, Any]:
    """Convert Kineto traces into one merged commprof trace at ``out_path``,
    rank by rank (memory bounded by a few ranks' events). ``on_file(done,
    total)`` is called after each file (progress display)."""
    from ..trace.metadata import run_metadata
    from ..trace.parquet import TraceWriter

    files = find_files(inputs)
    if rank is not None and len(files) > 1:
        raise TraceFormatError("--rank applies to a single trace file")
    workers = workers or min(len(files), os.cpu_count() or 1)
    metas, seen = [], {}
    # zstd level 1: the parent writes while the workers convert, on the same cores
    writer = TraceWriter(out_path, compression_level=1)
    try:
        for f, (table, meta) in zip(files, _tables(files, rank, workers, dask)):
            if meta["rank"] in seen:
                raise TraceFormatError(f"{f}: rank {meta['rank']} already imported from {seen[meta['rank']]}")
            seen[meta["rank"]] = f
            writer.write(table)
            metas.append(meta)
            del table
            if on_file is not None:
                on_file(len(metas), len(files))
        run = run_metadata(metas, {"launcher": "kineto-import",
                                   "imported_from": [os.path.basename(f) for f in files]})
        run["framework"] = run.get("framework") or "ddp"
        writer.close(run, metas)
    except BaseException:
        writer.abort()
        raise
    return run
