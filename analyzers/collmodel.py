"""One cost model of collective communication, after NCCL's own tuner.

NCCL (``src/graph/tuning.cc``) times every call of every (algorithm,
protocol) as ``latency + bytes / bandwidth`` and runs the fastest. This
module does the same with the few terms a measurement can resolve, and is
what ``commprof model``, ``commprof predict``, ``commprof bench --model``
and ``commprof import nccl-tests --model`` use (op names and bus factors
come from :mod:`commprof.trace.ops`).

Topology: ``ranks`` in all, ``ppn`` ranks per node, ``nodes = ceil(ranks /
ppn)``. Terms (the model's parameters, all >= 0):

=============  ===============================================================
``base``       per-call latency (Ring / Simple; other algorithm-protocol pairs
               scale it by NCCL's ``baseLat`` ratios)
``intra_lat``  latency of one step between ranks of a node (Ring / Simple,
               NVLink; other pairs by NCCL's ``hwLat`` ratios)
``inter_lat``  latency of one step across nodes (Ring / Simple, network)
``intra_bw``   bus bandwidth inside one node (Ring / Simple)
``inter_bw``   bus bandwidth per rank across nodes (Ring / Simple)
=============  ===============================================================

Algorithms, as in ``tuning.cc`` (n ranks, m nodes, p ranks per node):

- **Ring** all_reduce: ``2(n - 1)`` steps, ``2(m - 1)`` of them across nodes;
  reduce_scatter / all_gather: ``n - 1`` steps, ``m - 1`` across; broadcast /
  reduce: a pipelined chain, one step's latency. Bytes:
  ``S x f(n) / busbw`` with the nccl-tests bus factor f.
- **Tree** (all_reduce only): latency ``base + 2 ((p - 1) intra + log2(m)
  inter)``; algorithm bandwidth half the tree's bus bandwidth, which is 0.92
  of the ring's, times NCCL's size-dependent tree correction; across
  exactly two nodes twice that (each byte crosses the network once per
  direction, where a ring's and a larger tree's cross it twice).
- **Protocols** LL / LL128 / Simple: NCCL's latency ratios and bandwidth
  factors (LL half of Simple's bus bandwidth on a ring, LL128 0.92; on a
  tree LL 1/3.8, LL128 7/9 in one node and 120/128 across nodes; a tree of
  one rank per node x 0.85). Small messages go LL, large ones Simple.
  An inter-node ring's intra-node steps cost at least NCCL's network
  overhead (1 us, 3 us for Simple; an x86 Intel host's value), and a Simple
  ring all_reduce across nodes has the ring plateau's 1.4x latency (sm80
  and newer) once each channel's share of a rank's data reaches 64 bytes
  (32 channels assumed). Left out: NCCL's absolute per-channel caps
  (llMaxBw, perChMax*: they depend on the GPU generation and the channel
  count), NVLS / CollNet.
- **gloo** runs a ring with one protocol (no tree): the same terms, no
  protocol switch.

Model *forms*: ``nccl`` (Ring and Tree, fastest per call), ``ring`` (Ring
only, the flat-ring form) and ``hockney`` (a latency that does not grow with
N plus ``S x f(n) / busbw``: the constant-busbw extrapolation); gloo has
``ring`` and ``hockney``.

Fitting (:func:`fit`): observations are sums of calls that took a measured
time (one nccl-tests row; a busy period of a training trace's buckets);
given each call's algorithm and protocol the time is linear in the terms
(latencies and inverse bandwidths), so the fit alternates "choose the
fastest (algorithm, protocol) per call" and a least-squares solve on
relative residuals. Latency terms carry NCCL's published constants as
priors (a Gaussian of 100 % width; gloo's, tens of microseconds, 1,000 %): where the data resolve a term it is
theirs, where they do not (one node measured: no network; no small sizes:
no latency) the prior remains — each term says which (``fitted`` or
``prior``), with its standard error. Bandwidths have no prior: a scope
that was not measured is taken from a described network or assumed equal
to the measured one, and said so.

Form selection (:func:`build`): each form is fitted leaving one measured N
out and scored on it; the form with the smallest held-out error predicts,
and every plausible form (held-out error within 1.5x the best's + 2
points) spans the prediction interval, widened by the terms' standard
errors and the fit's residual scatter.

Pure: numpy / pandas in, arrays and DataFrames out."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from ..trace.ops import OPS, bus_factor, canonical  # noqa: F401  (re-exported: the model's op names)

US = 1e-6
PROTOCOLS = ("LL", "LL128", "Simple")
#: the terms of one protocol (each protocol has its own, as in NCCL's tuner)
BLOCK = ("base", "intra_lat", "inter_lat", "intra_bw", "inter_bw")
#: the protocols' blocks in theta: Simple's first (its terms keep the plain names: the large-message link a
#: described network gives), then LL's and LL128's ("LL.base", "LL128.inter_bw", ...)
BLOCK_ORDER = ("Simple", "LL", "LL128")
NB = len(BLOCK)
NT = NB * len(BLOCK_ORDER)


def _name(protocol: str, term: str) -> str:
    return term if protocol == "Simple" else f"{protocol}.{term}"


TERMS = tuple(_name(p, t) for p in BLOCK_ORDER for t in BLOCK)
LATENCY_TERMS = BLOCK[:3]
OFFSET = {p: NB * i for i, p in enumerate(BLOCK_ORDER)}
#: per term of theta: is it a latency (seconds), and its protocol
IS_LAT = np.array([t in LATENCY_TERMS for _p in BLOCK_ORDER for t in BLOCK])
TERM_PROTOCOL = tuple(p for p in BLOCK_ORDER for _t in BLOCK)

# -- NCCL's constants (src/graph/tuning.cc), microseconds -------------------------------
#: baseLat[algorithm][protocol]
BASE_LAT = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
            "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}}
#: hwLat[NVLINK | NET][algorithm][protocol]
HW_LAT = {"intra": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
                    "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
          "inter": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
                    "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}}}
#: treeCorrectionFactor[protocol][log2(bytes / 64)] (sizes from 64 B to 256 MiB)
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .7, .7, .7, .7,
              .7, .7),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
#: a ring's bus bandwidth per protocol relative to Simple's (tuning.cc: LL x 0.5, LL128 x 0.92): the prior of
#: the LL and LL128 bandwidths, which the data replace where those protocols run
RING_PROTO_BW = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
#: a tree's bus bandwidth per protocol relative to Simple's (Tree/LL / 3.8; LL128 7/9 in a node, 120/128 across)
TREE_PROTO_BW: Dict[str, Any] = {"LL": 1 / 3.8, "LL128": (7 / 9, 120 / 128), "Simple": 1.0}
#: getNetOverhead (x86 Intel; AMD 2 us) per protocol, microseconds: Simple pays it three times
NET_OVERHEAD = {"LL": 1.0, "LL128": 1.0, "Simple": 3.0}
#: the ring plateau's latency factor (minCompCap >= 80; 1.9 before) and the channels its threshold assumes
RING_PLATEAU, RING_CHANNELS = 1.4, 32


def _prior_lat(backend: str) -> Dict[str, float]:
    """Prior means of the latency terms (seconds): NCCL's Ring constants per protocol; gloo over TCP: tens of
    microseconds per message (measured on loopback and veth links), one protocol."""
    if backend == "gloo":
        return {"base": 20 * US, "intra_lat": 25 * US, "inter_lat": 50 * US}
    out = {}
    for p in PROTOCOLS:
        out[_name(p, "base")] = BASE_LAT["ring"][p] * US
        out[_name(p, "intra_lat")] = HW_LAT["intra"]["ring"][p] * US
        out[_name(p, "inter_lat")] = HW_LAT["inter"]["ring"][p] * US
    return out


PRIORS = {"nccl": _prior_lat("nccl"), "gloo": _prior_lat("gloo")}
#: relative standard deviation of a latency prior: NCCL's constants are known to a factor of ~2; gloo's
#: latency over TCP depends on the host (tens of microseconds to milliseconds on an oversubscribed one)
PRIOR_WIDTH = {"nccl": 1.0, "gloo": 10.0}
#: LL's and LL128's latency priors, this many times wider than Simple's (their means follow Simple's fitted
#: latencies half way, :func:`_lat_prior`): chosen, with BW_PRIOR_WIDTH, from a handful of settings by the three
#: real sets' in-sample and held-out errors together (benchmarks/collmodel_logs.py), not on one set alone
OTHER_LAT_WIDTH = 3.0
#: relative standard deviation of the LL / LL128 bandwidth priors (NCCL's ratios to Simple): wide, the channel
#: count NCCL runs for a mid-size call (enqueue.cc) makes the bandwidth a call sees a fraction of the link's
BW_PRIOR_WIDTH = 3.0
#: starting points of the fit: LL's and LL128's bandwidth as fractions of Simple's (a protocol the first guess
#: never chooses could not enter the fit from one start alone)
STARTS = ((0.5, 0.92), (0.1, 0.5), (0.03, 0.2), (0.01, 0.1))

#: Huber's tuning constant (95 % efficiency on normal residuals), in units of the residuals' robust spread
HUBER_K = 1.345

FORMS = {"nccl": ("nccl", "ring", "hockney"), "gloo": ("ring", "hockney")}
DEFAULT_FORM = {"nccl": "nccl", "gloo": "ring"}


def backend_of(name: Optional[str]) -> str:
    """``nccl`` (also nccl-tests, unknown GPU backends) or ``gloo``."""
    n = str(name or "").lower()
    return "gloo" if n in ("gloo", "mpi", "cpu", "gloo-cpu") else "nccl"


def _log2i(x):
    return np.floor(np.log2(np.maximum(x, 1))).astype(np.float64)


# -- the design: per call and per (algorithm, protocol), the coefficients of the terms ---------------------
@dataclass(frozen=True)
class Choice:
    algorithm: str
    protocol: str

    def __str__(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def choices(form: str, backend: str) -> List[Choice]:
    protos = PROTOCOLS if backend == "nccl" else ("Simple",)
    algos = ("ring", "tree") if form == "nccl" else ("ring",) if form == "ring" else ("flat",)
    return [Choice(a, p) for a in algos for p in protos]


def design(op: Sequence[str], nbytes, ranks, ppn, form: str, backend: str) -> Tuple[np.ndarray, List[Choice]]:
    """Coefficients of the terms (latencies in seconds, bandwidths as
    seconds per byte) per call and choice: array (calls, choices, NT) with
    time = coef . theta, each choice in its protocol's block of theta
    ([base, intra_lat, inter_lat, 1/intra_bw, 1/inter_bw] per protocol).
    A choice that cannot run a call (a tree for a broadcast) has infinite
    coefficients."""
    ops = np.asarray([canonical(o) for o in op], dtype=object)
    s = np.asarray(nbytes, np.float64)
    n = np.asarray(ranks, np.float64)
    p = np.minimum(np.asarray(ppn, np.float64), n)
    m = np.ceil(n / np.maximum(p, 1))
    multi = m > 1
    is_ar = ops == "all_reduce"
    is_rs_ag = np.isin(ops, ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"))
    f = np.ones_like(n)
    for o in np.unique(ops):
        sel = ops == o
        fo = bus_factor(o, n[sel])
        f[sel] = np.where(np.isfinite(fo), fo, 1.0)   # ops without a bus factor: moved once
    # ring steps and the number of them that cross nodes
    steps = np.where(is_ar, 2 * (n - 1), n - 1)
    inter_steps = np.where(multi, np.where(is_ar, 2 * (m - 1), m - 1), 0.0)
    intra_steps = np.maximum(steps - inter_steps, 0)
    # broadcast / reduce: NCCL's pipelined chain costs one hop's latency (tuning.cc, sameChannels)
    chain = ~is_ar & ~is_rs_ag
    inter_steps = np.where(chain, multi.astype(float), inter_steps)
    intra_steps = np.where(chain, (~multi).astype(float), intra_steps)
    cs = choices(form, backend)
    out = np.zeros((len(s), len(cs), NT))
    logsize = np.clip(_log2i(np.maximum(s, 1) / 64), 0, None).astype(int)
    for k, c in enumerate(cs):
        a = "ring" if c.algorithm == "flat" else c.algorithm
        o = OFFSET[c.protocol]
        nccl = backend == "nccl"
        # the tree's latencies relative to the ring's of the same protocol (NCCL's constants)
        rb = BASE_LAT[a][c.protocol] / BASE_LAT["ring"][c.protocol] if nccl else 1.0
        ri = HW_LAT["intra"][a][c.protocol] / HW_LAT["intra"]["ring"][c.protocol] if nccl else 1.0
        rn = HW_LAT["inter"][a][c.protocol] / HW_LAT["inter"]["ring"][c.protocol] if nccl else 1.0
        if c.algorithm == "flat":        # hockney: latency constant in N, bytes at the bus bandwidth
            lat = np.stack([np.ones_like(n), np.zeros_like(n), np.zeros_like(n)], axis=1)
            byt = s * f
        elif c.algorithm == "ring":
            ri_c: Any = 1.0
            if nccl:
                # an inter-node ring's intra-node steps cost at least the network's per-step overhead
                # (tuning.cc: intraLat = max(intraLat, netOverhead), 1 us, x3 for Simple)
                ri_c = np.where(multi, max(1.0, NET_OVERHEAD[c.protocol] / HW_LAT["intra"]["ring"][c.protocol]), 1.0)
            lat = np.stack([np.ones_like(n), intra_steps * ri_c, inter_steps], axis=1)
            if nccl and c.protocol == "Simple":
                # the ring's plateau (tuning.cc): Simple all_reduce across nodes, once each channel's
                # share of each rank's data reaches 64 bytes, has 1.4x its latency (sm80 and newer)
                plateau = multi & is_ar & (s / (RING_CHANNELS * n) >= 64)
                lat = lat * np.where(plateau, RING_PLATEAU, 1.0)[:, None]
            byt = s * f
        else:                             # tree: all_reduce only
            lat = np.stack([np.full_like(n, rb), 2 * (p - 1) * ri, 2 * _log2i(m) * rn], axis=1)
            corr = np.array(TREE_CORRECTION[c.protocol])[np.minimum(logsize, 22)]
            corr = np.where(logsize < 23, corr, 1.0)
            # across exactly two nodes a double binary tree sends each byte over the network once per
            # direction (a ring twice, and so does a tree of more nodes, whose inner nodes have two children)
            two = np.where(m == 2, 2.0, 1.0)
            tp = TREE_PROTO_BW[c.protocol]
            tree_bw = np.where(multi, tp[1], tp[0]) if isinstance(tp, tuple) else np.full(np.shape(n), float(tp))
            rel = np.asarray(tree_bw, np.float64) / RING_PROTO_BW[c.protocol]
            byt = s * 2.0 / (0.92 * rel * corr * two * _tree_pattern(p))
            lat[~is_ar] = np.inf
            byt = np.where(is_ar, byt, np.inf)
        out[:, k, o:o + 3] = lat
        out[:, k, o + 3] = np.where(multi, 0.0, byt)
        out[:, k, o + 4] = np.where(multi, byt, 0.0)
        out[n <= 1, k, :] = 0.0          # one rank: nothing to communicate
    return out, cs


def _tree_pattern(p):
    """One rank per node: a plain tree, not NCCL's split tree (tuning.cc: x 0.85)."""
    return np.where(np.asarray(p) <= 1, 0.85, 1.0)


