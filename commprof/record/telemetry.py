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
from typing import Optional

from .log import log_once


class Sampler:
    def __init__(self, recorder, interval: float = 1.0):
        self.rec = recorder
        self.interval = interval
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._handle = None
        self._nvml = None
        self.index = None

    def start(self, device_index: int = 0) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.index = device_index
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception as exc:
            log_once("nvml", f"GPU telemetry off: NVML not available ({type(exc).__name__})")
            return False
        self._thread = threading.Thread(target=self._loop, name="commprof-telemetry", daemon=True)
        self._thread.start()
        return True

    def sample(self) -> None:
        nv, h, d = self._nvml, self._handle, str(self.index)
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        for name, value in (("gpu.util", util.gpu), ("gpu.mem_used_mib", mem.used / 2**20),
                            ("gpu.power_w", nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                            ("gpu.sm_clock_mhz", nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))):
            self.rec.metric(name, float(value), source="nvml", detail=d)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception as exc:
                log_once("nvml-sample", f"GPU telemetry stopped: {exc!r}")
                return

    def stop(self) -> None:
        self._stop.set()


def device_index() -> int:
    """NVML index of this process's CUDA device: the current device,
    translated through CUDA_VISIBLE_DEVICES when that lists indices."""
    import os
    import sys

    torch = sys.modules.get("torch")
    try:
        current = torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else \
            int(os.environ.get("LOCAL_RANK", 0))
    except Exception:
        current = 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible) and current < len(visible):
        return int(visible[current])
    return current
