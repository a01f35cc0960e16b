"""NVIDIA DALI: the time the training loop waits on a DALI PyTorch iterator
(``DALIGenericIterator`` and its subclasses such as
``DALIClassificationIterator``; ``DALIRaggedIterator``) as data loading,
labelled ``dali`` so loaders can be compared. Works the same for CPU
pipelines (``device_id=None``) and GPU pipelines."""
from __future__ import annotations

import functools
import sys

from .base import Instrument, leading_dim
from ..recorder import now


class DaliInstrument(Instrument):
    name = "dali"
    trigger = "nvidia.dali.plugin.pytorch"

    def _install(self) -> None:
        mod = sys.modules["nvidia.dali.plugin.pytorch"]
        for cls_name in ("DALIGenericIterator", "DALIRaggedIterator"):
            cls = getattr(mod, cls_name, None)
            if cls is not None and "__next__" in cls.__dict__:
                self.patch(cls, "__next__", self._wrap)
        try:
            import nvidia.dali as dali

            self.rec.run_info["dali"] = getattr(dali, "__version__", None)
        except Exception:
            pass

    def _wrap(self, original):
        inst = self
        rec = self.rec

        @functools.wraps(original)
        def __next__(it):
            if not inst.active:
                return original(it)
            try:
                inst.check_fault()
                rec.run_info["loader"] = "dali"
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
                    rec.region("data", "dali", "DALI", type(it).__name__ if ok else "StopIteration", t0, t1, n)
                except Exception as exc:
                    inst.fail(exc)

        return __next__
