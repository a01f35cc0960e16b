"""The rank processes one ``commprof record`` started on this host."""
from __future__ import annotations

import os
import socket
from typing import List


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def own_rank_pids(shard_dir: str) -> List[int]:
    """Rank processes of this ``commprof record`` (this host, started under
    it) that are still alive: other participants' ranks of a shared folder
    are left alone."""
    import glob
    import json

    host = socket.gethostname()
    pids = []
    for meta in glob.glob(os.path.join(shard_dir, f"{host}.*.meta.json")):
        try:
            pid = int(os.path.basename(meta)[len(host) + 1:].split(".")[0])
            with open(meta) as fh:
                owner = json.load(fh).get("record_pid")
        except (ValueError, OSError):
            continue
        if pid != os.getpid() and owner in (None, os.getpid()) and alive(pid):
            pids.append(pid)
    return pids