# -- measurements -------------------------------------------------------------------------------
@dataclass
class Measurements:
    """Observations for the fit: each one a set of calls (op, bytes, ranks,
    ranks per node) that took ``time_s`` together."""
    op: List[str] = field(default_factory=list)
    nbytes: List[float] = field(default_factory=list)
    ranks: List[int] = field(default_factory=list)
    ppn: List[int] = field(default_factory=list)
    obs: List[int] = field(default_factory=list)      # per call: its observation
    time_s: List[float] = field(default_factory=list)  # per observation
    obs_ranks: List[int] = field(default_factory=list)
    obs_ppn: List[int] = field(default_factory=list)
    source: List[str] = field(default_factory=list)
    #: per call: the algorithm the library was told to use (NCCL_ALGO=Ring), "" where it chose
    forced: List[str] = field(default_factory=list)

    def add(self, calls: Iterable[Tuple[str, float]], ranks: int, ppn: int, time_s: float, source: str = "",
            forced: str = "") -> None:
        k = len(self.time_s)
        added = 0
        for op, nb in calls:
            self.op.append(canonical(op))
            self.nbytes.append(float(nb))
            self.ranks.append(int(ranks))
            self.ppn.append(int(max(1, min(ppn, ranks))))
            self.obs.append(k)
            self.forced.append(str(forced or "").lower())
            added += 1
        if not added:
            return
        self.time_s.append(float(time_s))
        self.obs_ranks.append(int(ranks))
        self.obs_ppn.append(int(max(1, min(ppn, ranks))))
        self.source.append(source)

    def extend(self, other: "Measurements") -> None:
        calls: Dict[int, List[int]] = {}
        for j, o in enumerate(other.obs):
            calls.setdefault(o, []).append(j)
        for i in range(len(other.time_s)):
            sel = calls.get(i, [])
            self.add([(other.op[j], other.nbytes[j]) for j in sel], other.obs_ranks[i], other.obs_ppn[i],
                     other.time_s[i], other.source[i], other.forced[sel[0]] if sel else "")

    def __len__(self) -> int:
        return len(self.time_s)

    def subset(self, keep: np.ndarray) -> "Measurements":
        """The observations where ``keep`` (bool per observation) is true."""
        out = Measurements()
        calls: Dict[int, List[Tuple[str, float]]] = {}
        forced: Dict[int, str] = {}
        for j, o in enumerate(self.obs):
            calls.setdefault(o, []).append((self.op[j], self.nbytes[j]))
            forced[o] = self.forced[j]
        for i in np.flatnonzero(keep):
            out.add(calls.get(int(i), []), self.obs_ranks[i], self.obs_ppn[i], self.time_s[i], self.source[i],
                    forced.get(int(i), ""))
        return out

    @property
    def nodes(self) -> np.ndarray:
        r, p = np.asarray(self.obs_ranks, float), np.asarray(self.obs_ppn, float)
        return np.ceil(r / np.maximum(p, 1))

    def usable(self) -> "Measurements":
        ok = (np.asarray(self.time_s) > 0) & (np.asarray(self.obs_ranks) > 1)
        return self.subset(ok)


