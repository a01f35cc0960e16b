"""Trace files in Parquet: writing (atomic), reading whole or in chunks of
whole ranks, and conforming files of older schema versions.

A merged trace holds one rank per row group (or several row groups per
rank), so a reader can plan chunks from the row-group statistics without
reading events."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from . import schema
from .files import atomic_path
from .metadata import decode_meta, encode_meta
from .schema import TraceFormatError

#: The merged trace's file name inside a record folder.
TRACE_FILE = "trace.parquet"
ROW_GROUP = 1 << 20
#: events per chunk the analyses read at a time (whole ranks, so a chunk
#: can be larger)
CHUNK_ROWS = 500_000
#: chunks :func:`read_ahead` decodes before the reader asks (10 M events:
#: 3 took 0.15 s off the report for ~12 MiB; 6, no faster and 180 MiB more;
#: benchmarks/results/report_speed/)
AHEAD_CHUNKS = 3


def _dictionary_columns():
    """Columns written dictionary-encoded: the string columns and the few-valued
    integers. Time stamps and byte counts are nearly unique: encoding them
    as dictionaries first (Parquet's default for every column) costs more
    than half of the write and makes the file larger."""
    import pyarrow as pa

    return [f.name for f in schema.TRACE_SCHEMA if pa.types.is_dictionary(f.type)] + ["rank", "step"]


def write_trace(table, path: str, run: Dict[str, Any], rank_metas) -> None:
    """Write a trace table atomically (temporary file, then rename)."""
    import pyarrow.parquet as pq

    table = table.replace_schema_metadata(encode_meta(run, rank_metas))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP,
                       use_dictionary=_dictionary_columns(), write_statistics=True)


def trace_file(path: str) -> Optional[str]:
    """The merged trace file ``path`` names: the file itself, or a record
    folder's :data:`TRACE_FILE`; None for anything else (a folder of shards,
    nothing at all). Paths only: nothing is imported or opened."""
    if os.path.isfile(path):
        return path
    merged = os.path.join(path, TRACE_FILE)
    return merged if os.path.isfile(merged) else None


class TraceWriter:
    """Append rank tables one at a time; the footer metadata (known only at
    the end) is added by :meth:`close`. Atomic: nothing appears at ``path``
    unless close() succeeds."""

    def __init__(self, path: str, compression_level: Optional[int] = None):
        self.path = path
        self._level = compression_level
        self._ctx = atomic_path(path)
        self._tmp = self._ctx.__enter__()
        self._writer: Any = None

    def write(self, table) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, schema.TRACE_SCHEMA, compression="zstd",
                                            compression_level=self._level,
                                            use_dictionary=_dictionary_columns(),
                                            write_statistics=True)
        self._writer.write_table(table.cast(schema.TRACE_SCHEMA), row_group_size=ROW_GROUP)

    @property
    def empty(self) -> bool:
        return self._writer is None

    def close(self, run: Dict[str, Any], rank_metas: List[Dict[str, Any]]) -> None:
        self._writer.add_key_value_metadata(
            {k.decode(): v.decode() for k, v in encode_meta(run, rank_metas).items()})
        self._writer.close()
        self._writer = None
        self._ctx.__exit__(None, None, None)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        try:
            self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
        except RuntimeError:
            pass


def conform(table, version: int, empty: Sequence[str] = ()):
    """Bring a table read from disk to TRACE_SCHEMA.

    Raises TraceFormatError naming the problem for unknown versions or
    missing required columns; optional columns missing in older files are
    added as nulls (the pyinstrument ``from_json`` approach). ``empty``:
    optional columns left unread because they hold no value (see
    :func:`iter_file_chunks`), added as Arrow null-type columns, which
    hold no buffers."""
    import pyarrow as pa

    schema.check_version(version)
    missing = [c for c in schema.REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceFormatError("missing required column(s): " + ", ".join(missing))
    target = schema.TRACE_SCHEMA
    if not empty and table.schema.remove_metadata().equals(target):
        return table
    cols, fields = [], []
    for field in target:
        if field.name in empty and field.name not in table.column_names:
            cols.append(pa.nulls(table.num_rows, type=pa.null()))
            fields.append(pa.field(field.name, pa.null()))
            continue
        fields.append(field)
        if field.name in table.column_names:
            col = table.column(field.name)
            if col.type != field.type:
                try:
                    col = col.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise TraceFormatError(
                        f"column {field.name!r} has type {col.type}, expected {field.type}") from exc
            cols.append(col)
        else:
            cols.append(pa.nulls(table.num_rows, type=field.type))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields) if empty else target)


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _open(path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        if os.path.getsize(path) == 0:
            raise TraceFormatError(f"{path}: empty file") from exc
        raise TraceFormatError(f"{path}: not a readable Parquet file ({first_line(exc)})") from exc


def _meta(path: str, pf) -> Tuple[int, Dict, List]:
    try:
        return decode_meta(pf.metadata.metadata)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None


def open_file(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(run metadata, rank metadata) of a trace file, checked (version,
    required columns) without reading its events."""
    pf = _open(path)
    version, run, ranks = _meta(path, pf)
    try:
        schema.check_version(version)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None
    missing = [c for c in schema.REQUIRED_COLUMNS if c not in pf.schema_arrow.names]
    if missing:
        raise TraceFormatError(f"{path}: missing required column(s): " + ", ".join(missing))
    return run, ranks


