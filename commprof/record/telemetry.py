"""GPU telemetry: a per-rank sampler thread using NVML (package
``nvidia-ml-py``): utilisation (%), memory used (MiB), power (W) and SM
clock (MHz) of the rank's GPU, every ``interval`` seconds, as ``metric``
events named ``gpu.util``, ``gpu.mem_used_mib``, ``gpu.power_w``,
``gpu.sm_clock_mhz`` (``detail`` = NVML device index).

``mode``: ``auto`` samples when CUDA is available; ``on`` always tries;
``off`` never. When NVML cannot be used it says so once and records
nothing."""
from __future__ import annotations

import threading
from typing import Optional, Tuple

from .log import log_once


#: metric name -> how to read it from NVML (value in the metric's unit)
METRICS = (
    ("gpu.util", lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu),
    ("gpu.mem_used_mib", lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
    ("gpu.power_w", lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
    ("gpu.sm_clock_mhz", lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
)


class Sampler:
    """Samples at start and then every ``interval`` seconds. A metric NVML
    cannot give (NotSupported on some GPUs, MIG instances) is dropped alone,
    said once; the others go on."""

    def __init__(self, recorder, interval: float = 1.0):
        self.rec = recorder
        self.interval = interval
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._handle = None
        self._nvml = None
        self.index = None
        self.metrics = list(METRICS)

    def start(self, target: Tuple[str, object] = ("index", 0)) -> bool:
        """``target``: ("index", n) or ("uuid", "GPU-..."/"MIG-..."), see :func:`nvml_target`."""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            kind, value = target
            if kind == "uuid":
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(str(value))
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(value))
            self.index = value
        except Exception as exc:
            log_once("nvml", f"GPU telemetry off: NVML not available ({type(exc).__name__})")
            return False
        self._thread = threading.Thread(target=self._loop, name="commprof-telemetry", daemon=True)
        self._thread.start()
        return True

    def sample(self) -> None:
        nv, h, d = self._nvml, self._handle, str(self.index)
        for item in list(self.metrics):
            name, read = item
            try:
                value = float(read(nv, h))
            except Exception as exc:
                self.metrics.remove(item)
                log_once(f"nvml-{name}", f"GPU telemetry: {name} not available ({type(exc).__name__}); "
                         "the other metrics go on")
                continue
            self.rec.metric(name, value, source="nvml", detail=d)

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as exc:
                log_once("nvml-sample", f"GPU telemetry stopped: {exc!r}")
                return
            if not self.metrics or self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()


def nvml_target(visible: str, current: int) -> Tuple[str, object]:
    """Which NVML device is CUDA device ``current`` of this process, from
    ``CUDA_VISIBLE_DEVICES``:

    - a UUID entry (``GPU-…`` or ``MIG-…``, as ``nvidia-smi -L`` prints them)
      is looked up by UUID;
    - an index entry is taken as the NVML index — exact when CUDA enumerates
      in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML's order);
      under CUDA's default FASTEST_FIRST order the two can differ on mixed
      machines, which is why :func:`device_index` asks torch for the UUID
      first;
    - nothing listed, or fewer entries than ``current`` (CUDA stops reading
      the list at the first invalid entry): the current index itself.
    Returns ("uuid", str) or ("index", int)."""
    valid = []
    for v in (e.strip() for e in (visible or "").split(",")):
        if v.isdigit() or v.startswith(("GPU-", "MIG-")):
            valid.append(v)
        else:
            break
    if current >= len(valid):
        return ("index", current)
    v = valid[current]
    return ("uuid", v) if v.startswith(("GPU-", "MIG-")) else ("index", int(v))


def device_index() -> Tuple[str, object]:
    """NVML target of this process's CUDA device (see :func:`nvml_target`):
    the device's own UUID from torch when CUDA is initialised (right under
    any CUDA_DEVICE_ORDER), else from the environment."""
    import os
    import sys

    from .device import cuda_initialized

    torch = sys.modules.get("torch")
    current = int(os.environ.get("LOCAL_RANK", 0))
    if cuda_initialized():
        try:
            current = torch.cuda.current_device()
            uuid = str(torch.cuda.get_device_properties(current).uuid)
            if uuid:
                return ("uuid", uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid)
        except Exception:
            pass
    if os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").upper() != "PCI_BUS_ID":
        log_once("nvml-order", "GPU telemetry: device picked by index before CUDA was initialised; "
                 "exact only with CUDA_DEVICE_ORDER=PCI_BUS_ID")
    return nvml_target(os.environ.get("CUDA_VISIBLE_DEVICES", ""), current)
