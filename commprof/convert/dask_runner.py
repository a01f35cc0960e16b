"""Per-rank work as tasks on an existing Dask cluster (``--dask ADDRESS``),
the way Nsight Systems' recipes scale out: every task reads its rank's
file from storage the workers share and returns its part; results come back
in order, with a bounded window of tasks in flight (memory on the client
stays bounded by a few ranks)."""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Iterator


def client_for(address: str):
    try:
        from distributed import Client
    except ImportError:
        from ..errors import UsageError

        raise UsageError("--dask needs the 'distributed' package (pip install distributed)")
    try:
        return Client(address, timeout="20s")
    except (OSError, TimeoutError) as exc:
        from ..errors import UsageError

        raise UsageError(f"cannot reach the Dask scheduler at {address}: {exc}")


def map_ordered(address: str, fn: Callable, jobs: Iterable[Any], window: int = 0) -> Iterator[Any]:
    client = client_for(address)
    try:
        width = window or max(2, 2 * len(client.scheduler_info().get("workers", {})))
        pending: deque = deque()
        it = iter(jobs)
        for job in it:
            pending.append(client.submit(fn, job, pure=False))
            if len(pending) >= width:
                break
        while pending:
            fut = pending.popleft()
            yield fut.result()
            fut.release()
            for job in it:
                pending.append(client.submit(fn, job, pure=False))
                break
    finally:
        client.close()