def read_meta(path: str) -> Tuple[int, Dict[str, Any], List[Dict[str, Any]]]:
    """(schema version, run metadata, rank metadata) of a trace file."""
    return _meta(path, _open(path))


def read_file(path: str, columns: Optional[Sequence[str]] = None) -> Tuple[Any, Dict, List]:
    """(table conformed to the trace schema, run metadata, rank metadata)."""
    pf = _open(path)
    version, run, ranks = _meta(path, pf)
    wanted = [c for c in columns if c in pf.schema_arrow.names] if columns else None
    return _conformed(path, version, lambda: pf.read(columns=wanted)), run, ranks


def _conformed(path: str, version: int, read, empty: Sequence[str] = ()):
    """``read()`` conformed to the trace schema (``empty``: as
    :func:`conform`); errors name the file."""
    import pyarrow as pa

    try:
        table = read()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise TraceFormatError(f"{path}: truncated or corrupt Parquet ({first_line(exc)})") from exc
    try:
        return conform(table, version, empty)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None


class _Ahead:
    """The first chunks of a file, read in a thread of their own."""

    def __init__(self, chunks: Iterator[Any], n: int):
        import threading

        self.chunks, self.n = chunks, n
        self.got: List[Any] = []
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._pull, name="commprof-read-ahead", daemon=True)
        self.thread.start()

    def _pull(self) -> None:
        try:
            for _ in range(self.n):
                chunk = next(self.chunks, None)
                if chunk is None:
                    return
                self.got.append(chunk)
        except BaseException as exc:        # raised to the reader, where it would have been
            self.error = exc

    def rest(self) -> Iterator[Any]:
        self.thread.join()
        while self.got:
            yield self.got.pop(0)
        if self.error is not None:
            raise self.error
        yield from self.chunks


_AHEAD: Dict[Tuple[str, Tuple[str, ...], int], _Ahead] = {}


def _ahead_key(path: str, columns: Optional[Sequence[str]], max_rows: int, skip_empty: bool):
    return os.path.abspath(path), tuple(columns or ()), max_rows, skip_empty


def read_ahead(path: str, columns: Optional[Sequence[str]] = None, max_rows: int = CHUNK_ROWS,
               chunks: int = AHEAD_CHUNKS, skip_empty: bool = False) -> tuple:
    """Start decoding the first ``chunks`` chunks of a trace file in the
    background (``commprof report``: while the analyzers are imported,
    ~0.3 s on one core); the next :func:`iter_file_chunks` of the same
    file, columns and chunk size starts with them. Nothing more is held:
    the chunks are read once, by whichever comes first. Returns the key
    :func:`drop_ahead` takes."""
    key = _ahead_key(path, columns, max_rows, skip_empty)
    _AHEAD[key] = _Ahead(_iter_file_chunks(path, columns, max_rows, skip_empty), chunks)
    return key


