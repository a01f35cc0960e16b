"""FSDP2 (``fully_shard``) and FSDP1 (``FullyShardedDataParallel``): the
layer and phase of every collective FSDP issues.

FSDP's collectives are plain ``torch.distributed`` calls (FSDP2:
``all_gather_single`` / ``reduce_scatter_single`` / ``all_reduce``; FSDP1:
``all_gather_into_tensor`` / ``reduce_scatter_tensor``), recorded by the
collectives instrument. This one wraps the parameter-group methods that
issue them and tags the calls inside through the recorder's thread-local
``fsdp`` slot: the collectives instrument then records source ``fsdp``,
detail ``"<phase> <layer>"``. Phases:

- ``forward``: the unshard (all-gather) before a group's forward;
- ``forward_prefetch`` / ``backward_prefetch``: an unshard issued ahead of
  its use (``set_modules_to_forward_prefetch``, implicit backward prefetch,
  FSDP1's ``forward_prefetch`` / ``backward_prefetch``);
- ``backward``: the re-gather before a group's backward
  (``reshard_after_forward=True``);
- ``reduce``: the gradient reduce-scatter after a group's backward (and
  HSDP's all-reduce, the collective's name tells them apart);
- ``unshard``: any other unshard (the user's ``module.unshard()``).

Layer: the group's module FQN (``layers.0``), ``(root)`` for the root.
An asynchronous unshard (``unshard_async_op`` / explicit prefetch on
gloo) is waited for in ``wait_for_unshard``: that wait is a ``wait`` event
``fsdp_unshard_wait`` (source ``fsdp``, detail the same ``"<phase>
<layer>"``), the time the layer's user waited for its gather. Per group,
once: unpadded parameter bytes, dtypes (mixed precision's ``reduce_dtype``),
``reshard_after_forward``, into the rank's metadata (``fsdp``).

On a torch whose FSDP internals differ (a method gone), FSDP's collectives
are recorded as plain collectives and the log says so once."""
from __future__ import annotations

import functools
import sys

from .base import Instrument
from ..log import log_once
from ..recorder import now

ROOT = "(root)"
# FSDP2's parameter-group methods, FSDP1's runtime functions
_FSDP2 = ("unshard", "wait_for_unshard", "post_backward", "_prefetch_unshard")
_FSDP1 = ("_unshard", "_prefetch_handle", "_reduce_grad", "_reduce_grad_no_shard")


def layer_name(fqn: str) -> str:
    """A group's module FQN as the report shows it (FSDP1's wrapper
    prefixes dropped; the root is ``(root)``)."""
    name = ".".join(p for p in fqn.split(".") if p and p != "_fsdp_wrapped_module")
    return name or ROOT


