"""The collective ring: the last collectives of a rank, in a memory-mapped
file that survives the rank's death (SIGKILL, SIGABRT, a segfault: the
page cache keeps what was stored).

Every collective's issue is written *before* the call enters the backend,
its completion time when the recorder sees it. A writer owns one file
(``<host>.<pid>.<writer>.ring`` in the shard folder): ``py`` for the Python
paths, ``native`` for the C++ process-group hooks (``record/_pghooks.cpp``
writes the same layout), so that no two writers share a counter.

Layout (little-endian): a 64-byte header, then ``slots`` slots of
``SLOT_SIZE`` bytes; the record of write number ``i`` (from 1) lives in slot
``(i - 1) % slots``. A slot is written as: its index set to 0, the fields,
then its index: a slot whose index is 0 is empty or torn and is skipped.
``t_done`` is 0 while the collective is in flight.

Standard library only (a recorded rank loads no numpy)."""
from __future__ import annotations

import glob
import mmap
import os
import struct
from typing import Any, Dict, List, Optional, Tuple

MAGIC = b"CPRING1\0"
#: magic, slots, slot size, rank (-1 unknown), pid
HEADER = struct.Struct("<8sIIii")
HEADER_SIZE = 64
#: index, t_issue, t_done, bytes (-1 unknown), seq, step, group size, op, group, dtype, source
SLOT = struct.Struct("<Qqqqqii16s16s16s24s")
SLOT_SIZE = 128
DONE_OFFSET = 16  # t_done within a slot
DEFAULT_SLOTS = 4096
SUFFIX = ".ring"  # journal.RING_SUFFIX

assert SLOT.size <= SLOT_SIZE and HEADER.size <= HEADER_SIZE


def ring_path(shard_dir: str, host: str, pid: int, writer: str) -> str:
    return os.path.join(shard_dir, f"{host}.{pid}.{writer}{SUFFIX}")


def create(path: str, slots: int = DEFAULT_SLOTS, rank: int = -1, pid: int = 0) -> mmap.mmap:
    """A new ring file, mapped (MAP_SHARED) for writing."""
    size = HEADER_SIZE + slots * SLOT_SIZE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    HEADER.pack_into(mm, 0, MAGIC, slots, SLOT_SIZE, rank, pid)
    return mm


def _s(text: Optional[str], n: int = 16) -> bytes:
    return (text or "").encode("utf-8", "replace")[:n]


class RingWriter:
    """The Python paths' ring (one per process; called under the GIL)."""

    def __init__(self, path: str, slots: int = DEFAULT_SLOTS, pid: int = 0):
        self.path = path
        self.mm = create(path, slots, pid=pid)
        self.slots = slots
        self.n = 0
        #: (group, seq) -> (slot offset, index) until completion
        self.open: Dict[Tuple[str, int], Tuple[int, int]] = {}

    def issue(self, group: str, seq: int, op: str, nbytes: Optional[int], dtype: Optional[str],
              source: str, step: int, t0: int, group_size: int = 0) -> None:
        self.n += 1
        i = self.n
        off = HEADER_SIZE + ((i - 1) % self.slots) * SLOT_SIZE
        mm = self.mm
        SLOT.pack_into(mm, off, 0, t0, 0, -1 if nbytes is None else int(nbytes), int(seq), int(step),
                       int(group_size or 0), _s(op), _s(group), _s(dtype), _s(source, 24))
        struct.pack_into("<Q", mm, off, i)
        if len(self.open) > 4 * self.slots:  # completions never seen (a backend without futures)
            self.open.clear()
        self.open[(group, seq)] = (off, i)

    def done(self, group: str, seq: int, t1: int) -> None:
        hit = self.open.pop((group, seq), None)
        if hit is None:
            return
        off, i = hit
        if struct.unpack_from("<Q", self.mm, off)[0] == i:  # not overwritten since
            struct.pack_into("<q", self.mm, off + DONE_OFFSET, t1)

    def close(self) -> None:
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass


def read(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(header, records in write order) of a ring file; ({}, []) when it is
    missing or not a ring."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return {}, []
    if len(data) < HEADER_SIZE or not data.startswith(MAGIC):
        return {}, []
    _m, slots, slot_size, rank, pid = HEADER.unpack_from(data, 0)
    out = []
    for k in range(slots):
        off = HEADER_SIZE + k * slot_size
        if off + SLOT.size > len(data):
            break
        (i, t0, t1, nbytes, seq, step, gsize, op, group, dtype, source) = SLOT.unpack_from(data, off)
        if i == 0:
            continue
        out.append({"index": i, "group": _text(group), "seq": seq, "op": _text(op),
                    "bytes": None if nbytes < 0 else nbytes, "dtype": _text(dtype) or None,
                    "source": _text(source), "step": step, "group_size": gsize, "t_issue": t0, "t_done": t1 or None})
    out.sort(key=lambda r: r["index"])
    return {"slots": slots, "rank": rank, "pid": pid}, out


def _text(b: bytes) -> str:
    return b.rstrip(b"\0").decode("utf-8", "replace")


def read_process(shard_dir: str, host: str, pid: int) -> List[Dict[str, Any]]:
    """Every ring record of one process (all its writers), by issue time."""
    recs: List[Dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(shard_dir, f"{glob.escape(host)}.{pid}.*{SUFFIX}"))):
        writer = os.path.basename(path)[: -len(SUFFIX)].rsplit(".", 1)[-1]
        for r in read(path)[1]:
            r["writer"] = writer
            recs.append(r)
    recs.sort(key=lambda r: r["t_issue"])
    return recs