def drop_ahead(key: tuple) -> None:
    """Forget what :func:`read_ahead` (which returned ``key``) started and
    no reader took: a caller that ended before reading (its thread ends
    once its chunks are read; they are then freed)."""
    _AHEAD.pop(key, None)


def iter_file_chunks(path: str, columns: Optional[Sequence[str]] = None,
                     max_rows: int = 4_000_000, skip_empty: bool = False) -> Iterator[Any]:
    """The events of a trace file in chunks of whole ranks (about
    ``max_rows`` rows each, never splitting a rank), conformed to the trace
    schema. Chunks are planned from the row-group statistics; each is read
    in one multi-threaded call, the next one in the background while the
    caller works on the current one (the first ones already read where
    :func:`read_ahead` started them).

    ``skip_empty``: an optional column whose row-group statistics say it
    holds no value in any of a chunk's row groups (device times of a CPU
    run, metric values where nothing was sampled) is not decoded; it comes
    as an Arrow null-type column (no buffers) instead of its own type, all
    null as well. For readers that treat a column of nulls as absent (the
    report: 10 M events of a CPU run, three such columns, its peak 827
    MiB instead of 893 MiB, medians of 8 interleaved pairs,
    benchmarks/results/report_speed/)."""
    ahead = _AHEAD.pop(_ahead_key(path, columns, max_rows, skip_empty), None)
    return ahead.rest() if ahead is not None else _iter_file_chunks(path, columns, max_rows, skip_empty)


def _empty_columns(md, groups: Sequence[int], names: Sequence[str], cols: Sequence[str]) -> List[str]:
    """The optional columns of ``cols`` with no value in any of the row
    groups ``groups``, by the statistics (a column without them is read)."""
    out = []
    for c in cols:
        if c in schema.REQUIRED_COLUMNS:
            continue
        i = names.index(c)
        for g in groups:
            rg = md.row_group(g)
            st = rg.column(i).statistics
            if st is None or not st.has_null_count or st.null_count != rg.num_rows:
                break
        else:
            out.append(c)
    return out


def _iter_file_chunks(path: str, columns: Optional[Sequence[str]], max_rows: int,
                      skip_empty: bool = False) -> Iterator[Any]:
    pf = _open(path)
    version, _run, _ranks = _meta(path, pf)
    names = pf.schema_arrow.names
    wanted = list(columns or names) + [c for c in schema.REQUIRED_COLUMNS if columns and c not in columns]
    cols = [c for c in wanted if c in names]
    rank_idx = names.index("rank") if "rank" in names else None
    md = pf.metadata
    plan: List[List[int]] = [[]]
    rows, last_rank = 0, None
    for i in range(md.num_row_groups):
        stats = md.row_group(i).column(rank_idx).statistics if rank_idx is not None else None
        lo, hi = (stats.min, stats.max) if stats is not None and stats.has_min_max else (None, None)
        if plan[-1] and rows >= max_rows and (lo is None or lo != last_rank):
            plan.append([])
            rows = 0
        plan[-1].append(i)
        rows += md.row_group(i).num_rows
        last_rank = hi
    plan = [p for p in plan if p]

    def read(groups):
        empty = _empty_columns(md, groups, names, cols) if skip_empty and groups else []
        some = [c for c in cols if c not in empty]
        t = _conformed(path, version, lambda: pf.read_row_groups(groups, columns=some, use_threads=True), empty)
        return t.select([c for c in columns if c in t.column_names]) if columns else t

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(read, plan[0]) if plan else None
        for k in range(len(plan)):
            assert future is not None
            table = future.result()
            future = pool.submit(read, plan[k + 1]) if k + 1 < len(plan) else None
            yield table