class FSDPInstrument(Instrument):
    name = "fsdp"
    trigger = "torch.distributed.fsdp"

    def _install(self) -> None:
        self._groups = {}       # id(group) -> its metadata (once per group)
        self._fqn1 = {}         # FSDP1: id(wrapped module) -> FQN
        v2 = self._install_fsdp2()
        v1 = self._install_fsdp1()
        if not (v2 or v1):
            log_once("fsdp-internals", "fsdp: this torch's FSDP internals differ from those commprof knows; "
                     "FSDP's collectives are recorded as plain collectives (no layer or phase)")

    def _note_group(self, key, fqn: str, info) -> None:
        if key in self._groups:
            return
        self._groups[key] = True
        try:
            self.rec.run_info.setdefault("fsdp", {"groups": {}})["groups"][fqn] = info()
        except Exception as exc:  # metadata only: the tags go on
            log_once("fsdp-meta", f"fsdp: group metadata not recorded: {exc!r}")

    # -- FSDP2 ---------------------------------------------------------------
    def _install_fsdp2(self) -> bool:
        mod = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_param_group")
        common = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_common")
        cls = getattr(mod, "FSDPParamGroup", None)
        state = getattr(common, "TrainingState", None)
        if cls is None or state is None or not all(hasattr(cls, m) for m in _FSDP2):
            return False
        forward, pre_backward = state.FORWARD, state.PRE_BACKWARD
        tls = self.rec.tls

        def unshard_phase(args, prev):
            group = args[0]
            fqn = layer_name(group._module_fqn)
            if id(group) not in self._groups:   # FSDP2 in use (its module is imported by torch.compile, DDP ...)
                self.rec.run_info["framework"] = "fsdp2"
            self._note_group(id(group), fqn, lambda: _fsdp2_info(group))
            if prev is not None and prev[0] in ("forward_prefetch", "backward_prefetch") and prev[1] is None:
                return (prev[0], fqn, "fsdp")
            ts = group._training_state
            return ("forward" if ts == forward else "backward" if ts == pre_backward else "unshard", fqn, "fsdp")

        def prefetch_phase(args, prev):
            pass_type = args[1] if len(args) > 1 else "forward"
            return (f"{pass_type}_prefetch", None, "fsdp")    # the layer: the target's, in its unshard

        def reduce_phase(args, prev):
            return ("reduce", layer_name(args[0]._module_fqn), "fsdp")

        self.patch(cls, "unshard", functools.partial(self.tagged, unshard_phase))
        self.patch(cls, "post_backward", functools.partial(self.tagged, reduce_phase))
        self.patch(cls, "_prefetch_unshard", lambda f: staticmethod(self.tagged(prefetch_phase, f)))
        self.patch(cls, "wait_for_unshard", functools.partial(self._wrap_wait, forward, pre_backward, tls))
        return True

    def _wrap_wait(self, forward, pre_backward, tls, original):
        """An asynchronous unshard's wait: timed as a ``wait`` event before
        FSDP copies out (FSDP's own ``work.wait()`` then returns at once)."""
        inst = self
        rec = self.rec

        @functools.wraps(original)
        def wait_for_unshard(group, *args, **kwargs):
            if inst.active:
                try:
                    result = group._all_gather_result
                    work = getattr(result, "all_gather_work", None) if result is not None else None
                    if work is not None and hasattr(work, "wait"):
                        ts = group._training_state
                        phase = "forward" if ts == forward else "backward" if ts == pre_backward else "unshard"
                        t0 = now()
                        work.wait()
                        rec.region("wait", "fsdp_unshard_wait", "fsdp",
                                   f"{phase} {layer_name(group._module_fqn)}", t0, now())
                except Exception as exc:
                    inst.fail(exc)
            return original(group, *args, **kwargs)

        return wait_for_unshard

    # -- FSDP1 ---------------------------------------------------------------
    def _install_fsdp1(self) -> bool:
        rt = sys.modules.get("torch.distributed.fsdp._runtime_utils")
        fp = sys.modules.get("torch.distributed.fsdp._flat_param")
        api = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
        hts = getattr(fp, "HandleTrainingState", None)
        fsdp_cls = getattr(api, "FullyShardedDataParallel", None)
        if rt is None or hts is None or fsdp_cls is None or not all(hasattr(rt, f) for f in _FSDP1):
            return False
        forward, pre_backward = hts.FORWARD, hts.BACKWARD_PRE
        names = self._fqn1

        def fqn_of(handle) -> str:
            return names.get(id(getattr(handle, "_fully_sharded_module", None)), "?")

        def unshard_phase(args, prev):
            handle = args[1] if len(args) > 1 else None
            fqn = fqn_of(handle)
            if handle is not None and id(handle) not in self._groups:
                self.rec.run_info["framework"] = "fsdp1"
                self._note_group(id(handle), fqn, lambda: _fsdp1_info(handle))
            if prev is not None and prev[0] in ("forward_prefetch", "backward_prefetch"):
                return (prev[0], fqn, "fsdp")
            ts = getattr(handle, "_training_state", None)
            return ("forward" if ts == forward else "backward" if ts == pre_backward else "unshard", fqn, "fsdp")

        def prefetch_phase(args, prev):
            mode = args[2] if len(args) > 2 else None
            return ("backward_prefetch" if "BACKWARD" in str(mode) else "forward_prefetch", None, "fsdp")

        def reduce_phase(args, prev):
            return ("reduce", fqn_of(args[1] if len(args) > 1 else None), "fsdp")

        self.patch(rt, "_unshard", functools.partial(self.tagged, unshard_phase))
        self.patch(rt, "_prefetch_handle", functools.partial(self.tagged, prefetch_phase))
        self.patch(rt, "_reduce_grad", functools.partial(self.tagged, reduce_phase))
        self.patch(rt, "_reduce_grad_no_shard", functools.partial(self.tagged, reduce_phase))
        self.patch(fsdp_cls, "__init__", self._wrap_init1)
        return True

    def _wrap_init1(self, original):
        """FSDP1's FQNs: after each wrapper's construction, the names of the
        FSDP modules under it (the outermost, built last, gives full ones)."""
        inst = self

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            original(module, *args, **kwargs)
            try:
                cls = type(module)
                for name, m in module.named_modules():
                    if isinstance(m, cls):
                        inst._fqn1[id(getattr(m, "_fsdp_wrapped_module", m))] = layer_name(name)
            except Exception as exc:
                inst.fail(exc)

        return __init__


def _dtype(d) -> str:
    return str(d).replace("torch.", "") if d is not None else ""


def _fsdp2_info(group) -> dict:
    params = list(group.fsdp_params)
    numel = sum(int(p._orig_size.numel()) for p in params)
    nbytes = sum(int(p._orig_size.numel()) * p.sharded_param.element_size() for p in params)
    padded = sum(int(p._sharded_param_data.numel()) * p._sharded_param_data.element_size() for p in params)
    world = group._all_gather_process_group.size() if hasattr(group, "mesh_info") else 1
    orig = getattr(group, "_orig_dtype", None)
    return {"version": 2, "params": len(params), "numel": numel, "bytes": nbytes,
            "padded_bytes": padded * world,
            "reshard_after_forward": bool(group._reshard_after_forward),
            "param_dtype": _dtype(getattr(params[0], "param_dtype", None) or orig) if params else "",
            "orig_dtype": _dtype(orig),
            "reduce_dtype": _dtype(getattr(group, "_reduce_dtype", None) or orig),
            "hsdp": bool(getattr(group, "_is_hsdp", False))}


def _fsdp1_info(handle) -> dict:
    flat = handle.flat_param
    numel = int(getattr(flat, "_unpadded_unsharded_size", flat.size()).numel())
    orig = getattr(handle, "_orig_param_dtype", None)
    return {"version": 1, "params": len(getattr(flat, "_fqns", ()) or ()), "numel": numel,
            "bytes": numel * flat.element_size(),
            "padded_bytes": int(getattr(flat, "_padded_unsharded_size", flat.size()).numel()) * flat.element_size(),
            "reshard_after_forward": str(getattr(handle, "_sharding_strategy", "")).endswith("FULL_SHARD"),
            "param_dtype": _dtype(getattr(handle, "_fwd_bwd_param_dtype", None) or orig),
            "orig_dtype": _dtype(orig),
            "reduce_dtype": _dtype(getattr(handle, "_reduce_dtype", None) or orig),
            "hsdp": "HYBRID" in str(getattr(handle, "_sharding_strategy", ""))}
