"""A rank's crash-safe journal and its Parquet shard.

While a rank runs, its events are appended to ``<host>.<pid>.arrows`` (an
Arrow IPC stream of record batches, each written with plain ``write()``
calls) next to ``<host>.<pid>.meta.json`` (the rank's metadata, replaced
atomically). A process killed with SIGKILL leaves both behind: the journal
is read up to its last complete batch (a torn batch at the end is dropped)
and *salvaged*. A process that ends normally rewrites its journal as the
shard ``rank<R>.<host>.<pid>.parquet`` and removes it.

A shard folder holds finished shards and orphaned journals; nothing here
knows about the side files other tools write beside them (kernel traces,
Horovod timelines): assembling those is :mod:`commprof.assemble`'s job."""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from . import schema
from .files import atomic_write
from .parquet import write_trace

JOURNAL_EXT = ".arrows"
META_EXT = ".meta.json"


def journal_paths(shard_dir: str, host: str, pid: int) -> Tuple[str, str]:
    """(journal, metadata) paths of process ``pid`` on ``host``."""
    base = os.path.join(shard_dir, f"{host}.{pid}")
    return base + JOURNAL_EXT, base + META_EXT


def meta_path_of(journal: str) -> str:
    return journal[: -len(JOURNAL_EXT)] + META_EXT


def shard_name(rank: int, host: str, pid: int) -> str:
    return f"rank{rank:05d}.{host}.{pid}.parquet"


class JournalWriter:
    """Appends event rows to a journal; the file is created on the first
    append. Not thread-safe: the caller serialises calls."""

    def __init__(self, shard_dir: str, host: str, pid: int):
        self.path, self.meta_path = journal_paths(shard_dir, host, pid)
        self._sink = None
        self._writer = None
        self.events = 0

    @property
    def started(self) -> bool:
        return self._writer is not None

    def append(self, rows: List[tuple]) -> None:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        if not rows:
            return
        batch = schema.rows_to_batch(rows)
        if self._writer is None:
            self._sink = pa.OSFile(self.path, "wb")
            self._writer = ipc.new_stream(self._sink, schema.JOURNAL_SCHEMA)
        self._writer.write_batch(batch)
        self.events += len(rows)

    def write_meta(self, meta: Dict[str, Any]) -> None:
        atomic_write(self.meta_path, json.dumps(meta, default=str))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None


def read_journal(path: str) -> List:
    """Every complete record batch of a journal (a killed writer may have left
    a torn batch at the end; it is dropped)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    batches = []
    try:
        reader = ipc.open_stream(pa.OSFile(path, "rb"))
    except (pa.ArrowInvalid, OSError):
        return batches
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError, EOFError):
            break
    return batches


def read_journal_meta(path: str) -> Dict[str, Any]:
    """The metadata written beside a journal ({} when missing or torn)."""
    try:
        with open(meta_path_of(path)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _table(batches, rank: int):
    import pyarrow as pa

    return pa.Table.from_batches([schema.add_rank(b, rank) for b in batches], schema=schema.TRACE_SCHEMA)


def salvage_journal(path: str) -> Tuple[Optional[Any], Dict[str, Any]]:
    """(table, metadata) of an orphaned journal; the table is None when no
    complete batch survived. The metadata says ``status: salvaged``."""
    meta = read_journal_meta(path)
    batches = read_journal(path)
    if not batches:
        return None, meta
    meta["status"] = "salvaged"
    meta["events"] = sum(b.num_rows for b in batches)
    return _table(batches, int(meta.get("rank", -1))), meta


def find_shards(folder: str) -> Tuple[List[str], List[str]]:
    """(finished shard files, orphaned journals) in ``folder``."""
    shards = sorted(glob.glob(os.path.join(folder, "rank*.parquet")))
    done = {tuple(os.path.basename(s).split(".")[1:3]) for s in shards}
    journals = []
    for j in sorted(glob.glob(os.path.join(folder, "*" + JOURNAL_EXT))):
        host_pid = tuple(os.path.basename(j)[: -len(JOURNAL_EXT)].rsplit(".", 1))
        if host_pid not in done:
            journals.append(j)
    return shards, journals


def finalize_journal(shard_dir: str, host: str, pid: int, meta: Dict[str, Any]) -> Optional[str]:
    """Rewrite ``<host>.<pid>.arrows`` as a Parquet shard; remove the journal."""
    jpath, mpath = journal_paths(shard_dir, host, pid)
    batches = read_journal(jpath)
    rank = int(meta.get("rank", 0))
    meta["events"] = sum(b.num_rows for b in batches)
    out = os.path.join(shard_dir, shard_name(rank, host, pid))
    write_trace(_table(batches, rank), out, {}, [meta])
    for p in (jpath, mpath):
        try:
            os.remove(p)
        except OSError:
            pass
    return out


# Side files other tools write into a shard folder (read by commprof.assemble).
#: rank 0's Horovod timeline (``commprof record --horovod-timeline``)
HOROVOD_TIMELINE_FILE = "horovod_timeline.json"


def kernel_trace_path(shard_dir: str, host: str, pid: int) -> str:
    """Where kernel mode writes a process's torch.profiler window."""
    return os.path.join(shard_dir, f"kineto.{host}.{pid}.json.gz")


def side_files(shard_dir: str) -> List[str]:
    """Every side file in a shard folder (removed with the shards after a merge)."""
    return sorted(glob.glob(os.path.join(shard_dir, "kineto.*.json.gz"))
                  + glob.glob(os.path.join(shard_dir, HOROVOD_TIMELINE_FILE)))