# -- one fitted form ------------------------------------------------------------------------------
@dataclass
class Fit:
    """The terms of one model form (seconds, bytes per second)."""
    form: str
    backend: str
    theta: np.ndarray                 # per protocol block: [base, intra_lat, inter_lat, 1/intra_bw, 1/inter_bw]
    cov: np.ndarray                   # covariance of theta
    scatter: float                    # relative residual standard deviation of the observations
    status: Dict[str, str]            # term -> fitted | prior | described | assumed (= ...) | unused
    points: int = 0
    ranks: Tuple[int, ...] = ()
    nodes: Tuple[int, ...] = ()
    #: the starting point (LL's and LL128's bandwidth fractions of Simple's) the fit kept
    start: Tuple[float, float] = STARTS[0]

    def coef(self, op, nbytes, ranks, ppn) -> Tuple[np.ndarray, List[int], List[Choice]]:
        d, cs = design(op, nbytes, ranks, ppn, self.form, self.backend)
        with np.errstate(invalid="ignore"):
            t = d @ self.theta
        k = np.argmin(np.where(np.isfinite(t), t, np.inf), axis=1)
        return d[np.arange(len(k)), k], list(k), cs

    def times(self, op, nbytes, ranks, ppn) -> Tuple[np.ndarray, List[Choice], np.ndarray]:
        """Predicted time (s), the choice, and its standard error (s) per call."""
        row, ks, cs = self.coef(op, nbytes, ranks, ppn)
        t = row @ self.theta
        se = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", row, self.cov, row), 0.0))
        return t, [cs[k] for k in ks], se

    def term_values(self) -> Dict[str, float]:
        inv = lambda x: 1.0 / x if x > 0 else float("inf")  # noqa: E731
        return {name: (float(v) if IS_LAT[j] else inv(v)) for j, (name, v) in enumerate(zip(TERMS, self.theta))}

    def term_errors(self) -> Dict[str, float]:
        se = np.sqrt(np.maximum(np.diag(self.cov), 0.0))
        th = self.theta
        # a bandwidth's standard error from its inverse's (delta method)
        return {name: (float(se[j]) if IS_LAT[j] else (float(se[j] / th[j] ** 2) if th[j] > 0 else float("nan")))
                for j, name in enumerate(TERMS)}

    def switch_points(self, op: str, ranks: int, ppn: int, lo: int = 8, hi: int = 1 << 30) -> List[Tuple[int, str]]:
        """(first size, algorithm/protocol) wherever the choice changes, sizes a factor of 2 apart."""
        sizes = [1 << k for k in range(int(math.log2(max(lo, 1))), int(math.log2(hi)) + 1)]
        _t, cs, _se = self.times([op] * len(sizes), sizes, [ranks] * len(sizes), [ppn] * len(sizes))
        out: List[Tuple[int, str]] = []
        for s, c in zip(sizes, cs):
            if not out or out[-1][1] != str(c):
                out.append((s, str(c)))
        return out


@dataclass
class Fixed:
    """Terms given from outside (``--network``) or carried over: seconds and bytes/s."""
    values: Dict[str, float] = field(default_factory=dict)
    source: str = "described"


def _forced(text: str) -> Tuple[str, str]:
    """(algorithm, protocol) a call was told to use ("" where the library chose): NCCL_ALGO / NCCL_PROTO."""
    algo = proto = ""
    for part in re.split(r"[,/ ]+", str(text or "").lower()):
        if part in ("ring", "tree"):
            algo = part
        elif part in ("ll", "ll128", "simple"):
            proto = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}[part]
    return algo, proto


def _observation_matrix(ms: Measurements, form: str, backend: str):
    d, cs = design(ms.op, ms.nbytes, ms.ranks, ms.ppn, form, backend)
    forced = [_forced(x) for x in ms.forced]
    algos = np.asarray([a for a, _p in forced], dtype=object)
    protos = np.asarray([p for _a, p in forced], dtype=object)
    names = {x.algorithm for x in cs}
    pnames = {x.protocol for x in cs}
    for k, c in enumerate(cs):
        # a call run with a forced algorithm / protocol is timed only by it (where the form has it)
        other = ((algos != "") & (algos != c.algorithm) & np.isin(algos, list(names))) | \
            ((protos != "") & (protos != c.protocol) & np.isin(protos, list(pnames)))
        d[other, k, :] = np.inf
    return d, cs, np.asarray(ms.obs, int), np.asarray(ms.time_s, np.float64)


def _reparam(backend: str) -> np.ndarray:
    """T with theta = T @ p: the fit's parameters p keep the protocols in
    NCCL's order of bandwidth (1 / bw: Simple <= LL128 <= LL, the same
    scope), all p >= 0: LL128's inverse bandwidth is Simple's plus a
    non-negative increment, LL's LL128's plus another. Without it the
    protocols' blocks could trade places (a "Simple" fitted to the small
    calls)."""
    t = np.eye(NT)
    if backend != "nccl":
        return t
    for q in (3, 4):
        s_, l128, ll = OFFSET["Simple"] + q, OFFSET["LL128"] + q, OFFSET["LL"] + q
        t[l128, s_] = 1.0
        t[ll, s_] = t[ll, l128] = 1.0
    return t


def _to_param(d: np.ndarray, tr: np.ndarray) -> np.ndarray:
    """The design in the fit's parameters (a choice that cannot run a call stays infinite)."""
    bad = ~np.isfinite(d).all(axis=2)
    out = np.where(np.isfinite(d), d, 0.0) @ tr
    out[bad] = np.inf
    return out


