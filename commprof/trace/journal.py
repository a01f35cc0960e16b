"""A rank's crash-safe journal: a compact binary file written with plain
``os.write`` calls, no pyarrow, numpy or pandas in the recorded process.

While a rank runs, its events are appended to ``<host>.<pid>.cpj`` next to
``<host>.<pid>.meta.json`` (the rank's metadata, replaced atomically; its
``status`` is ``journal`` while the rank runs and ``complete`` once it has
closed its journal). The journal is the rank's shard: it is converted to
Parquet only when the shards are merged (in ``commprof record``'s own
process, or by ``commprof report`` given an unmerged folder). A process
killed with SIGKILL leaves a journal whose last block may be torn: it is
read up to its last complete block and *salvaged*.

Format (little-endian). A header ``b"CPJ1"``; then blocks, each
``b"B" kind:u8 length:u32 crc32:u32`` and ``length`` payload bytes:

- kind ``S`` (strings): ``first_id:u32 count:u32``, then per string
  ``len:u32`` and its UTF-8 bytes; ids are consecutive from 0 over the file;
- kind ``E`` (events): rows of :data:`ROW` (95 bytes): the schema's columns
  in order, strings as ids (``NO_STRING`` for null), the category as its
  schema code, nullable numbers with a null bitmap in the last byte.

A flush writes its new strings and its events as one ``os.write``, so any
prefix of complete blocks is a readable journal. Reading (here, with numpy
and pyarrow imported on first use) stops at the first block that is
incomplete or fails its checksum.

A shard folder holds journals and, from older versions or other writers,
finished Parquet shards ``rank<R>.<host>.<pid>.parquet``; nothing here knows
about the side files other tools write beside them (kernel traces, Horovod
timelines): assembling those is :mod:`commprof.assemble`'s job."""
from __future__ import annotations

import glob
import json
import os
import struct
import zlib
from typing import Any, Dict, List, Optional, Tuple

from . import schema
from .files import atomic_write
from .parquet import write_trace

JOURNAL_EXT = ".cpj"
META_EXT = ".meta.json"
MAGIC = b"CPJ1"
NO_STRING = 0xFFFFFFFF
_BLOCK = struct.Struct("<cBII")  # b"B", kind, payload length, crc32
#: one event: step, category code, name, source, detail, t_start, t_end,
#: dev_start, dev_end, bytes, dtype, group, group_size, seq, blocking,
#: items, value, null bits (dev_start, dev_end, bytes, group_size, seq,
#: blocking, items, value)
ROW = struct.Struct("<iBIIIqqqqqIIiqbqdB")
_NULLABLE = ("dev_start", "dev_end", "bytes", "group_size", "seq", "blocking", "items", "value")
_IDX = {name: i for i, name in enumerate(schema.EVENT_COLUMNS)}
_NULL_IDX = tuple(_IDX[n] for n in _NULLABLE)
assert _NULL_IDX == (7, 8, 9, 12, 13, 14, 15, 16), "JournalWriter.append spells these positions out"


def journal_paths(shard_dir: str, host: str, pid: int) -> Tuple[str, str]:
    """(journal, metadata) paths of process ``pid`` on ``host``."""
    base = os.path.join(shard_dir, f"{host}.{pid}")
    return base + JOURNAL_EXT, base + META_EXT


def meta_path_of(journal: str) -> str:
    return journal[: -len(JOURNAL_EXT)] + META_EXT


def shard_name(rank: int, host: str, pid: int) -> str:
    return f"rank{rank:05d}.{host}.{pid}.parquet"


