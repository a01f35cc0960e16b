"""Leaving a distributed run safely (shared by workloads/ and the test
workloads)."""
import time


def wait_released(tensors, timeout=10.0):
    """Wait until torch.distributed's worker threads hold no reference to
    these tensors (the last collective's), so that the process can exit.

    With torch 2.14 and gloo, a worker thread that destroys a finished
    collective's work after the interpreter has begun finalizing must take
    the GIL to release the work's Python-owned tensors, and the process
    aborts ("terminate called without an active exception"; a barrier keeps
    the previous collective's work alive until the barrier's own work is
    destroyed; pytorch/pytorch#190489). Seen in CI and reproduced here
    under load (1 run in 14)."""
    deadline = time.monotonic() + timeout
    while any(t._use_count() > 1 for t in tensors) and time.monotonic() < deadline:
        time.sleep(0.001)
