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
from ..recorder import now

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
                if int(stage) == 3:
                    inst._install_zero3(engine)
            except Exception as exc:
                inst.fail(exc)
            return out

        return initialize

    # -- ZeRO-3: its gathers and reduce-scatters per layer and phase ----------
    def _install_zero3(self, engine) -> None:
        """ZeRO-3's collectives tagged like FSDP's (source ``zero3``, detail
        ``"<phase> <layer>"``: analyzers/fsdp.py reads both): a module's
        parameter fetch (``fetch_sub_module``: ``forward`` / ``backward``,
        the whole call a ``wait`` row ``zero3_fetch``, what the module's user
        waited), the gathers it issues for other modules
        (``forward_prefetch`` / ``backward_prefetch``), the gradient bucket's
        reduce-scatter (``reduce``, the layer: the bucket's modules)."""
        from ..log import log_once

        coord = sys.modules.get("deepspeed.runtime.zero.partitioned_param_coordinator")
        stage3 = sys.modules.get("deepspeed.runtime.zero.stage3")
        cls = getattr(coord, "PartitionedParameterCoordinator", None)
        opt = getattr(stage3, "DeepSpeedZeroOptimizer_Stage3", None)
        gather = "_PartitionedParameterCoordinator__all_gather_params"
        reduce = "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads"
        if cls is None or opt is None or not all(hasattr(c, m) for c, m in
                                                 ((cls, "fetch_sub_module"), (cls, gather), (opt, reduce))):
            log_once("zero3-internals", "deepspeed: this DeepSpeed's ZeRO-3 internals differ from those commprof "
                     "knows; its collectives are recorded without layer or phase")
            return
        if getattr(self, "_zero3", None) is not None:
            return
        mods = {id(m): (n or "(root)") for n, m in engine.module.named_modules()}
        owner = {}
        for n, m in engine.module.named_modules():
            for p in m.parameters(recurse=False):
                owner[id(p)] = n or "(root)"
        self._zero3 = (mods, owner)
        groups = self.rec.run_info.setdefault("fsdp", {"groups": {}})["groups"]
        for n, m in engine.module.named_modules():
            ps = list(m.parameters(recurse=False))
            if ps:
                numel = sum(int(getattr(p, "ds_numel", p.numel())) for p in ps)
                groups[n or "(root)"] = {"version": "zero3", "params": len(ps), "numel": numel,
                                         "bytes": numel * ps[0].element_size(), "param_dtype": str(ps[0].dtype)
                                         .replace("torch.", "")}
        rec = self.rec
        inst = self

        def fetch_phase(args, prev):
            return ("forward" if args[2] else "backward", mods.get(id(args[1]), "?"), "zero3")

        def gather_phase(args, prev):
            params = args[1]
            first = next(iter(params), None)
            layer = owner.get(id(first), "?")
            forward = args[2] if len(args) > 2 else True
            if prev is not None and prev[2] == "zero3" and prev[1] == layer:
                return prev
            return (("forward" if forward else "backward") + "_prefetch", layer, "zero3")

        def reduce_phase(args, prev):
            bucket = args[0].ipg_buckets[args[1]]
            names = list(dict.fromkeys(owner.get(id(p), "?") for p in bucket.params))
            return ("reduce", "+".join(names) if names else "?", "zero3")

        def timed_fetch(original):
            tagged = inst.tagged(fetch_phase, original)

            @functools.wraps(original)
            def fetch_sub_module(coordinator, module, forward, *a, **k):
                if not inst.active or not module._parameters:
                    return tagged(coordinator, module, forward, *a, **k)
                t0 = now()
                try:
                    return tagged(coordinator, module, forward, *a, **k)
                finally:
                    try:
                        rec.region("wait", "zero3_fetch", "zero3",
                                   f"{'forward' if forward else 'backward'} {mods.get(id(module), '?')}", t0, now())
                    except Exception as exc:
                        inst.fail(exc)

            return fetch_sub_module

        self.patch(cls, "fetch_sub_module", timed_fetch)
        self.patch(cls, gather, functools.partial(self.tagged, gather_phase))
        self.patch(opt, reduce, functools.partial(self.tagged, reduce_phase))
