"""torch.utils.data.DataLoader: time the training loop waits in the
iterator's ``__next__`` (both the single- and multi-process iterators)."""
from __future__ import annotations

import functools

from .base import Instrument, leading_dim
from ..recorder import now


class DataLoaderInstrument(Instrument):
    name = "dataloader"

    def _install(self) -> None:
        from torch.utils.data import dataloader

        self.patch(dataloader._BaseDataLoaderIter, "__next__", self._wrap)

    def _wrap(self, original):
        inst = self
        rec = self.rec

        @functools.wraps(original)
        def __next__(it):
            if not inst.active:
                return original(it)
            try:
                inst.check_fault()
                if "loader" not in rec.run_info:
                    rec.run_info["loader"] = "native"
                    rec.run_info["loader_workers"] = getattr(it, "_num_workers", None)
                    try:
                        rec.run_info["dataset_size"] = len(it._dataset)
                    except Exception:  # iterable datasets have no length
                        pass
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
                        rec.step_data_items += n
                    rec.region("data", "dataloader", "DataLoader",
                               type(it).__name__ if ok else "StopIteration", t0, t1, n)
                except Exception as exc:
                    inst.fail(exc)

        return __next__
