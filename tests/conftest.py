import os
import signal
import subprocess
import sys

import pytest

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                os.path.dirname(os.path.abspath(__file__))]

from helpers import ROOT, commprof_cmd, results, run  # noqa: E402


def _patch_points():
    """Every attribute / registry commprof may touch, with its current value."""
    points = {
        "os._exit": os._exit,
        "sigterm": signal.getsignal(signal.SIGTERM),
        "meta_path": tuple(sys.meta_path),
    }
    if "torch" in sys.modules:
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        from torch.nn.modules import module as m
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.optim import optimizer as o
        from torch.utils.data import dataloader

        from commprof.record.instruments.collectives import SPECS

        points["autograd.backward"] = torch.autograd.backward
        points["iter.__next__"] = dataloader._BaseDataLoaderIter.__dict__.get("__next__")
        for name in ("__init__", "register_comm_hook", "_register_builtin_comm_hook"):
            points[f"DDP.{name}"] = DDP.__dict__.get(name)
        for fname in SPECS:
            points[f"dist.{fname}"] = getattr(dist, fname, None)
            points[f"c10d.{fname}"] = getattr(c10d, fname, None)
        from torch.cuda import graphs

        for name in ("capture_begin", "capture_end"):
            points[f"CUDAGraph.{name}"] = graphs.CUDAGraph.__dict__.get(name)
        points["optim_pre"] = tuple(o._global_optimizer_pre_hooks)
        points["optim_post"] = tuple(o._global_optimizer_post_hooks)
        points["fwd_pre"] = tuple(m._global_forward_pre_hooks)
        points["fwd"] = tuple(m._global_forward_hooks)
    return points


#: tests that run alone, after the rest (``make test`` runs the rest on
#: every core, a file per worker): what they assert depends on the machine
#: being otherwise quiet (time between ranks, a tolerance on a measured
#: time, a hang timeout, a ratio of two timed processes, shaped links).
#: Keys: a file or folder, or ``file::test`` (a name's prefix). Tests using
#: the namespace cluster are serial too (SERIAL_FIXTURES, matched through
#: the fixtures a test's fixtures use): one set of interface names, links
#: shaped to a rate.
SERIAL = {
    "tests/gpu/test_gpu.py": "the GPU check on a GPU: overheads and bandwidths measured",
    "tests/analyzers/test_report_speed_guard.py": "the report's time against the scan's",
    "tests/record/test_equal_ranks.py": "equal ranks must measure equal",
    "tests/record/test_fidelity.py": "measured shares within a point",
    "tests/record/test_hang_and_shared.py": "hang timeouts",
    "tests/record/test_fine_grain.py": "a late rank's delay against the buckets",
    "tests/record/test_device_timing.py": "a simulated device's lag measured",
    "tests/record/test_frameworks.py::test_deepspeed_per_call_latency": "latencies against DeepSpeed's own",
    "tests/record/test_crash_and_signals.py": "signals sent at a point of a running job",
    "tests/record/test_failure.py": "ranks killed inside a collective",
}
SERIAL_FIXTURES = ("cluster_available",)
#: every test on the session's SLURM, in one file: the rest runs a file per
#: worker (``--dist loadfile``), so the daemons start once, on one worker,
#: and serve one test at a time. Those tests assert what SLURM started and
#: what was recorded, not times: they run beside the rest.
SLURM_TESTS = "tests/cluster/test_slurm.py"


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "local_slurm" in fixtures and not item.nodeid.startswith(SLURM_TESTS + "::"):
            raise pytest.UsageError(f"{item.nodeid} uses the session's SLURM: it belongs in {SLURM_TESTS}")
        if any(item.nodeid.startswith(key) for key in SERIAL) or any(f in SERIAL_FIXTURES for f in fixtures):
            item.add_marker(pytest.mark.serial)


#: test folders that never record: no torch import, no native build for them
PURE = ("analyzers", "trace", "convert")


def _pure(item) -> bool:
    parts = os.path.relpath(str(item.path), os.path.join(ROOT, "tests")).split(os.sep)
    return parts[0] in PURE


@pytest.fixture(scope="session", autouse=True)
def native_hooks_built(request):
    """commprof's native process-group hooks, built once for the whole run
    (as `commprof record` builds them before a job): every recorded DDP run
    of the suite then uses them, whatever the order of the tests. `make
    install` builds them already (this is then a check that they are
    there); where the build fails, tests/record/test_native_hooks.py says
    why. Not built when only tests that never record are collected."""
    if all(_pure(item) for item in request.session.items):
        return None
    return subprocess.run([sys.executable, "-c", "from commprof.record import native; native.build()"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Every test must leave torch, os and the import system as it found them
    (torch's patch points compared wherever a test may record: torch is
    imported first, so they always are)."""
    if not _pure(request.node):
        import torch  # noqa: F401

    before = _patch_points()
    yield
    from commprof.record import session

    assert session.current() is None, "a test left a recording session running"
    after = _patch_points()
    leaked = {k for k in before if before[k] is not after.get(k) and before[k] != after.get(k)}
    assert not leaked, f"patches leaked: {sorted(leaked)}"


def _recorder(folder):
    counter = {"n": 0}

    def _record(cmd, *options, out=None, timeout=240, env=None):
        counter["n"] += 1
        out = out or str(folder / f"rec{counter['n']}")
        res = folder / f"res{counter['n']}"
        res.mkdir()
        cmd = [str(res) if c == "{res}" else c for c in cmd]
        proc = run(commprof_cmd("record", "-o", out, *options, "--", *cmd), timeout=timeout, env=env)
        proc.results = results(str(res))
        proc.res_dir = str(res)
        return proc, out

    return _record


@pytest.fixture
def record(tmp_path):
    """record(args..., cmd=[...]) -> (CompletedProcess, out_dir)."""
    return _recorder(tmp_path)


@pytest.fixture(scope="module")
def record_once(tmp_path_factory):
    """record_once(cmd, *options) -> (CompletedProcess, out_dir): one
    recording per command line for the whole module (tests that read the
    same run share it; none may change its folder)."""
    rec = _recorder(tmp_path_factory.mktemp("shared"))
    done = {}

    def _once(cmd, *options, timeout=240):
        key = (tuple(cmd), tuple(options))
        if key not in done:
            done[key] = rec(cmd, *options, timeout=timeout)
        return done[key]

    return _once


# -- the one-machine cluster (tests/cluster/) --------------------------------
@pytest.fixture(scope="session")
def cluster_available():
    sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
    import cluster as _cluster

    reason = _cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
    return _cluster


@pytest.fixture
def make_cluster(cluster_available):
    """make_cluster(n, rate_mbit=None, ...) -> an up Cluster, torn down after the test."""
    made = []

    def make(n, **kw):
        c = cluster_available.Cluster(n, **kw).up()
        made.append(c)
        return c

    yield make
    for c in made:
        c.down()
    leftover = [n.ns for c in made for n in c.nodes if os.path.exists(f"/run/netns/{n.ns}")]
    assert not leftover, f"namespaces left behind: {leftover}"


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    """A real one-node SLURM (munged, slurmctld, slurmd) for the session."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
    import slurm as _slurm

    reason = _slurm.why_unavailable()
    if reason:
        pytest.skip(reason)
    s = _slurm.LocalSlurm(str(tmp_path_factory.mktemp("slurm")))
    s.up()
    yield s
    s.down()
