"""The one configuration object; it round-trips through the environment and
through a JSON file in the bootstrap folder (DeepSpeed's multi-node runner
forwards only PYTHON*/NCCL*-prefixed variables, so the file next to
``sitecustomize.py`` is what reaches remote ranks)."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from ..trace.files import atomic_write

ENV_PREFIX = "COMMPROF_"
CONFIG_FILE = "commprof_config.json"


def _opt(default, flag: str, help: str, **kw):
    """A Config field that is also a ``commprof record`` option: its flag,
    help and (optional) metavar, choices, ``negate`` (a ``--no-...`` flag
    that turns a True default off), ``check`` (value -> error text or None)
    and ``hidden`` (test hooks). :func:`add_options` and :func:`from_options`
    are generated from these."""
    meta = {"option": dict(flag=flag, help=help, **kw)}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def _kernels_error(value: str) -> Optional[str]:
    if not value:
        return None
    try:
        start, _, count = value.partition(":")
        if int(start) < 0 or int(count or 1) < 1:
            raise ValueError
    except ValueError:
        return f"--kernels expects START:COUNT (steps), got {value!r}"
    return None


def _positive(flag: str):
    return lambda v: None if v > 0 else f"{flag} must be > 0"


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
    flush_interval: float = _opt(0.5, "--flush-interval", "seconds between journal flushes (what a SIGKILL can "
                                 "lose); default 0.5", metavar="S", check=_positive("--flush-interval"))
    #: Emit NVTX ranges (domain ``commprof``) for every recorded region.
    nvtx: bool = _opt(True, "--no-nvtx", "do not emit NVTX ranges", negate=True)
    #: Instruments to leave out (names as in ``commprof.instruments.ALL``).
    disable: Tuple[str, ...] = _opt((), "--disable", "leave an instrument out (repeatable)", metavar="INSTRUMENT")
    #: Print what the bootstrap does to stderr.
    verbose: bool = _opt(False, "--verbose", "print what the bootstrap does to stderr", short="-v")
    #: Test hook: names of instruments that must raise inside their hook
    #: (to prove a failing instrument never breaks training).
    fault_inject: Tuple[str, ...] = _opt((), "--fault-inject", "", hidden=True)
    #: Device-accurate times (CUDA events) for compute regions and collectives on CUDA.
    device_timing: bool = _opt(True, "--no-device-timing", "do not time regions with CUDA events", negate=True)
    #: DDP buckets timed by the native process-group hooks where they are
    #: built (``commprof record`` builds them once); False: the Python hooks
    native_hooks: bool = _opt(True, "--no-native-hooks", "time DDP's buckets with the Python process-group hooks, "
                              "not the native (C++) ones (which commprof builds once per torch version)", negate=True)
    #: Test hook: time regions with simulated device events that complete this
    #: many ms after they are recorded (a device with a backlog); 0 = off.
    simulate_device_lag_ms: float = _opt(0.0, "--simulate-device-lag-ms", "", hidden=True)
    #: Kernel mode: "START:COUNT" profiles optimizer steps START..START+COUNT-1
    #: with torch.profiler (CPU + CUDA activities); "" = off.
    kernels: str = _opt("", "--kernels", "kernel mode: profile optimizer steps START..START+COUNT-1 with "
                        "torch.profiler (CUDA kernels, NCCL, cuDNN) and merge the kernels into the trace",
                        metavar="START:COUNT", check=_kernels_error)
    #: GPU telemetry through NVML: "auto" (when CUDA is available), "on", "off".
    telemetry: str = _opt("auto", "--telemetry", "GPU telemetry through NVML (auto: when CUDA is available)",
                          choices=("auto", "on", "off"))
    #: Seconds between telemetry samples.
    telemetry_interval: float = _opt(1.0, "--telemetry-interval", "seconds between GPU telemetry samples "
                                     "(default 1)", metavar="S", check=_positive("--telemetry-interval"))
    #: How DDP's gradient buckets are timed: "auto" (the process group's pre/post
    #: hooks where torch has them and no Python comm hook is registered: DDP keeps
    #: its C++ path; else a timed comm hook), "comm-hook" (always the timed hook).
    ddp_timing: str = _opt("auto", "--ddp-timing", "how DDP's gradient buckets are timed: auto (process-group "
                           "hooks, DDP keeps its C++ path; a timed comm hook where torch has none) or comm-hook "
                           "(always torch's allreduce_hook, timed)", choices=("auto", "comm-hook"))
    #: Keep a small progress file per rank (last and in-flight collective),
    #: rewritten at each flush, for ``--hang-timeout``.
    progress: bool = False
    #: Collectives each process keeps in its crash-proof ring (commprof/trace/ring.py).
    ring_size: int = _opt(4096, "--ring-size", "collectives each rank keeps in its crash-proof ring for failure "
                          "forensics (default 4096, 128 B each)", metavar="N",
                          check=lambda v: None if v >= 16 else "--ring-size must be at least 16")
    #: Free-form labels added to the run metadata (``--label key=value``).
    labels: Dict[str, str] = _opt({}, "--label", "add a label to the run metadata (used for grouping in reports)",
                                  metavar="KEY=VALUE")

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


# -- command-line options, generated from the fields --------------------------
def add_options(parser) -> None:
    """``commprof record``'s recorder options, one per Config field that
    declares one (a new option is one field)."""
    import argparse

    for f in fields(Config):
        o = f.metadata.get("option")
        if o is None:
            continue
        names = [o["short"], o["flag"]] if o.get("short") else [o["flag"]]
        kw: Dict[str, Any] = {"dest": f.name, "help": argparse.SUPPRESS if o.get("hidden") else o["help"]}
        if f.type == "bool":
            kw.update(action="store_false" if o.get("negate") else "store_true", default=f.default)
        elif f.type.startswith(("Tuple", "Dict")):
            kw.update(action="append", default=[])
        else:
            kw.update(type={"float": float, "int": int}.get(f.type, str), default=f.default)
        for k in ("metavar", "choices"):
            if k in o:
                kw[k] = o[k]
        parser.add_argument(*names, **kw)


def from_options(args) -> Dict[str, Any]:
    """Config keyword arguments from parsed ``commprof record`` options;
    a bad value raises ValueError with a one-line message."""
    out: Dict[str, Any] = {}
    for f in fields(Config):
        o = f.metadata.get("option")
        if o is None:
            continue
        v = getattr(args, f.name)
        if f.type.startswith("Dict"):
            v = _pairs(o["flag"], v)
        elif f.type.startswith("Tuple"):
            v = tuple(v)
        err = o["check"](v) if o.get("check") else None
        if err:
            raise ValueError(err)
        out[f.name] = v
    return out


def _pairs(flag: str, values) -> Dict[str, str]:
    out = {}
    for v in values or []:
        if "=" not in v:
            raise ValueError(f"{flag} expects KEY=VALUE, got {v!r}")
        k, val = v.split("=", 1)
        out[k.strip()] = val.strip()
    return out

