"""The one trace schema: Arrow schema, version, metadata keys and validation.

Every event is one row. Times are integer nanoseconds on the host's
``CLOCK_MONOTONIC`` (``time.monotonic_ns``), which all processes of one host
share; each rank's metadata carries the offset to wall-clock time so that
hosts can be aligned later.

Column reference (also in docs/trace-format.md):

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

import collections
from typing import Any, Dict, List, Tuple

#: Bumped when a column changes meaning or a required column is added.
SCHEMA_VERSION = 1
#: Oldest version this code can still read (missing optional columns are
#: filled with nulls).
MIN_READ_VERSION = 1

CATEGORIES = ("step", "data", "compute", "comm", "wait", "metric", "kernel", "phase")
#: Integer code of each category (its index in CATEGORIES), for analyzers
#: that work on numpy codes; nothing else hard-codes these numbers.
CAT = {name: code for code, name in enumerate(CATEGORIES)}

#: Columns a rank writes (journal and shard), in order: (name, type, nullable).
#: "dict" is a dictionary-encoded string column.
EVENT_SPEC: Tuple[Tuple[str, str, bool], ...] = (
    ("step", "int32", False),
    ("category", "dict", False),
    ("name", "dict", False),
    ("source", "dict", True),
    ("detail", "dict", True),
    ("t_start", "int64", False),
    ("t_end", "int64", False),
    ("dev_start", "int64", True),
    ("dev_end", "int64", True),
    ("bytes", "int64", True),
    ("dtype", "dict", True),
    ("group", "dict", True),
    ("group_size", "int32", True),
    ("seq", "int64", True),
    ("blocking", "bool", True),
    ("items", "int64", True),
    ("value", "float64", True),
)
EVENT_COLUMNS: List[str] = [name for name, _t, _n in EVENT_SPEC]

#: Columns a trace must have to be analysed at all.
REQUIRED_COLUMNS = ("rank", "step", "category", "name", "t_start", "t_end")

#: One event row, in EVENT_COLUMNS order (a plain tuple underneath: cheap to
#: build on the recording hot path, and the only place rows are spelled out).
# fields and defaults computed from EVENT_COLUMNS (mypy cannot follow that)
Event = collections.namedtuple("Event", EVENT_COLUMNS,  # type: ignore[misc]
                               defaults=(None,) * (len(EVENT_COLUMNS) - 7))  # type: ignore[misc]
Event.__doc__ = ("One trace event without its rank. Required: step, category, name, source, "
                 "detail, t_start, t_end; every other column defaults to None.")


class TraceFormatError(ValueError):
    """A file is not a commprof trace this version can read."""


def check_version(version: int) -> None:
    """Raise TraceFormatError for a schema version this code cannot read."""
    if version > SCHEMA_VERSION:
        raise TraceFormatError(
            f"schema version {version} is newer than this commprof reads "
            f"({SCHEMA_VERSION}); upgrade commprof")
    if version < MIN_READ_VERSION:
        raise TraceFormatError(
            f"schema version {version} is older than the oldest readable ({MIN_READ_VERSION})")


# ---------------------------------------------------------------- Arrow side
# pyarrow is imported on first use only: a recorded rank imports this module
# for Event and the names above and never pays for pyarrow.
_ARROW: Dict[str, Any] = {}


def _arrow() -> Dict[str, Any]:
    if not _ARROW:
        import pyarrow as pa

        types = {"int32": pa.int32(), "int64": pa.int64(), "bool": pa.bool_(), "float64": pa.float64(),
                 "dict": pa.dictionary(pa.int32(), pa.string())}
        fields = [pa.field(n, types[t], nullable=nullable) for n, t, nullable in EVENT_SPEC]
        _ARROW["EVENT_FIELDS"] = fields
        _ARROW["JOURNAL_SCHEMA"] = pa.schema(fields)
        _ARROW["TRACE_SCHEMA"] = pa.schema([pa.field("rank", pa.int32(), nullable=False)] + fields)
    return _ARROW


def __getattr__(name: str):
    # EVENT_FIELDS, JOURNAL_SCHEMA (journal batches) and TRACE_SCHEMA (shards
    # and merged traces: rank in front) are Arrow objects, built lazily.
    if name in ("EVENT_FIELDS", "JOURNAL_SCHEMA", "TRACE_SCHEMA"):
        return _arrow()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def rows_to_batch(rows: List[tuple]):
    """Event rows (EVENT_COLUMNS order) -> an Arrow record batch."""
    import pyarrow as pa

    a = _arrow()
    cols = list(zip(*rows)) if rows else [()] * len(EVENT_SPEC)
    arrays = []
    for field, col in zip(a["EVENT_FIELDS"], cols):
        if pa.types.is_dictionary(field.type):
            arrays.append(pa.array(col, type=pa.string()).dictionary_encode())
        else:
            arrays.append(pa.array(col, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=a["JOURNAL_SCHEMA"])


def add_rank(batch, rank: int):
    """Journal batch -> trace batch with a constant rank column in front."""
    import pyarrow as pa

    arrays = [pa.array([rank] * batch.num_rows, type=pa.int32())] + list(batch.columns)
    return pa.RecordBatch.from_arrays(arrays, schema=_arrow()["TRACE_SCHEMA"])


def rows_to_table(rows: List[tuple], rank: int):
    """Event rows of one rank -> an Arrow table in the trace schema."""
    import pyarrow as pa

    return pa.Table.from_batches([add_rank(rows_to_batch(rows), rank)])