class JournalWriter:
    """Appends event rows to a journal (created by :meth:`open`). Not
    thread-safe: the caller serialises calls. Pure Python: ``struct`` and
    ``os.write``."""

    def __init__(self, shard_dir: str, host: str, pid: int):
        self.path, self.meta_path = journal_paths(shard_dir, host, pid)
        self._fd: Optional[int] = None
        self._closed = False
        self._ids: Dict[str, int] = {}
        self._codes: Dict[tuple, tuple] = {}  # (category, name, source, detail, dtype, group) -> codes
        self.events = 0

    @property
    def started(self) -> bool:
        return self._fd is not None

    def open(self) -> None:
        if self._fd is None and not self._closed:  # never re-created (truncated) once closed
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            os.write(self._fd, MAGIC)

    def append(self, rows: List[tuple]) -> None:
        if not rows or self._closed:
            return
        self.open()
        ids = self._ids
        new: List[str] = []
        first = len(ids)

        def sid(v) -> int:
            if v is None:
                return NO_STRING
            i = ids.get(v)
            if i is None:
                v = str(v)
                i = ids.get(v)
                if i is None:
                    i = ids[v] = len(ids)
                    new.append(v)
            return i

        cat = schema.CAT
        pack = ROW.pack
        # rows repeat their strings (category, name, source, detail, dtype,
        # group) step after step: their codes are looked up once per distinct
        # combination, in this flush and in earlier ones
        codes = self._codes
        out = bytearray()
        for r in rows:
            key = (r[1], r[2], r[3], r[4], r[10], r[11])
            c = codes.get(key)
            if c is None:
                c = codes[key] = (cat[r[1]], sid(r[2]), sid(r[3]), sid(r[4]), sid(r[10]), sid(r[11]))
            nulls = ((r[7] is None) | (r[8] is None) << 1 | (r[9] is None) << 2 | (r[12] is None) << 3
                     | (r[13] is None) << 4 | (r[14] is None) << 5 | (r[15] is None) << 6 | (r[16] is None) << 7)
            out += pack(r[0], c[0], c[1], c[2], c[3], r[5], r[6], r[7] or 0, r[8] or 0, r[9] or 0, c[4], c[5],
                        r[12] or 0, r[13] or 0, bool(r[14]), r[15] or 0, r[16] or 0.0, nulls)
        data = bytearray()
        if new:
            payload = bytearray(struct.pack("<II", first, len(new)))
            for v in new:
                b = v.encode("utf-8", "replace")
                payload += struct.pack("<I", len(b)) + b
            data += _BLOCK.pack(b"B", ord("S"), len(payload), zlib.crc32(payload)) + payload
        data += _BLOCK.pack(b"B", ord("E"), len(out), zlib.crc32(out)) + out
        os.write(self._fd, bytes(data))  # type: ignore[arg-type]  # open while rows are written
        self.events += len(rows)

    def write_meta(self, meta: Dict[str, Any]) -> None:
        atomic_write(self.meta_path, json.dumps(meta, default=str))

    def close(self) -> None:
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_journal(path: str) -> Tuple[List[str], List[bytes]]:
    """(string table, event payloads) of every complete block of a journal
    (a killed writer may have left a torn block at the end; reading stops
    there)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return [], []
    strings: List[str] = []
    events: List[bytes] = []
    if not data.startswith(MAGIC):
        return strings, events
    pos, n = len(MAGIC), len(data)
    while pos + _BLOCK.size <= n:
        tag, kind, length, crc = _BLOCK.unpack_from(data, pos)
        start = pos + _BLOCK.size
        payload = data[start:start + length]
        if tag != b"B" or len(payload) < length or zlib.crc32(payload) != crc:
            break
        if kind == ord("S"):
            first, count = struct.unpack_from("<II", payload, 0)
            if first != len(strings):
                break
            off = 8
            for _ in range(count):
                (ln,) = struct.unpack_from("<I", payload, off)
                strings.append(payload[off + 4:off + 4 + ln].decode("utf-8", "replace"))
                off += 4 + ln
        elif kind == ord("E"):
            events.append(payload)
        else:
            break
        pos = start + length
    return strings, events


def _numpy_row():
    import numpy as np

    return np.dtype([("step", "<i4"), ("category", "u1"), ("name", "<u4"), ("source", "<u4"),
                     ("detail", "<u4"), ("t_start", "<i8"), ("t_end", "<i8"), ("dev_start", "<i8"),
                     ("dev_end", "<i8"), ("bytes", "<i8"), ("dtype", "<u4"), ("group", "<u4"),
                     ("group_size", "<i4"), ("seq", "<i8"), ("blocking", "i1"), ("items", "<i8"),
                     ("value", "<f8"), ("nulls", "u1")])


def journal_table(path: str, rank: int):
    """A journal's events as an Arrow table in the trace schema (None when
    no complete event block survived)."""
    import numpy as np
    import pyarrow as pa

    strings, blocks = read_journal(path)
    if not blocks:
        return None
    dt = _numpy_row()
    assert dt.itemsize == ROW.size
    arr = np.frombuffer(b"".join(blocks), dtype=dt)
    n = len(arr)
    dictionary = pa.array(strings, type=pa.string())
    cats = pa.array(list(schema.CATEGORIES), type=pa.string())
    cols: Dict[str, Any] = {"rank": pa.array(np.full(n, rank, np.int32))}
    nulls = arr["nulls"]
    for name, typ, _nullable in schema.EVENT_SPEC:
        col = arr[name]
        if name == "category":
            cols[name] = pa.DictionaryArray.from_arrays(pa.array(col.astype(np.int32)), cats)
        elif typ == "dict":
            missing = col == NO_STRING
            idx = pa.array(col.astype(np.int32), mask=missing if missing.any() else None)
            cols[name] = pa.DictionaryArray.from_arrays(idx, dictionary)
        else:
            mask = None
            if name in _NULLABLE:
                m = (nulls & (1 << _NULLABLE.index(name))) != 0
                mask = m if m.any() else None
            values = col.astype(bool) if typ == "bool" else col
            cols[name] = pa.array(values, type=schema.TRACE_SCHEMA.field(name).type, mask=mask)
    table = pa.Table.from_arrays([cols[f.name] for f in schema.TRACE_SCHEMA], schema=schema.TRACE_SCHEMA)
    return table


def read_journal_meta(path: str) -> Dict[str, Any]:
    """The metadata written beside a journal ({} when missing or torn)."""
    try:
        with open(meta_path_of(path)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def load_journal(path: str) -> Tuple[Optional[Any], Dict[str, Any]]:
    """(table, metadata) of a journal; the table is None when no complete
    block survived. A journal its rank did not close (killed) is marked
    ``status: salvaged``."""
    meta = read_journal_meta(path)
    table = journal_table(path, int(meta.get("rank", -1)))
    if table is None:
        return None, meta
    if meta.get("status") != "complete":
        meta["status"] = "salvaged"
    meta["events"] = table.num_rows
    return table, meta


def find_shards(folder: str) -> Tuple[List[str], List[str]]:
    """(Parquet shard files, journals) in ``folder``; a journal beside a
    Parquet shard of the same process is that shard's source and left out."""
    shards = sorted(glob.glob(os.path.join(folder, "rank*.parquet")))
    done = {tuple(os.path.basename(s).split(".")[1:3]) for s in shards}
    journals = []
    for j in sorted(glob.glob(os.path.join(folder, "*" + JOURNAL_EXT))):
        host_pid = tuple(os.path.basename(j)[: -len(JOURNAL_EXT)].rsplit(".", 1))
        if host_pid not in done:
            journals.append(j)
    return shards, journals


