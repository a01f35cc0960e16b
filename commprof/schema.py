"""The one trace schema: Arrow schema, version, metadata keys and validation.

Every event is one row. Times are integer nanoseconds on the host's
``CLOCK_MONOTONIC`` (``time.monotonic_ns``), which all processes of one host
share; each rank's metadata carries the offset to wall-clock time so that
hosts can be aligned later.

Column reference (also in the README):

========== ====================================================================
rank       global rank of the process that recorded the event
step       index (from 0) of the optimizer step the event belongs to; events
           after the last optimizer step carry the next index
category   ``step`` | ``data`` | ``compute`` | ``comm`` | ``wait`` | ``metric`` |
           ``kernel`` (GPU activity: name = kernel class, detail = kernel) |
           ``phase`` (Horovod timeline phase: detail = tensor, items = depth)
name       what happened: ``step``, ``dataloader``, ``forward``, ``backward``,
           ``optimizer``, ``all_reduce``, ``broadcast`` ... (collectives use the
           nccl-tests names)
source     which instrument saw it: ``torch.optim``, ``DataLoader``,
           ``nn.Module``, ``autograd``, ``ddp_reducer``, ``torch.distributed``
detail     free text: module / optimizer class, DDP hook name, tensor name
t_start    host time the region started / the collective was issued (ns)
t_end      host time the region ended / the collective completed (ns)
dev_start  device time (CUDA) in the same clock, when measured; else null
dev_end    idem
bytes      collectives: S as nccl-tests define it (full array for
           reduce_scatter / all_gather), else null
dtype      collectives: element type
group      collectives: process-group name
group_size collectives: ranks in the group
seq        collectives: per-group sequence number on this rank; the same
           collective has the same (group, seq) on every rank
blocking   collectives: true when the calling thread waited for completion
           (a synchronous call), false for async ones (DDP buckets, async_op)
items      forward / data events: leading dimension of the batch
value      metric events: the value (loss, lr, accuracy, ...)
========== ====================================================================
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List

import pyarrow as pa

#: Bumped when a column changes meaning or a required column is added.
SCHEMA_VERSION = 1
#: Oldest version this code can still read (missing optional columns are
#: filled with nulls).
MIN_READ_VERSION = 1

META_VERSION = b"commprof.schema_version"
META_RUN = b"commprof.run"
META_RANKS = b"commprof.ranks"

CATEGORIES = ("step", "data", "compute", "comm", "wait", "metric", "kernel", "phase")

_dict_str = pa.dictionary(pa.int32(), pa.string())

#: Columns written by a rank (journal and shard), in order.
EVENT_FIELDS: List[pa.Field] = [
    pa.field("step", pa.int32(), nullable=False),
    pa.field("category", _dict_str, nullable=False),
    pa.field("name", _dict_str, nullable=False),
    pa.field("source", _dict_str),
    pa.field("detail", _dict_str),
    pa.field("t_start", pa.int64(), nullable=False),
    pa.field("t_end", pa.int64(), nullable=False),
    pa.field("dev_start", pa.int64()),
    pa.field("dev_end", pa.int64()),
    pa.field("bytes", pa.int64()),
    pa.field("dtype", _dict_str),
    pa.field("group", _dict_str),
    pa.field("group_size", pa.int32()),
    pa.field("seq", pa.int64()),
    pa.field("blocking", pa.bool_()),
    pa.field("items", pa.int64()),
    pa.field("value", pa.float64()),
]
EVENT_COLUMNS = [f.name for f in EVENT_FIELDS]

#: Journal rows are plain tuples in EVENT_COLUMNS order.
JOURNAL_SCHEMA = pa.schema(EVENT_FIELDS)

#: Shards and merged traces add the rank in front.
TRACE_SCHEMA = pa.schema([pa.field("rank", pa.int32(), nullable=False)] + EVENT_FIELDS)

#: Columns a trace must have to be analysed at all.
REQUIRED_COLUMNS = ("rank", "step", "category", "name", "t_start", "t_end")


class TraceFormatError(ValueError):
    """A file is not a commprof trace this version can read."""


def rows_to_batch(rows: List[tuple]) -> pa.RecordBatch:
    """Turn journal tuples (EVENT_COLUMNS order) into a record batch."""
    cols = list(zip(*rows)) if rows else [()] * len(EVENT_FIELDS)
    arrays = []
    for field, col in zip(EVENT_FIELDS, cols):
        if pa.types.is_dictionary(field.type):
            arrays.append(pa.array(col, type=pa.string()).dictionary_encode())
        else:
            arrays.append(pa.array(col, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=JOURNAL_SCHEMA)


def add_rank(batch: pa.RecordBatch, rank: int) -> pa.RecordBatch:
    """Journal batch -> trace batch with a constant rank column in front."""
    arrays = [pa.array([rank] * batch.num_rows, type=pa.int32())] + list(batch.columns)
    return pa.RecordBatch.from_arrays(arrays, schema=TRACE_SCHEMA)


def conform(table: pa.Table, version: int) -> pa.Table:
    """Bring a table read from disk to TRACE_SCHEMA.

    Raises TraceFormatError naming the problem for unknown versions or
    missing required columns; optional columns missing in older files are
    added as nulls (the pyinstrument ``from_json`` approach).
    """
    if version > SCHEMA_VERSION:
        raise TraceFormatError(
            f"schema version {version} is newer than this commprof reads "
            f"({SCHEMA_VERSION}); upgrade commprof")
    if version < MIN_READ_VERSION:
        raise TraceFormatError(
            f"schema version {version} is older than the oldest readable ({MIN_READ_VERSION})")
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceFormatError("missing required column(s): " + ", ".join(missing))
    if table.schema.remove_metadata().equals(TRACE_SCHEMA):
        return table
    cols = []
    for field in TRACE_SCHEMA:
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
    return pa.Table.from_arrays(cols, schema=TRACE_SCHEMA)


def encode_meta(run: Dict[str, Any], ranks: Iterable[Dict[str, Any]]) -> Dict[bytes, bytes]:
    return {
        META_VERSION: str(SCHEMA_VERSION).encode(),
        META_RUN: json.dumps(run, sort_keys=True, default=str).encode(),
        META_RANKS: json.dumps(list(ranks), sort_keys=True, default=str).encode(),
    }


def decode_meta(meta: Dict[bytes, bytes] | None) -> tuple[int, Dict[str, Any], List[Dict[str, Any]]]:
    """Return (schema_version, run metadata, per-rank metadata)."""
    if not meta or META_VERSION not in meta:
        raise TraceFormatError("no commprof metadata (not a commprof trace)")
    try:
        version = int(meta[META_VERSION].decode())
    except ValueError as exc:
        raise TraceFormatError("unreadable schema version") from exc
    try:
        run = json.loads(meta.get(META_RUN, b"{}").decode())
        ranks = json.loads(meta.get(META_RANKS, b"[]").decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError("unreadable commprof metadata") from exc
    return version, run, ranks
