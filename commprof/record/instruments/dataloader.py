"""torch.utils.data.DataLoader: time the training loop waits in the
iterator's ``__next__`` (both the single- and multi-process iterators).

:func:`timed_next` is shared with the DALI instrument: any iterator whose
``__next__`` returns a batch is timed the same way."""
from __future__ import annotations

import functools

from .base import Instrument, leading_dim
from ..recorder import now


def timed_next(inst: Instrument, original, name: str, source: str, on_call):
    """Wrap an iterator's ``__next__``: a ``data`` region named ``name``,
    the batch's leading dimension as items; ``on_call(it)`` labels the run."""
    rec = inst.rec

    @functools.wraps(original)
    def __next__(it):
        if not inst.active:
            return original(it)
        try:
            inst.check_fault()
            on_call(it)
            rec.nvtx.push("data")
            t0 = now()
        except Exception as exc:
            inst.fail(exc)
            return original(it)
        ok = False
        try:
            batch = original(it)
            ok = True
            return batch
        finally:
            t1 = now()
            try:
                rec.nvtx.pop()
                n = leading_dim(batch) if ok else None
                if n:
                    rec.note_data_items(n)
                rec.region("data", name, source, type(it).__name__ if ok else "StopIteration", t0, t1, n)
            except Exception as exc:
                inst.fail(exc)

    return __next__


class DataLoaderInstrument(Instrument):
    name = "dataloader"

    def _install(self) -> None:
        from torch.utils.data import dataloader

        self.patch(dataloader._BaseDataLoaderIter, "__next__",
                   lambda original: timed_next(self, original, "dataloader", "DataLoader", self._label))

    def _label(self, it) -> None:
        info = self.rec.run_info
        if "loader" not in info:
            info["loader"] = "native"
            info["loader_workers"] = getattr(it, "_num_workers", None)
            try:
                info["dataset_size"] = len(it._dataset)
            except Exception:  # iterable datasets have no length
                pass
