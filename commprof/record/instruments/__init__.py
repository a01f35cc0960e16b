"""Instrument registry: one module per patched API.

Each entry is installed when its trigger module has been imported (a
post-import hook), so processes that never import torch pay nothing."""
from __future__ import annotations

from .autograd import AutogradInstrument
from .collectives import CollectivesInstrument
from .cudagraph import CudaGraphInstrument
from .dali import DaliInstrument
from .dataloader import DataLoaderInstrument
from .ddp import DDPInstrument
from .deepspeed import DeepSpeedInstrument
from .fsdp import FSDPInstrument
from .horovod import HorovodInstrument
from .module import ModuleInstrument
from .optim import OptimizerInstrument

#: name -> class, in installation order.
ALL = {cls.name: cls for cls in (
    OptimizerInstrument,
    AutogradInstrument,
    ModuleInstrument,
    DataLoaderInstrument,
    CollectivesInstrument,
    DDPInstrument,
    FSDPInstrument,
    HorovodInstrument,
    DeepSpeedInstrument,
    DaliInstrument,
    CudaGraphInstrument,
)}
