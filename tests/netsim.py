"""A cluster simulator that is *not* commprof's cost model: collectives
timed by moving chunks over links, step by step, for tests of the model
on data it did not generate.

- Ring all_reduce / reduce_scatter / all_gather: the ring's steps are
  simulated one by one; in every step each rank sends one chunk (S / n) to
  its neighbour and the step ends when the slowest link has delivered it
  (the link into the next node is the network, the others NVLink), with a
  per-message jitter. Steps are synchronous: a network hop slows every
  step, not only the steps that cross nodes (the closed form of NCCL's
  tuner counts only those).
- Tree all_reduce: a pipeline of chunks of ``chunk`` bytes up a tree
  (a chain inside each node, a binary tree of ``ceil(log2 nodes)`` levels
  across nodes) and down again; a chunk leaves a stage when it arrived and
  the stage has sent the previous one; across more than two nodes a
  parent's link carries two children's chunks.
- Protocols: ``LL`` (a quarter of the link bandwidth, a third of the
  per-message latency, up to 1 MiB) and ``Simple``; the "library" runs
  whichever (algorithm, protocol) its simulation says is fastest for that
  call, as a perfectly tuned NCCL would.

Numbers are per rank and per link: ``intra_GBps`` (NVLink-class) and
``inter_GBps`` (the NIC share of one rank), latencies per message."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Dict, List, Tuple


@dataclass
class Cluster:
    ppn: int = 8
    intra_GBps: float = 150.0
    inter_GBps: float = 20.0
    intra_lat_us: float = 2.0
    inter_lat_us: float = 7.0
    launch_us: float = 9.0
    chunk: int = 64 * 1024
    jitter: float = 0.03

    def _link(self, nbytes: float, inter: bool, proto: str, rnd: random.Random) -> float:
        bw = (self.inter_GBps if inter else self.intra_GBps) * 1e9
        lat = (self.inter_lat_us if inter else self.intra_lat_us) * 1e-6
        if proto == "LL":
            bw, lat = bw / 4, lat / 3
        return (lat + nbytes / bw) * (1 + self.jitter * rnd.random())

    def ring(self, op: str, nbytes: float, n: int, proto: str, rnd: random.Random) -> float:
        nodes = math.ceil(n / self.ppn)
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        chunk = nbytes / n
        t = self.launch_us * 1e-6
        links = min(n, 2 * self.ppn)
        for _ in range(steps):
            # every link of the ring carries one chunk; a network link (one per node) gates the step
            t += max(self._link(chunk, nodes > 1 and k % self.ppn == self.ppn - 1, proto, rnd)
                     for k in range(links))
        return t

    def tree(self, nbytes: float, n: int, proto: str, rnd: random.Random) -> float:
        nodes = math.ceil(n / self.ppn)
        p = min(self.ppn, n)
        stages = [False] * (p - 1) + [True] * (math.ceil(math.log2(nodes)) if nodes > 1 else 0)
        stages = stages + stages[::-1]              # reduce up, broadcast down
        chunks = min(64, max(1, math.ceil(nbytes / self.chunk)))
        size = nbytes / chunks
        free = [0.0] * len(stages)                  # when each stage can send its next chunk
        t0 = self.launch_us * 1e-6
        end = t0
        for _c in range(chunks):
            t = t0
            for k, inter in enumerate(stages):
                # a binary tree's parent takes two children's chunks (and sends to two): half the link each;
                # two nodes are one edge
                t = max(t, free[k]) + self._link(size * (2 if inter and nodes > 2 else 1), inter, proto, rnd)
                free[k] = t
            end = t
        return end

    def time(self, op: str, nbytes: float, n: int, rnd: random.Random) -> Tuple[float, str]:
        """The fastest (algorithm, protocol) of this call, and its name."""
        if n <= 1:
            return 0.0, "-"
        best = None
        for proto in ("LL", "Simple"):
            if proto == "LL" and nbytes > (1 << 20):
                continue
            cands = [("ring", self.ring(op, nbytes, n, proto, random.Random(rnd.random())))]
            if op == "all_reduce":
                cands.append(("tree", self.tree(nbytes, n, proto, random.Random(rnd.random()))))
            for algo, t in cands:
                if best is None or t < best[0]:
                    best = (t, f"{algo}/{proto}")
        return best


def nccl_tests_rows(cluster: Cluster, n: int, sizes: List[int], op: str = "all_reduce", iters: int = 3,
                    seed: int = 0) -> List[Dict]:
    """commprof-bench-style rows (op, bytes, ranks, ranks_per_node,
    out_of_place {time_us}) of a simulated nccl-tests run."""
    rnd = random.Random(seed * 1009 + n)
    rows = []
    for s in sizes:
        t = sum(cluster.time(op, s, n, rnd)[0] for _ in range(iters)) / iters
        rows.append({"op": op, "bytes": int(s), "ranks": n, "ranks_per_node": min(cluster.ppn, n),
                     "out_of_place": {"time_us": t * 1e6}, "in_place": None})
    return rows