def fit(ms: Measurements, form: str, backend: str, fixed: Optional[Fixed] = None, iterations: int = 40,
        starts: Optional[Sequence[Tuple[float, float]]] = None) -> Fit:
    """Least squares on relative residuals (8 B and 1 GiB weigh alike)
    with the priors, the choice of (algorithm, protocol) per call
    re-made until it is stable, from several starting points."""
    ms = ms.usable()
    if not len(ms):
        raise ValueError("no collective with a positive time on >= 2 ranks to fit the cost model to")
    fixed = fixed or Fixed()
    prior = dict(PRIORS[backend])
    d, cs, obs, t = _observation_matrix(ms, form, backend)
    finite = np.where(np.isfinite(d), d, 0.0)
    active = (finite != 0).any(axis=(0, 1))           # terms some choice of some call uses
    tr = _reparam(backend)
    dp = _to_param(d, tr)
    best = None
    for start in (starts or (STARTS if backend == "nccl" else STARTS[:1])):
        values, free, status = _start(ms, d, obs, t, form, fixed, prior, active, start)
        res = _iterate(dp, obs, t, np.linalg.solve(tr, values), free, prior, backend, iterations)
        if best is None or res[3] < best[3][3] - 1e-12:
            best = (values, free, status, res, start)
    assert best is not None
    _values, free, status, (theta, cov, s, _obj), won = best
    theta, cov = theta.copy(), cov.copy()
    for proto in BLOCK_ORDER:                  # an assumed scope follows the fitted one (in the parameters)
        o = OFFSET[proto]
        for j in (o + 3, o + 4):
            if str(status.get(TERMS[j], "")).startswith("assumed"):
                other = o + 3 if j == o + 4 else o + 4
                theta[j] = theta[other]
                cov[j, :], cov[:, j] = cov[other, :], cov[:, other]
                cov[j, j] = cov[other, other]
    theta, cov = tr @ theta, tr @ cov @ tr.T
    seen_inter = bool((finite[:, :, [OFFSET[p] + 4 for p in BLOCK_ORDER]] > 0).any())
    if backend == "gloo" and not seen_inter and free[2] and form != "hockney":
        # gloo measured inside one host: across hosts, the same TCP step latency (no better guess)
        theta[2] = theta[1]
        cov[2, :], cov[:, 2] = cov[1, :], cov[:, 1]
        cov[2, 2] = cov[1, 1]
        status["inter_lat"] = "assumed (= intra_lat)"
    # which protocols the fitted model runs for the measured calls: the others' bandwidths are their priors
    with np.errstate(invalid="ignore"):
        tt = d @ theta
    chosen = {cs[k].protocol for k in np.argmin(np.where(np.isfinite(tt), tt, np.inf), axis=1)}
    for j, name in enumerate(TERMS):
        if name in status:
            continue
        if not active[j]:
            status[name] = "unused"
        elif IS_LAT[j]:
            prior_sd = prior[name] * PRIOR_WIDTH[backend]
            status[name] = "fitted" if math.sqrt(max(cov[j, j], 0)) < 0.5 * prior_sd else "prior"
        elif TERM_PROTOCOL[j] != "Simple" and TERM_PROTOCOL[j] not in chosen:
            status[name] = "prior (NCCL's ratio to Simple)"
        else:
            status[name] = "fitted"
    return Fit(form=form, backend=backend, theta=theta, cov=cov, scatter=s, status=status, points=len(t),
               ranks=tuple(sorted(set(ms.obs_ranks))), nodes=tuple(sorted({int(x) for x in ms.nodes})), start=won)


def _start(ms: Measurements, d, obs, t, form: str, fixed: Fixed, prior: Dict[str, float], active, start):
    """(starting values, which terms are free, status of the others): fixed
    terms as given, no per-step latency for Hockney's form, Simple's
    bandwidths from the largest calls of each scope seen (a scope nobody
    measured takes the other's, said so), LL's and LL128's at ``start``'s
    fractions of them, latencies at their priors."""
    status: Dict[str, str] = {}
    values = np.zeros(NT)
    free = active.copy()
    for j, name in enumerate(TERMS):
        if name in fixed.values:
            v = fixed.values[name]
            values[j] = v if IS_LAT[j] else (1.0 / v if v > 0 else 0.0)
            free[j] = False
            status[name] = fixed.source
    for j, name in enumerate(TERMS):
        if not active[j] and name not in status:
            free[j] = False
    if form == "hockney":                     # no per-step latency in this form
        for proto in BLOCK_ORDER:
            for j in (OFFSET[proto] + 1, OFFSET[proto] + 2):
                if free[j] or not active[j]:
                    free[j], values[j] = False, 0.0
                    status[TERMS[j]] = "unused"
    sizes = np.asarray(ms.nbytes)
    fin = np.where(np.isfinite(d), d, 0.0)
    o = OFFSET["Simple"]
    for j in (o + 3, o + 4):                   # Simple: the largest calls' bus bandwidth in each scope
        if not free[j]:
            continue
        k = int(np.argmax((fin[:, :, j] > 0).sum(axis=0)))
        call_sel = fin[:, k, j] > 0
        big = call_sel & (sizes >= np.percentile(sizes[call_sel], 75))
        values[j] = float(np.median(t[obs[big]] / fin[big, k, j]))      # 1 / bus bandwidth
    for j in (o + 3, o + 4):                   # a scope nobody measured: the other one's, said so
        if values[j] == 0 and TERMS[j] not in status:
            other = o + 3 if j == o + 4 else o + 4
            status[TERMS[j]] = f"assumed (= {TERMS[other]})" if values[other] else "unused"
            values[j] = values[other]
            free[j] = False
    for proto, frac in zip(("LL", "LL128"), start):
        for q in (3, 4):
            j, js = OFFSET[proto] + q, o + q
            if TERMS[j] in status:
                continue
            values[j] = values[js] / frac
            if not active[j]:
                other = OFFSET[proto] + 7 - q
                status[TERMS[j]] = f"assumed (= {TERMS[other]})" if active[other] else "unused"
    for j, name in enumerate(TERMS):
        if IS_LAT[j] and name not in status and name in prior:
            values[j] = prior[name]      # a latency the data do not reach (across nodes, measured in one): its prior
            if not active[j]:
                status[name] = "prior"
    return values, free, status


def _iterate(d, obs, t, values, free, prior, backend: str, iterations: int):
    """(theta, covariance, scatter, objective) of the best objective: each
    round picks every call's cheapest (algorithm, protocol) under the
    current terms, solves (relative residuals), and re-weights (Huber, on
    log residuals) until stable; the objective that ranks the rounds (and
    the fit's starting points) is Huber's loss of the log residuals."""
    n_obs = len(t)
    scale = np.where(values > 0, values, 1e-6)
    best = None
    s = 0.05
    theta = values.copy()
    w = np.ones(n_obs)
    huber = None
    for _ in range(iterations):
        with np.errstate(invalid="ignore"):
            tt = d @ theta
        k = np.argmin(np.where(np.isfinite(tt), tt, np.inf), axis=1)
        row = d[np.arange(len(k)), k]
        a = np.zeros((n_obs, NT))
        np.add.at(a, obs, row)
        theta_new, cov, s_new = _solve(a, t, theta, free, scale, prior, s, PRIOR_WIDTH[backend], w)
        r = np.abs(np.log(np.maximum(a @ theta_new, 1e-15) / t))
        if huber is None:
            # Huber's threshold from the first solve's residuals (a median absolute deviation: a minority of
            # observations far off cannot set it)
            huber = HUBER_K * max(1.4826 * float(np.median(np.abs(r - np.median(r)))), 0.01)
        obj = _objective(d, obs, t, theta_new, free, scale, prior, s_new, PRIOR_WIDTH[backend], huber)
        if best is None or obj < best[3] - 1e-12:
            best = (theta_new, cov, s_new, obj)
        w_new = np.minimum(1.0, huber / np.maximum(r, 1e-12))
        if np.allclose(theta_new, theta, rtol=1e-6, atol=0) and abs(s_new - s) < 1e-4 and np.allclose(w_new, w):
            break
        theta, s, w = theta_new, s_new, w_new
    assert best is not None
    return best


#: the increments of the inverse bandwidths (the fit's parameters, :func:`_reparam`) at NCCL's ratios, per unit
#: of Simple's: LL128 1/0.92 - 1, LL 1/0.5 - 1/0.92
_BW_STEP = {"LL128": 1 / RING_PROTO_BW["LL128"] - 1, "LL": 1 / RING_PROTO_BW["LL"] - 1 / RING_PROTO_BW["LL128"]}


def _bw_prior_rows(theta, free, idx):
    """(index into idx, term, target) of LL's and LL128's bandwidth priors
    in the fit's parameters: NCCL's ratios to Simple's of the same scope."""
    out = []
    for q, j in enumerate(idx):
        proto = TERM_PROTOCOL[j]
        if IS_LAT[j] or proto == "Simple":
            continue
        js = OFFSET["Simple"] + (j - OFFSET[proto])
        if theta[js] > 0:
            out.append((q, j, theta[js] * _BW_STEP[proto]))
    return out


