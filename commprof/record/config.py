"""The one configuration object; it round-trips through the environment and
through a JSON file in the bootstrap folder (DeepSpeed's multi-node runner
forwards only PYTHON*/NCCL*-prefixed variables, so the file next to
``sitecustomize.py`` is what reaches remote ranks)."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field, fields
from typing import Dict, Mapping, Optional, Tuple

from ..trace.files import atomic_write

ENV_PREFIX = "COMMPROF_"
CONFIG_FILE = "commprof_config.json"


@dataclass
class Config:
    #: Folder that receives the per-rank shards (``DIR/shards``).
    out_dir: str = ""
    #: Identifier shared by every process of one ``commprof record``.
    run_id: str = ""
    #: The command line being recorded (metadata only).
    command: Tuple[str, ...] = ()
    #: Launcher detected from the command (torchrun, python, horovodrun, ...).
    launcher: str = ""
    #: Seconds between journal flushes (what a SIGKILL can lose).
    flush_interval: float = 0.5
    #: Emit NVTX ranges (domain ``commprof``) for every recorded region.
    nvtx: bool = True
    #: Instruments to leave out (names as in ``commprof.instruments.ALL``).
    disable: Tuple[str, ...] = ()
    #: Print what the bootstrap does to stderr.
    verbose: bool = False
    #: Test hook: names of instruments that must raise inside their hook
    #: (to prove a failing instrument never breaks training).
    fault_inject: Tuple[str, ...] = ()
    #: Device-accurate times (CUDA events) for compute regions and collectives on CUDA.
    device_timing: bool = True
    #: DDP buckets timed by the native process-group hooks where they are
    #: built (``commprof record`` builds them once); False: the Python hooks
    native_hooks: bool = True
    #: Test hook: time regions with simulated device events that complete this
    #: many ms after they are recorded (a device with a backlog); 0 = off.
    simulate_device_lag_ms: float = 0.0
    #: Kernel mode: "START:COUNT" profiles optimizer steps START..START+COUNT-1
    #: with torch.profiler (CPU + CUDA activities); "" = off.
    kernels: str = ""
    #: GPU telemetry through NVML: "auto" (when CUDA is available), "on", "off".
    telemetry: str = "auto"
    #: Seconds between telemetry samples.
    telemetry_interval: float = 1.0
    #: How DDP's gradient buckets are timed: "auto" (the process group's pre/post
    #: hooks where torch has them and no Python comm hook is registered: DDP keeps
    #: its C++ path; else a timed comm hook), "comm-hook" (always the timed hook).
    ddp_timing: str = "auto"
    #: Keep a small progress file per rank (last and in-flight collective),
    #: rewritten at each flush, for ``--hang-timeout``.
    progress: bool = False
    #: Free-form labels added to the run metadata (``--label key=value``).
    labels: Dict[str, str] = field(default_factory=dict)

    # -- environment -------------------------------------------------------
    def to_env(self) -> Dict[str, str]:
        env = {}
        for f in fields(self):
            env[ENV_PREFIX + f.name.upper()] = json.dumps(_plain(getattr(self, f.name)))
        return env

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Optional["Config"]:
        environ = os.environ if environ is None else environ
        if ENV_PREFIX + "OUT_DIR" not in environ:
            return None
        kwargs = {}
        for f in fields(cls):
            key = ENV_PREFIX + f.name.upper()
            if key in environ:
                kwargs[f.name] = _typed(f, json.loads(environ[key]))
        return cls(**kwargs)

    # -- file ----------------------------------------------------------------
    def to_file(self, path: str) -> None:
        atomic_write(path, json.dumps({f.name: _plain(getattr(self, f.name)) for f in fields(self)}, indent=1))

    @classmethod
    def from_file(cls, path: str) -> "Config":
        with open(path) as fh:
            data = json.load(fh)
        known = {f.name: f for f in fields(cls)}
        return cls(**{k: _typed(known[k], v) for k, v in data.items() if k in known})

    def replace(self, **kw) -> "Config":
        return dataclasses.replace(self, **kw)


def _plain(value):
    if isinstance(value, tuple):
        return list(value)
    return value


def _typed(f: dataclasses.Field, value):
    if isinstance(value, list):
        return tuple(value)
    if f.type in ("float",) and isinstance(value, int):
        return float(value)
    return value
