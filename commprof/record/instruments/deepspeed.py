"""DeepSpeed: every collective of ``deepspeed.comm`` (ZeRO 0-3 go through it).

Patched in both ``deepspeed.comm`` and ``deepspeed.comm.comm`` (code holds
either). DeepSpeed's torch backend captured torch's collectives at init;
those calls are recorded once, at the deepspeed.comm level (the nested
torch.distributed call is not recorded again). Same fields as for
torch.distributed, source ``deepspeed.comm``; latencies are per call (unlike
DeepSpeed's own comms logger, whose timers are cumulative).
``deepspeed.initialize`` is wrapped to label the run (framework deepspeed,
ZeRO stage); the engine's forward, backward and optimizer step are seen by
the nn.Module / autograd / torch.optim instruments, and ``engine.step()``
closes the training step when it returns (ZeRO gathers the updated
parameters after the inner optimizer step)."""
from __future__ import annotations

import functools
import sys

from .collectives import CollectivesInstrument

DS_SPECS = {
    "all_reduce": ("all_reduce", ("tensor", "op", "group", "async_op"), "t"),
    "inference_all_reduce": ("all_reduce", ("tensor", "op", "group"), "t"),
    "all_reduce_coalesced": ("all_reduce", ("tensors", "op", "group", "async_op"), "list0"),
    "broadcast": ("broadcast", ("tensor", "src", "group", "async_op"), "t"),
    "reduce": ("reduce", ("tensor", "dst", "op", "group", "async_op"), "t"),
    "all_gather": ("all_gather", ("tensor_list", "tensor", "group", "async_op"), "in_x_n"),
    "all_gather_into_tensor": ("all_gather", ("output_tensor", "input_tensor", "group", "async_op"), "out"),
    "allgather_fn": ("all_gather", ("output_tensor", "input_tensor", "group", "async_op"), "out"),
    "all_gather_coalesced": ("all_gather", ("output_tensors", "input_tensors", "group", "async_op"), "list0"),
    "reduce_scatter": ("reduce_scatter", ("output", "input_list", "op", "group", "async_op"), "inlist"),
    "reduce_scatter_tensor": ("reduce_scatter", ("output_tensor", "input_tensor", "op", "group", "async_op"), "in"),
    "reduce_scatter_fn": ("reduce_scatter", ("output_tensor", "tensor", "op", "group", "async_op"), "in"),
    "all_to_all_single": ("all_to_all", ("output", "tensor", "output_split_sizes", "input_split_sizes",
                                         "group", "async_op"), "in"),
    "all_to_all": ("all_to_all", ("output_tensor_list", "input_tensor_list", "group", "async_op"), "inlist"),
    "gather": ("gather", ("tensor", "gather_list", "dst", "group", "async_op"), "tn"),
    "scatter": ("scatter", ("tensor", "scatter_list", "src", "group", "async_op"), "tn"),
    "barrier": ("barrier", ("group", "async_op", "device_ids"), "none"),
}


class DeepSpeedInstrument(CollectivesInstrument):
    name = "deepspeed"
    trigger = "deepspeed"
    source = "deepspeed.comm"
    specs = DS_SPECS

    def _modules(self):
        return [m for m in (sys.modules.get("deepspeed.comm"), sys.modules.get("deepspeed.comm.comm")) if m]

    def _install(self) -> None:
        super()._install()
        ds = sys.modules["deepspeed"]
        self.rec.run_info["deepspeed"] = getattr(ds, "__version__", None)
        if hasattr(ds, "initialize"):
            self.patch(ds, "initialize", self._wrap_initialize)
        engine_mod = sys.modules.get("deepspeed.runtime.engine")
        if engine_mod is not None and hasattr(engine_mod, "DeepSpeedEngine"):
            self.patch(engine_mod.DeepSpeedEngine, "step", self._wrap_step)

    def _wrap_step(self, original):
        """engine.step() ends the training step when it returns (ZeRO gathers
        the updated parameters after the inner optimizer step)."""
        inst = self
        rec = self.rec

        @functools.wraps(original)
        def step(engine, *args, **kwargs):
            if not inst.active:
                return original(engine, *args, **kwargs)
            rec.hold_step()
            try:
                return original(engine, *args, **kwargs)
            finally:
                try:
                    rec.release_step("deepspeed.engine")
                except Exception as exc:
                    inst.fail(exc)

        return step

    def _wrap_initialize(self, original):
        inst = self

        @functools.wraps(original)
        def initialize(*args, **kwargs):
            out = original(*args, **kwargs)
            try:
                engine = out[0] if isinstance(out, tuple) else out
                inst.rec.run_info["framework"] = "deepspeed"
                stage = engine.zero_optimization_stage()
                inst.rec.run_info["zero_stage"] = int(stage)
                inst.rec.run_info.setdefault("labels", {})["zero"] = str(int(stage))
            except Exception as exc:
                inst.fail(exc)
            return out

        return initialize