def _lat_prior(theta, prior: Dict[str, float], j: int) -> float:
    """The prior mean of latency term j: NCCL's constant for Simple's; for
    LL's and LL128's, the geometric mean of NCCL's constant and NCCL's
    ratio to Simple's times Simple's current value (a network slower than
    NCCL's constants is slower for every protocol, unless the data say
    otherwise)."""
    name = TERMS[j]
    proto = TERM_PROTOCOL[j]
    if proto == "Simple":
        return prior[name]
    js = OFFSET["Simple"] + (j - OFFSET[proto])
    ref = prior.get(TERMS[js])
    if not ref or theta[js] <= 0:
        return prior[name]
    rel = max(prior[name] / ref * float(theta[js]), 1e-9)
    return math.sqrt(rel * prior[name])


def _lat_width(j: int, width: float) -> float:
    """Relative width of latency term j's prior: LL's and LL128's are OTHER_LAT_WIDTH times wider."""
    return width if TERM_PROTOCOL[j] == "Simple" else width * OTHER_LAT_WIDTH


def _solve(a, t, theta, free, scale, prior, s, width, wt=None):
    """Weighted least squares for the free terms on relative residuals
    (times the robust weights ``wt``), with the priors, kept >= 0 by fixing
    negative terms at zero."""
    free = free.copy()
    wt = np.ones_like(t) if wt is None else wt
    sw = np.sqrt(wt)
    idx = np.flatnonzero(free)
    u = np.zeros(0)
    m = np.zeros((0, 0))
    for _ in range(8):
        idx = np.flatnonzero(free)
        if not len(idx):
            break
        x = a[:, idx] * scale[idx] / t[:, None] * sw[:, None]
        fixed_part = (a[:, ~free] @ theta[~free]) / t if (~free).any() else 0.0
        y = (1.0 - fixed_part) * sw
        rows, rhs = [x], [y]
        for q, j in enumerate(idx):
            if IS_LAT[j]:                               # prior: theta_j ~ N(mu, (mu * width)^2)
                mu = _lat_prior(theta, prior, j)
                wq = s / (mu * _lat_width(j, width))
                r = np.zeros(len(idx))
                r[q] = wq * scale[j]
                rows.append(r[None, :])
                rhs.append(np.array([wq * mu]))
        for q, _j, mu in _bw_prior_rows(theta, free, idx):
            wq = s / (mu * BW_PRIOR_WIDTH)
            r = np.zeros(len(idx))
            r[q] = wq * scale[idx[q]]
            rows.append(r[None, :])
            rhs.append(np.array([wq * mu]))
        m = np.vstack(rows)
        v = np.concatenate(rhs)
        u, *_ = np.linalg.lstsq(m, v, rcond=None)
        if (u >= 0).all():
            break
        neg = idx[u < 0]
        free[neg] = False
        theta = theta.copy()
        theta[neg] = 0.0
    out = theta.copy()
    if len(idx):
        out[idx] = u * scale[idx]
    resid = np.log(np.maximum(a @ out, 1e-15) / t)
    dof = max(float(wt.sum()) - len(idx), 1.0)
    s_new = max(float(np.sqrt((wt * resid ** 2).sum() / dof)), 0.01)
    cov = np.zeros((NT, NT))
    if len(idx):
        try:
            inv = np.linalg.inv(m.T @ m)
            cu = inv * s_new ** 2
            cov[np.ix_(idx, idx)] = cu * np.outer(scale[idx], scale[idx])
        except np.linalg.LinAlgError:
            cov[np.ix_(idx, idx)] = np.inf
    return out, cov, s_new


def _objective(d, obs, t, theta, free, scale, prior, s, width, huber: float = np.inf) -> float:
    with np.errstate(invalid="ignore"):
        tt = d @ theta
    row_t = np.min(np.where(np.isfinite(tt), tt, np.inf), axis=1)
    pred = np.zeros(len(t))
    np.add.at(pred, obs, row_t)
    r = np.abs(np.log(np.maximum(pred, 1e-15) / t))      # symmetric: 2x over and 2x under weigh alike
    obj = float(np.where(r <= huber, r ** 2, 2 * huber * r - huber ** 2).sum())    # Huber's loss
    for j in (int(x) for x in np.flatnonzero(free)):
        if IS_LAT[j]:
            mu = _lat_prior(theta, prior, j)
            obj += float(((theta[j] - mu) / (mu * _lat_width(j, width))) ** 2) * s ** 2
    for _q, j, mu in _bw_prior_rows(theta, free, np.flatnonzero(free)):
        obj += float(((theta[j] - mu) / (mu * BW_PRIOR_WIDTH)) ** 2) * s ** 2
    return obj


def predict_calls(f: Fit, ms: Measurements) -> Tuple[np.ndarray, List[Choice]]:
    """Predicted time and choice of each call, a forced algorithm kept."""
    d, cs, _obs, _t = _observation_matrix(ms, f.form, f.backend)
    with np.errstate(invalid="ignore"):
        tt = d @ f.theta
    tt = np.where(np.isfinite(tt), tt, np.inf)
    k = np.argmin(tt, axis=1)
    return tt[np.arange(len(k)), k], [cs[i] for i in k]


def predict_obs(f: Fit, ms: Measurements) -> np.ndarray:
    """Predicted time of each observation (sum over its calls)."""
    t, _c = predict_calls(f, ms)
    out = np.zeros(len(ms.time_s))
    np.add.at(out, np.asarray(ms.obs, int), t)
    return out


# -- the model: forms, selection by held-out N, intervals -----------------------------------------
VALIDATION_COLUMNS = ["form", "held_out_ranks", "fitted_on", "points", "median_abs_err_pct", "max_abs_err_pct"]