def journal_to_shard(path: str) -> Optional[str]:
    """Convert a journal to a Parquet shard beside it (offline tooling and
    tests); removes the journal and its metadata."""
    table, meta = load_journal(path)
    if table is None:
        return None
    host_pid = os.path.basename(path)[: -len(JOURNAL_EXT)].rsplit(".", 1)
    out = os.path.join(os.path.dirname(path), shard_name(int(meta.get("rank", 0)), host_pid[0], int(host_pid[1])))
    write_trace(table, out, {}, [meta])
    for p in (path, meta_path_of(path)):
        try:
            os.remove(p)
        except OSError:
            pass
    return out


#: per-process progress file (``commprof record --hang-timeout``)
PROGRESS_SUFFIX = ".progress.json"
#: per-process Python stacks, dumped by faulthandler when a hang is detected
STACKS_SUFFIX = ".stacks.txt"
#: per-process fatal-signal report (faulthandler: the signal and every thread's stack)
FATAL_SUFFIX = ".fatal.txt"
#: per-process uncaught exception (type, message, where), JSON
END_SUFFIX = ".end.json"
#: per-process collective rings (``trace/ring.py``)
RING_SUFFIX = ".ring"

# Side files other tools write into a shard folder (read by commprof.assemble).
#: rank 0's Horovod timeline (``commprof record --horovod-timeline``)
HOROVOD_TIMELINE_FILE = "horovod_timeline.json"


def kernel_trace_path(shard_dir: str, host: str, pid: int) -> str:
    """Where kernel mode writes a process's torch.profiler window."""
    return os.path.join(shard_dir, f"kineto.{host}.{pid}.json.gz")


def side_files(shard_dir: str) -> List[str]:
    """Every side file in a shard folder (removed with the shards after a merge)."""
    return sorted(glob.glob(os.path.join(shard_dir, "kineto.*.json.gz"))
                  + glob.glob(os.path.join(shard_dir, HOROVOD_TIMELINE_FILE))
                  + glob.glob(os.path.join(shard_dir, "*" + PROGRESS_SUFFIX))
                  + glob.glob(os.path.join(shard_dir, "*" + STACKS_SUFFIX))
                  + glob.glob(os.path.join(shard_dir, "*" + FATAL_SUFFIX))
                  + glob.glob(os.path.join(shard_dir, "*" + END_SUFFIX))
                  + glob.glob(os.path.join(shard_dir, "*" + RING_SUFFIX)))
