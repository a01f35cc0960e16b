"""A cluster on one machine, for tests and by hand: K "nodes", each a
network namespace with its own hostname (UTS namespace), its own
CLOCK_MONOTONIC (time namespace, ``unshare --time --monotonic``) and one
link to a bridge in the root namespace, shaped with ``tc`` (rate and
latency, both directions).

Traffic only goes between the nodes' own addresses on the bridge the
cluster created; everything (namespaces, veth pairs, bridge) is removed by
``down()``, which the pytest fixture and the context manager always call.

    python tests/cluster/cluster.py --nodes 2 --rate-mbit 200 --latency-ms 1 -- CMD  # CMD on every node
    with Cluster(2, rate_mbit=200) as c:
        p = c.nodes[1].popen(["python", "train.py"], env=...)

Processes on a node run as ``ip netns exec NS unshare --uts --time
--monotonic OFFSET --fork -- sh -c 'hostname NAME; exec CMD'``: every
process started there sees the node's hostname and clock. Node k's
monotonic clock is ``k * clock_step_s`` ahead of the host's unless
``offsets`` says otherwise.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import uuid
from typing import Dict, List, Optional, Sequence

SUBNET_BASE = "10.231"


def _ip(*args, check=True, ns: Optional[str] = None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def why_unavailable() -> Optional[str]:
    """None when this machine can build a cluster, else the reason (for a skip)."""
    if os.geteuid() != 0:
        return "the one-machine cluster needs root (network, UTS and time namespaces)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"the one-machine cluster needs {tool!r}"
    name = f"cpprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"network namespaces not permitted: {r.stderr.strip()}"
    try:
        r = subprocess.run(["ip", "netns", "exec", name, "unshare", "--uts", "--time", "--monotonic", "5",
                            "--fork", "true"], capture_output=True, text=True)
        if r.returncode != 0:
            return f"UTS/time namespaces not permitted: {r.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class Node:
    def __init__(self, cluster: "Cluster", index: int, offset_s: float):
        self.cluster = cluster
        self.index = index
        self.name = f"node{index}"
        self.ns = f"cp{cluster.tag}n{index}"
        self.veth_host = f"cp{cluster.tag}v{index}"
        self.addr = f"{cluster.subnet}.{10 + index}"
        self.offset_s = offset_s
        self.rate_mbit: Optional[float] = None
        self.latency_ms: float = 0.0

    def wrap(self, cmd: Sequence[str]) -> List[str]:
        """The command line that runs ``cmd`` on this node."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "--time", "--monotonic",
                str(int(self.offset_s)), "--fork", "--kill-child", "--", "sh", "-c",
                f'hostname {self.name} && exec "$@"', "sh", *cmd]

    def popen(self, cmd: Sequence[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.wrap(cmd), **kw)

    def run(self, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.wrap(cmd), **kw)

    def shape(self, rate_mbit: Optional[float], latency_ms: float = 0.0) -> None:
        """Shape this node's link in both directions: rate with ``tbf``, latency
        with ``netem`` (where the kernel has it; this VM's does not).
        ``rate_mbit=None`` and zero latency remove the shaping."""
        self.rate_mbit, self.latency_ms = rate_mbit, latency_ms
        for dev, ns in (("eth0", self.ns), (self.veth_host, None)):
            _ip("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)
            if latency_ms:
                args = ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "limit", "100000",
                        "delay", f"{latency_ms}ms"]
                r = _ip(*args, ns=ns, check=False)
                if r.returncode != 0:
                    raise RuntimeError(f"latency shaping needs netem: {r.stderr.strip()}")
            if rate_mbit is not None:
                parent = ["parent", "1:1"] if latency_ms else ["root"]
                burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 / 250))   # >= rate / HZ
                _ip("tc", "qdisc", "add", "dev", dev, *parent, "tbf", "rate", f"{rate_mbit}mbit",
                    "burst", str(burst), "latency", "200ms", ns=ns)


    def shape_egress(self, rate_mbit: Optional[float], slow_to: Sequence[str] = (),
                     slow_mbit: Optional[float] = None) -> None:
        """Shape what this node sends: to the addresses ``slow_to`` at
        ``slow_mbit``, everything else at ``rate_mbit`` (None: unshaped): an
        htb qdisc with two classes, the slow one chosen by a u32 filter on
        the destination (this kernel has htb and u32, no prio or netem).
        Shaping both ends' egress makes one slow link between two nodes
        whose other links are normal (a bad cable or route, not a NIC). The
        receive side is left unshaped."""
        _ip("tc", "qdisc", "del", "dev", self.veth_host, "root", check=False)
        _ip("tc", "qdisc", "del", "dev", "eth0", "root", ns=self.ns, check=False)
        _ip("tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10", ns=self.ns)
        for cls, rate in (("1:10", rate_mbit or 100000), ("1:30", slow_mbit or rate_mbit or 100000)):
            _ip("tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", cls, "htb", "rate", f"{rate}mbit",
                "quantum", "60000", ns=self.ns)
        for addr in slow_to:
            _ip("tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                "match", "ip", "dst", f"{addr}/32", "flowid", "1:30", ns=self.ns)


class Cluster:
    def __init__(self, n_nodes: int, rate_mbit: Optional[float] = None, latency_ms: float = 0.0,
                 offsets: Optional[Sequence[float]] = None, clock_step_s: float = 1000.0):
        if n_nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.tag = uuid.uuid4().hex[:4]
        self.bridge = f"cp{self.tag}br"
        self.subnet = self._free_subnet()
        offsets = list(offsets) if offsets is not None else [k * clock_step_s for k in range(n_nodes)]
        self.nodes = [Node(self, k, offsets[k]) for k in range(n_nodes)]
        self._rate, self._latency = rate_mbit, latency_ms
        self.up_ = False

    @staticmethod
    def _free_subnet() -> str:
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        for n in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
            used += subprocess.run(["ip", "netns", "exec", n, "ip", "-o", "-4", "addr"],
                                   capture_output=True, text=True).stdout
        for third in range(10, 250):
            if f"{SUBNET_BASE}.{third}." not in used:
                return f"{SUBNET_BASE}.{third}"
        raise RuntimeError("no free 10.231.x.0/24 subnet for a test cluster")

    def up(self) -> "Cluster":
        try:
            _ip("ip", "link", "add", self.bridge, "type", "bridge")
            _ip("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("ip", "link", "set", self.bridge, "up")
            for node in self.nodes:
                _ip("ip", "netns", "add", node.ns)
                _ip("ip", "link", "add", node.veth_host, "type", "veth", "peer", "name", "eth0",
                    "netns", node.ns)
                _ip("ip", "link", "set", node.veth_host, "master", self.bridge)
                _ip("ip", "link", "set", node.veth_host, "up")
                _ip("ip", "addr", "add", f"{node.addr}/24", "dev", "eth0", ns=node.ns)
                _ip("ip", "link", "set", "eth0", "up", ns=node.ns)
                _ip("ip", "link", "set", "lo", "up", ns=node.ns)
                if self._rate is not None or self._latency:
                    node.shape(self._rate, self._latency)
            self.up_ = True
        except Exception:
            self.down()
            raise
        return self

    def down(self) -> None:
        for node in self.nodes:
            # every process still inside the node's namespace
            pids = subprocess.run(["ip", "netns", "pids", node.ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "link", "del", node.veth_host], capture_output=True)
            subprocess.run(["ip", "netns", "del", node.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.up_ = False

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def hosts(self) -> Dict[str, str]:
        return {n.name: n.addr for n in self.nodes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="run CMD on every node of a one-machine cluster "
                                "({node}, {node_rank}, {master} are replaced in CMD)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--rate-mbit", type=float, default=None)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    reason = why_unavailable()
    if reason:
        sys.exit(f"cluster: {reason}")
    with Cluster(a.nodes, a.rate_mbit, a.latency_ms) as c:
        procs = []
        for n in c.nodes:
            sub = [x.format(node=n.name, node_rank=n.index, master=c.nodes[0].addr) for x in cmd]
            procs.append(n.popen(sub))
        return max(abs(p.wait()) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