@dataclass
class CostModel:
    """The fitted forms of one backend, the form that predicts and the
    plausible ones that span the interval."""
    backend: str
    fits: Dict[str, Fit]
    best: str
    plausible: List[str]
    validation: pd.DataFrame
    ppn: int = 1                      # ranks per node as measured (the default for predictions)
    source: str = "fitted"
    #: what-ifs: bandwidth and latency scales
    bw_scale: float = 1.0
    lat_scale: float = 1.0
    #: ranks per node of the predictions (None: as measured)
    gpus_per_node: Optional[int] = None
    #: "point" (the best form), "lo" / "hi" (the interval's ends)
    bound: str = "point"
    note: str = ""
    #: the naive answers from the same measurements, and the held-out comparison with them (:func:`compare`)
    baselines: Optional["Baselines"] = None
    comparison: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COMPARISON_COLUMNS))
    _worse: Optional[Dict[Tuple[str, str], List[str]]] = field(default=None, repr=False, compare=False)

    def worse_than(self, op: str, nbytes: float, n: int, ppn: Optional[int] = None) -> List[str]:
        """The baselines that did better than the model, held out, in this call's scope and size band."""
        c = self.comparison
        if c is None or not len(c):
            return []
        if self._worse is None:               # once: (scope, band) -> the baselines that beat the model there
            worse: Dict[Tuple[str, str], List[str]] = {}
            for _i, r in c.iterrows():
                cur = worse.setdefault((str(r["scope"]), str(r["band"])), [])
                for k in BASELINES:
                    if np.isfinite(r[f"{k}_median_pct"]) and r[f"{k}_median_pct"] < r["model_median_pct"] \
                            and k not in cur:
                        cur.append(k)
            self._worse = worse
        p = int(ppn or self._ppn(n))
        scope = "across nodes" if n > p else "one node"
        return list(self._worse.get((scope, band_of(nbytes)), []))

    # the replay's interface ------------------------------------------------------------
    def _ppn(self, n: int) -> int:
        return int(self.gpus_per_node or self.ppn or 1)

    def estimate(self, op: str, nbytes: float, n: int, ppn: Optional[int] = None,
                 with_baselines: bool = True) -> Dict[str, Any]:
        """Point, interval and the choice of one call (seconds); beside them
        the naive answers (``constant_busbw_s``, ``log2_nodes_s``). Where a
        naive answer did better than the model held out (this scope and size
        band), the interval covers it and ``worse_than`` names it."""
        if n <= 1:
            return {"time_s": 0.0, "lo_s": 0.0, "hi_s": 0.0, "algorithm": "-", "form": self.best,
                    "constant_busbw_s": 0.0, "log2_nodes_s": 0.0, "worse_than": []}
        p = int(ppn or self._ppn(n))
        vals = {}
        for name, f in self.fits.items():
            t, c, se = f.times([op], [nbytes], [n], [p])
            lat = _scaled(f, [op], [nbytes], [n], [p], self.bw_scale, self.lat_scale)
            vals[name] = (float(lat[0]), str(c[0]), float(se[0]) * float(lat[0]) / max(float(t[0]), 1e-30),
                          f.scatter)
        t_best, choice, _se, _s = vals[self.best]
        lo = min(v[0] - 1.96 * math.hypot(v[2], v[3] * v[0]) for k, v in vals.items() if k in self.plausible)
        hi = max(v[0] + 1.96 * math.hypot(v[2], v[3] * v[0]) for k, v in vals.items() if k in self.plausible)
        out: Dict[str, Any] = {"time_s": t_best, "lo_s": max(min(lo, t_best), 0.0), "hi_s": max(hi, t_best),
                               "algorithm": choice, "form": self.best}
        if not with_baselines:
            return out
        b = self.baselines.times(op, nbytes, n, p) if self.baselines is not None else \
            {k: float("nan") for k in BASELINES}
        worse = self.worse_than(op, nbytes, n, p)
        for k in worse:
            v = b[k]
            if np.isfinite(v):
                out["lo_s"], out["hi_s"] = min(out["lo_s"], v), max(out["hi_s"], v)
        out.update({f"{k}_s": v for k, v in b.items()})
        out["worse_than"] = worse
        return out

    def time(self, op: str, nbytes: float, n: int) -> float:
        e = self.estimate(op, nbytes, n)
        return float(e["time_s"] if self.bound == "point" else e["lo_s"] if self.bound == "lo" else e["hi_s"])

    def at(self, bound: str) -> "CostModel":
        return replace(self, bound=bound)

    def algorithm(self, op: str, nbytes: float, n: int) -> str:
        return str(self.estimate(op, nbytes, n)["algorithm"])

    # description ---------------------------------------------------------------------------
    @property
    def points(self) -> int:
        return self.fits[self.best].points

    @property
    def rel_err(self) -> float:
        return self.fits[self.best].scatter

    def describe(self) -> str:
        f = self.fits[self.best]
        v, st = f.term_values(), f.status
        bits = [f"{self.backend} {self.best} form"]
        for name in TERMS:
            if st.get(name) == "unused":
                continue
            x = v[name]
            val = f"{x / 1e9:.4g} GB/s" if name.endswith("bw") else f"{x * 1e6:.3g} us"
            bits.append(f"{name} {val} ({st.get(name, '')})")
        others = [p for p in self.plausible if p != self.best]
        tail = f"; interval spans {', '.join(others)}" if others else ""
        return f"{self.source}: " + ", ".join(bits) + tail

    def terms_table(self) -> pd.DataFrame:
        rows = []
        for name, f in self.fits.items():
            v, e = f.term_values(), f.term_errors()
            for term in TERMS:
                if f.status.get(term) == "unused":
                    continue
                bw = term.endswith("bw")
                conv = 1e-9 if bw else 1e6
                prior = PRIORS[self.backend].get(term)
                rows.append({"form": name + (" *" if name == self.best else ""), "term": term,
                             "value": v[term] * conv, "unit": "GB/s" if bw else "us",
                             "std_err": e[term] * conv if np.isfinite(e[term]) else float("nan"),
                             "status": f.status.get(term, ""),
                             "prior": prior * 1e6 if prior is not None and not bw else float("nan"),
                             "points": f.points})
        return pd.DataFrame(rows, columns=["form", "term", "value", "unit", "std_err", "status", "prior", "points"])


def _scaled(f: Fit, op, nbytes, ranks, ppn, bw_scale: float, lat_scale: float) -> np.ndarray:
    row, _k, _cs = f.coef(op, nbytes, ranks, ppn)
    th = f.theta.copy()
    th[IS_LAT] *= lat_scale
    th[~IS_LAT] /= bw_scale
    return row @ th


def build(ms: Measurements, backend: str = "nccl", fixed: Optional[Fixed] = None,
          forms: Optional[Sequence[str]] = None, source: str = "fitted", compare_baselines: bool = True) -> CostModel:
    """Fit every form of ``backend``, choose by leave-one-N-out validation;
    beside it the naive answers and (``compare_baselines``) the held-out
    comparison with them."""
    backend = backend_of(backend)
    ms = ms.usable()
    if not len(ms):
        raise ValueError("no collective with a positive time on >= 2 ranks to fit the cost model to")
    forms = list(forms or FORMS[backend])
    fits = {f: fit(ms, f, backend, fixed) for f in forms}
    ranks = np.asarray(ms.obs_ranks)
    nodes = ms.nodes
    distinct = sorted(set(ranks.tolist()))
    rows = []
    if len(distinct) >= 2:
        for form in forms:
            for held in distinct:
                # a fold is a test of the form only where the training data see the held-out scope
                # (inside one node / across nodes): otherwise it tests an assumption about the network
                multi = nodes[ranks == held] > 1
                if (multi & ~(nodes[ranks != held] > 1).any()).any() or \
                        (~multi & ~(nodes[ranks != held] == 1).any()).any():
                    continue
                train = ms.subset(ranks != held)
                test = ms.subset(ranks == held)
                try:
                    # a fold starts where the form's fit on every count ended up (its kept start), not from all
                    f = fit(train, form, backend, fixed, starts=[fits[form].start])
                except ValueError:
                    continue
                err = (predict_obs(f, test) - np.asarray(test.time_s)) / np.asarray(test.time_s)
                rows.append({"form": form, "held_out_ranks": held,
                             "fitted_on": ",".join(str(x) for x in distinct if x != held),
                             "points": len(test), "median_abs_err_pct": float(np.median(np.abs(err)) * 100),
                             "max_abs_err_pct": float(np.max(np.abs(err)) * 100)})
    val = pd.DataFrame(rows, columns=VALIDATION_COLUMNS)
    best, plausible = DEFAULT_FORM[backend] if DEFAULT_FORM[backend] in forms else forms[0], list(forms)
    if len(val):
        score = val.groupby("form")["median_abs_err_pct"].mean()
        best = str(score.idxmin())
        if DEFAULT_FORM[backend] in score and score[DEFAULT_FORM[backend]] <= score[best] * 1.05 + 0.5:
            best = DEFAULT_FORM[backend]       # a tie goes to what the library really does
        limit = 1.5 * score[best] + 2.0
        plausible = [f for f in forms if f in score and score[f] <= limit]
    ppn = int(np.median(ms.obs_ppn)) if len(ms) else 1
    comparison = compare(ms, backend, fixed, forms) if compare_baselines else None
    return CostModel(backend=backend, fits=fits, best=best, plausible=plausible, validation=val, ppn=ppn,
                     source=source, baselines=Baselines(ms),
                     comparison=comparison if comparison is not None else pd.DataFrame(columns=COMPARISON_COLUMNS))


# -- the naive answers beside the model -------------------------------------------------------------
#: size bands of the comparison with the naive answers (bytes: [lo, hi))
BANDS = (("< 64 KiB", 0, 64 << 10), ("64 KiB - 16 MiB", 64 << 10, 16 << 20), (">= 16 MiB", 16 << 20, float("inf")))
BASELINES = ("constant_busbw", "log2_nodes")
COMPARISON_COLUMNS: List[str] = [
    "scope", "band", "held_out_ranks", "fitted_on", "points", "model_median_pct", "model_max_pct",
    "constant_busbw_median_pct", "constant_busbw_max_pct", "log2_nodes_median_pct",
                      "log2_nodes_max_pct", "better"]


def band_of(nbytes: float) -> str:
    return next(name for name, lo, hi in BANDS if lo <= nbytes < hi)


