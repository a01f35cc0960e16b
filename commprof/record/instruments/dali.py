"""NVIDIA DALI: the time the training loop waits on a DALI PyTorch iterator
(``DALIGenericIterator`` and its subclasses such as
``DALIClassificationIterator``; ``DALIRaggedIterator``) as data loading,
labelled ``dali`` so loaders can be compared. Works the same for CPU
pipelines (``device_id=None``) and GPU pipelines."""
from __future__ import annotations

import sys

from .base import Instrument
from .dataloader import timed_next


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
        return timed_next(self, original, "dali", "DALI", self._label)

    def _label(self, it) -> None:
        self.rec.run_info["loader"] = "dali"
