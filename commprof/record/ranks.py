"""Where a process stands in the job: rank, world size, local rank.

The process group is the truth once initialised; before that the launchers'
variables are read (torchrun, Open MPI, MPICH/Intel MPI, Slurm, Horovod)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping, Optional

# (rank, world size, local rank, name) per launcher, most specific first.
_ENV_SCHEMES = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torch"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "horovod"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "openmpi"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "pmi"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm"),
)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    source: str  # "process_group", an env scheme name, or "default"

    @property
    def final(self) -> bool:
        return self.source == "process_group"


def _int(environ: Mapping[str, str], key: str) -> Optional[int]:
    try:
        return int(environ[key])
    except (KeyError, ValueError):
        return None


def from_env(environ: Optional[Mapping[str, str]] = None) -> RankInfo:
    environ = os.environ if environ is None else environ
    for rk, wk, lk, name in _ENV_SCHEMES:
        rank, world = _int(environ, rk), _int(environ, wk)
        if rank is not None and world is not None:
            local = _int(environ, lk)
            return RankInfo(rank, world, rank if local is None else local, name)
    return RankInfo(0, 1, 0, "default")


def from_process_group() -> Optional[RankInfo]:
    """Rank from torch.distributed if it is imported and initialised."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:  # pragma: no cover - a broken group is not our business
        return None
    local = from_env().local_rank if from_env().world_size == world else rank
    return RankInfo(rank, world, local, "process_group")


def detect() -> RankInfo:
    return from_process_group() or from_env()