def _interp_log(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """log-log interpolation of y at x (clamped to the measured range)."""
    if not len(xs):
        return float("nan")
    return float(np.exp(np.interp(math.log(max(x, 1.0)), np.log(np.maximum(xs, 1.0)), np.log(ys))))


class Baselines:
    """The two answers a user would give without a model, from the same
    measurements (single calls): **constant busbw** (the bus bandwidth
    measured at the largest count of the same scope, one node or several,
    carried to N: t = S f(N) / busbw) and **log2 nodes** (at each size the
    time measured at the counts of that scope, linear in log2(nodes) across
    nodes, log2(ranks) inside one: interpolated between the counts,
    extrapolated along the last two)."""

    def __init__(self, ms: Optional[Measurements]):
        self.curves: Dict[Tuple[str, bool], Dict[int, Tuple[np.ndarray, np.ndarray]]] = {}
        self.ppn: Dict[int, int] = {}
        if ms is None:
            return
        count = np.bincount(np.asarray(ms.obs, int), minlength=len(ms.time_s))
        first: Dict[int, int] = {}
        for j, o in enumerate(ms.obs):
            first.setdefault(o, j)
        pts: Dict[Tuple[str, bool, int], Dict[float, float]] = {}
        for i in range(len(ms.time_s)):
            if count[i] != 1 or ms.time_s[i] <= 0 or ms.obs_ranks[i] < 2:
                continue
            j = first[i]
            n, p = ms.obs_ranks[i], ms.obs_ppn[i]
            key = (ms.op[j], n > p, n)
            cur = pts.setdefault(key, {})
            s = ms.nbytes[j]
            cur[s] = min(cur.get(s, float("inf")), ms.time_s[i])      # repeats: the faster (as row_time_us)
            self.ppn[n] = p
        for (op, multi, n), by_size in pts.items():
            sizes = np.array(sorted(by_size), float)
            self.curves.setdefault((op, multi), {})[n] = (sizes, np.array([by_size[s] for s in sizes]))

    def _scope(self, op: str, multi: bool):
        c = self.curves.get((canonical(op), multi))
        return c if c else None

    def constant_busbw(self, op: str, nbytes: float, n: int, ppn: int) -> float:
        multi = n > ppn
        c = self._scope(op, multi) or self._scope(op, not multi)
        if not c or n < 2:
            return float("nan")
        ref = max(c)
        sizes, times = c[ref]
        f_ref, f_n = float(bus_factor(canonical(op), ref)), float(bus_factor(canonical(op), n))
        if not (np.isfinite(f_ref) and np.isfinite(f_n)) or f_ref <= 0:
            f_ref = f_n = 1.0
        busbw = sizes * f_ref / times
        return float(nbytes * f_n / _interp_log(nbytes, sizes, busbw))

    def log2_nodes(self, op: str, nbytes: float, n: int, ppn: int) -> float:
        multi = n > ppn
        c = self._scope(op, multi)
        if not c or len(c) < 2 or n < 2:
            return float("nan")
        counts = sorted(c)
        xs = np.array([math.log2(math.ceil(k / self.ppn.get(k, ppn))) if multi else math.log2(k) for k in counts])
        ys = np.array([_interp_log(nbytes, *c[k]) for k in counts])
        x = math.log2(math.ceil(n / ppn)) if multi else math.log2(n)
        if x <= xs[-1]:
            return float(np.interp(x, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if xs[-1] > xs[-2] else 0.0
        return float(max(ys[-1] + slope * (x - xs[-1]), 0.0))

    def times(self, op: str, nbytes: float, n: int, ppn: int) -> Dict[str, float]:
        return {"constant_busbw": self.constant_busbw(op, nbytes, n, ppn),
                "log2_nodes": self.log2_nodes(op, nbytes, n, ppn)}


@dataclass
class NaiveModel:
    """One naive answer (``constant_busbw`` or ``log2_nodes``) behind the
    cost model's interface, for the replay: each call's time is that
    answer's, the model's where the answer has none (a scope with one
    measured count)."""
    model: "CostModel"
    which: str
    bw_scale: float = 1.0
    lat_scale: float = 1.0
    bound: str = "point"

    def available(self, op: str, nbytes: float, n: int) -> bool:
        b = self.model.baselines
        return b is not None and bool(np.isfinite(b.times(op, nbytes, n, self.model._ppn(n))[self.which]))

    def estimate(self, op: str, nbytes: float, n: int, ppn: Optional[int] = None) -> Dict[str, Any]:
        e = self.model.estimate(op, nbytes, n, ppn, with_baselines=False)
        b = self.model.baselines
        if n > 1 and b is not None:
            v = b.times(op, nbytes, n, int(ppn or self.model._ppn(n)))[self.which]
            if np.isfinite(v):
                t = float(v)
                e = {**e, "time_s": t, "lo_s": t, "hi_s": t, "algorithm": self.which}
        return e


def _singles(ms: Measurements) -> List[Tuple[int, int]]:
    """(observation, its call) of the observations that are one call."""
    count = np.bincount(np.asarray(ms.obs, int), minlength=len(ms.time_s))
    out: Dict[int, int] = {}
    for j, o in enumerate(ms.obs):
        if count[o] == 1:
            out.setdefault(o, j)
    return sorted(out.items())


def compare(ms: Measurements, backend: str, fixed: Optional[Fixed] = None, forms: Optional[Sequence[str]] = None
            ) -> pd.DataFrame:
    """Held out against the naive answers: the largest measured count of
    each scope (one node, several) predicted from the smaller ones by the
    model (refitted without it) and by both baselines, per size band:
    median and worst |error| %, and which answer was best."""
    ms = ms.usable()
    ranks = np.asarray(ms.obs_ranks)
    nodes = ms.nodes
    rows = []
    for multi in (False, True):
        scope = ranks[(nodes > 1) == multi]
        if len(set(scope.tolist())) < 2:
            continue
        held = int(scope.max())
        train = ms.subset(ranks < held)
        test = ms.subset(ranks == held)
        try:
            model = build(train, backend, fixed, forms, compare_baselines=False)
        except ValueError:
            continue
        base = Baselines(train)
        errs: Dict[str, Dict[str, List[float]]] = {}
        for i, j in _singles(test):
            op, s, n, p = test.op[j], test.nbytes[j], test.obs_ranks[i], test.obs_ppn[i]
            t = test.time_s[i]
            got = {"model": model.estimate(op, s, n, p, with_baselines=False)["time_s"], **base.times(op, s, n, p)}
            for k, v in got.items():
                if np.isfinite(v):
                    errs.setdefault(band_of(s), {}).setdefault(k, []).append(abs(v - t) / t * 100)
        fitted_on = ",".join(str(x) for x in sorted(set(train.obs_ranks)))
        for name, _lo, _hi in BANDS:
            e = errs.get(name)
            if not e or "model" not in e:
                continue
            row: Dict[str, Any] = {"scope": "across nodes" if multi else "one node", "band": name,
                                   "held_out_ranks": held, "fitted_on": fitted_on, "points": len(e["model"])}
            med = {}
            for k in ("model", *BASELINES):
                v = e.get(k)
                row[f"{k}_median_pct"] = float(np.median(v)) if v else float("nan")
                row[f"{k}_max_pct"] = float(np.max(v)) if v else float("nan")
                if v:
                    med[k] = row[f"{k}_median_pct"]
            row["better"] = min(med, key=lambda k: med[k])
            rows.append(row)
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


# -- helpers for the inputs ----------------------------------------------------------------------
def from_rows(rows: Iterable[dict], ranks: Optional[int] = None, ppn: Optional[int] = None,
              source: str = "", forced: str = "") -> Measurements:
    """commprof bench / nccl-tests rows (op, bytes, out_of_place / in_place
    {time_us, median_us}, ranks) as measurements: per row the faster of its
    out-of-place and in-place times (:func:`row_time_us`)."""
    ms = Measurements()
    for r in rows:
        t_us = row_time_us(r)
        if not t_us:
            continue
        n = int(r.get("ranks") or ranks or 0)
        if n < 2 or not r.get("bytes"):
            continue                     # nothing to communicate (nccl-tests' size-0 rows move no data)
        told = ",".join(x for x in (r.get("algorithm") or forced, r.get("protocol") or "") if x)
        ms.add([(r["op"], r["bytes"])], n, int(r.get("ranks_per_node") or ppn or n), t_us * 1e-6, source, told)
    return ms


def from_logs(docs: Iterable[dict]) -> Measurements:
    """The measurements of imported nccl-tests logs (``commprof.convert.nccltests``), each row's forced
    algorithm / protocol kept."""
    ms = Measurements()
    for d in docs:
        ms.extend(from_rows(d["rows"], forced=d.get("algorithm") or ""))
    return ms


def row_errors(model: "CostModel", doc: dict, lo: float = 1) -> np.ndarray:
    """|error| % of the model's point estimate per row of one imported log (rows of at least ``lo`` bytes,
    each timed by :func:`row_time_us`)."""
    n, ppn = doc["world_size"], doc["ranks_per_node"]
    out = []
    for r in doc["rows"]:
        t = row_time_us(r)
        if r["bytes"] >= lo and t:
            est = model.estimate(doc["op"], r["bytes"], n, ppn, with_baselines=False)["time_s"]
            out.append(abs(est - t * 1e-6) / (t * 1e-6) * 100)
    return np.array(out)


def row_time_us(row: dict) -> Optional[float]:
    """The time of one bench / nccl-tests row: the faster of its out-of-place
    and in-place measurements (each a median, or nccl-tests' mean over its
    iterations). Both time the same collective on the same ranks; a
    transient (another job on the network, a late rank) only adds time, so
    the faster of two is the better estimate of what the collective costs
    (nccl-tests issue 309's 8-node log: 8 MiB out of place 1,272 us, in
    place 321 us, its 16 MiB row 378 us). None where neither was timed."""
    ts = [m.get("median_us") or m.get("time_us") for m in (row.get("out_of_place"), row.get("in_place")) if m]
    ts = [float(t) for t in ts if t and t > 0]
    return min(ts) if ts else None


def busy_periods(instances: pd.DataFrame, ppn: int = 0) -> Measurements:
    """Collective instances (columns: group, seq, op, bytes, group_size,
    last_issue_s, end_s[, ppn]) grouped into busy periods of each group's
    communication: a period starts with an instance issued (by its last
    rank) after every earlier one had completed, and ends when the last of
    its instances completes. A work-conserving link (one stream in order,
    NCCL; several at once sharing the bandwidth, gloo) is busy for the sum
    of its collectives' times over a period, whatever the order of
    completion: one observation per period."""
    ms = Measurements()
    d = instances.sort_values(["group", "seq"])
    has_ppn = "ppn" in d
    for (_g, n), g in d.groupby(["group", "group_size"], sort=False):
        n = int(n)
        if n < 2:
            continue
        issue = g["last_issue_s"].to_numpy(np.float64)
        end = g["end_s"].to_numpy(np.float64)
        ops = g["op"].astype(str).to_numpy()
        nb = g["bytes"].to_numpy(np.float64)
        pp = g["ppn"].to_numpy() if has_ppn else np.full(len(g), ppn or n)
        start, stop, calls = issue[0], end[0], [0]
        for i in range(1, len(g) + 1):
            if i == len(g) or issue[i] >= stop:
                ms.add([(ops[j], nb[j]) for j in calls], n, int(pp[calls[0]]), stop - start, "trace")
                if i == len(g):
                    break
                start, stop, calls = issue[i], end[i], []
            stop = max(stop, end[i])
            calls.append(i)
    return ms


def frame(model: CostModel, ms: Optional[Measurements], targets: Sequence[int], sizes_by_op: Dict[str, List[float]],
          ppn: Optional[int] = None) -> pd.DataFrame:
    """Measured rows (single calls) and predicted rows per op, size and N:
    n_ranks, nodes, bytes, time_us (lo, hi), algbw / busbw (GB/s), algorithm,
    predicted, and for measured rows the model's error there."""
    from ..trace.ops import bandwidths

    rows = []
    p_target = int(ppn or model.gpus_per_node or model.ppn or 1)
    if ms is not None:
        count = np.bincount(np.asarray(ms.obs, int), minlength=len(ms.time_s))
        pred = predict_obs(model.fits[model.best], ms)
        _t, chosen = predict_calls(model.fits[model.best], ms)
        first_call: Dict[int, int] = {}
        for j, o in enumerate(ms.obs):
            first_call.setdefault(o, j)
        for i in range(len(ms.time_s)):
            if count[i] != 1:
                continue
            j = first_call[i]
            op, nb, n = ms.op[j], ms.nbytes[j], ms.obs_ranks[i]
            alg, bus = bandwidths(op, nb, ms.time_s[i], n)
            rows.append({"op": op, "n_ranks": n, "nodes": int(math.ceil(n / ms.obs_ppn[i])), "bytes": int(nb),
                         "predicted": False, "time_us": ms.time_s[i] * 1e6, "time_lo_us": float("nan"),
                         "time_hi_us": float("nan"), "algbw_GBps": alg / 1e9, "busbw_GBps": bus / 1e9,
                         "algorithm": str(chosen[j]) + (" (forced)" if ms.forced[j] else ""),
                         "model_us": pred[i] * 1e6,
                         "err_pct": 100 * (pred[i] - ms.time_s[i]) / ms.time_s[i],
                         "constant_busbw_us": float("nan"), "log2_nodes_us": float("nan"), "worse_than": ""})
    for op, sizes in sizes_by_op.items():
        for n in targets:
            for nb in sizes:
                e = model.estimate(op, nb, int(n), p_target)
                alg, bus = bandwidths(op, nb, float(e["time_s"]), int(n))
                rows.append({"op": op, "n_ranks": int(n), "nodes": int(math.ceil(n / p_target)), "bytes": int(nb),
                             "predicted": True, "time_us": float(e["time_s"]) * 1e6,
                             "time_lo_us": float(e["lo_s"]) * 1e6, "time_hi_us": float(e["hi_s"]) * 1e6,
                             "algbw_GBps": alg / 1e9, "busbw_GBps": bus / 1e9, "algorithm": e["algorithm"],
                             "model_us": float("nan"), "err_pct": float("nan"),
                             "constant_busbw_us": e["constant_busbw_s"] * 1e6, "log2_nodes_us": e["log2_nodes_s"] * 1e6,
                             "worse_than": ", ".join(k.replace("_", " ") for k in e["worse_than"])})
    cols = ["op", "n_ranks", "nodes", "bytes", "predicted", "time_us", "time_lo_us", "time_hi_us", "algbw_GBps",
            "busbw_GBps", "algorithm", "model_us", "err_pct", "constant_busbw_us", "log2_nodes_us", "worse_than"]
    return pd.DataFrame(rows, columns=cols).sort_values(["op", "predicted", "n_ranks", "bytes"], kind="stable")


def described(fixed: Fixed, backend: str = "nccl", ppn: int = 1) -> CostModel:
    """A cost model from given terms alone: latencies not given are NCCL's
    (or gloo's) constants, an intra-node bandwidth not given is the
    network's."""
    backend = backend_of(backend)
    v = dict(fixed.values)
    status = {k: fixed.source for k in v}
    for k in LATENCY_TERMS:
        if k not in v:
            v[k] = PRIORS[backend][k]
            status[k] = "prior"
    if "inter_bw" not in v and "intra_bw" not in v:
        raise ValueError("a described network needs a bandwidth (bw=...)")
    if "intra_bw" not in v:
        v["intra_bw"], status["intra_bw"] = v["inter_bw"], "assumed (= inter_bw)"
    if "inter_bw" not in v:
        v["inter_bw"], status["inter_bw"] = v["intra_bw"], "assumed (= intra_bw)"
    # LL and LL128: NCCL's latency constants and bandwidth ratios to Simple's (nothing measured them)
    if backend == "nccl":
        for proto in ("LL", "LL128"):
            for k in LATENCY_TERMS:
                name = _name(proto, k)
                if name not in v:
                    v[name], status[name] = PRIORS[backend][name], "prior"
            for k in ("intra_bw", "inter_bw"):
                name = _name(proto, k)
                if name not in v:
                    v[name], status[name] = v[k] * RING_PROTO_BW[proto], "prior (NCCL's ratio to Simple)"
    fits = {}
    for form in FORMS[backend]:
        th = np.zeros(NT)
        st = dict(status)
        for j, name in enumerate(TERMS):
            if name not in v:
                st[name] = "unused"
                continue
            th[j] = v[name] if IS_LAT[j] else 1 / v[name]
            if form == "hockney" and IS_LAT[j] and name.split(".")[-1] != "base":
                th[j] = 0.0
                st[name] = "unused"
        fits[form] = Fit(form=form, backend=backend, theta=th, cov=np.zeros((NT, NT)), scatter=0.0, status=st)
    best = DEFAULT_FORM[backend]
    return CostModel(backend=backend, fits=fits, best=best, plausible=[best], validation=pd.DataFrame(
        columns=VALIDATION_COLUMNS), ppn=int(ppn or 1), source="network as described")
