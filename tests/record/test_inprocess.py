"""Instruments installed and removed in this very process."""
import importlib
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from commprof import assemble
from commprof.record import session
from commprof.record.config import Config
from commprof.record.instruments import ALL

# The framework instruments install when their modules are imported: import
# them here, before any test's leak snapshot (some add import finders).
# Each is optional: a test that needs one skips without it.
FRAMEWORKS = ("deepspeed", "horovod.torch", "nvidia.dali.plugin.pytorch", "torch.distributed.fsdp")
for _name in FRAMEWORKS:
    try:
        importlib.import_module(_name)
    except ImportError:
        pass


def _train(model, steps=3, batch=4):
    ds = TensorDataset(torch.randn(batch * steps, 8), torch.randint(0, 2, (batch * steps,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(ds, batch_size=batch):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


@pytest.fixture
def recording(tmp_path):
    cfg = Config(out_dir=str(tmp_path / "out"), run_id="t", flush_interval=0.05)
    s = session.start(cfg)
    try:
        yield s
    finally:
        session.stop()


def test_install_and_uninstall_every_instrument(recording):
    for name in FRAMEWORKS:
        pytest.importorskip(name)
    assert set(recording.instruments) == set(ALL)
    assert all(i.installed and i.active for i in recording.instruments.values())
    assert torch.autograd.backward.__commprof__ == "autograd"
    session.stop()
    assert session.current() is None
    assert not hasattr(torch.autograd.backward, "__commprof__")


def test_ddp_broadcasts_recorded(recording, tmp_path):
    """DDP's construction broadcast (parameters + buffers) and, with
    broadcast_buffers (the default), the per-forward broadcast of the
    buffers (BatchNorm statistics) are recorded with their bytes."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = model(torch.randn(5, 8)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        # called with keywords (torch's own callers pass them by position)
        dist._broadcast_coalesced(process_group=dist.group.WORLD, tensors=[torch.ones(5)], buffer_size=1 << 20,
                                  src=0)
    finally:
        dist.destroy_process_group()
    session.stop()
    ev = assemble.load(str(tmp_path / "out" / "shards")).table.to_pandas()
    bc = ev[(ev["category"] == "comm") & (ev["detail"] == "_broadcast_coalesced")].sort_values("seq")
    assert bc["bytes"].iloc[-1] == 5 * 4
    bc = bc.iloc[:-1]
    params = (8 * 4 + 4 + 4 + 4) * 4
    buffers = 4 * 4 + 4 * 4 + 8  # running mean, running var (float32), num_batches_tracked (int64)
    assert list(bc["bytes"]) == [params + buffers, buffers, buffers, buffers]
    assert (bc["name"] == "broadcast").all() and bc["blocking"].all()
    assert list(bc["step"])[1:] == [0, 1, 2]  # one buffer broadcast per forward, inside its step


def test_single_process_events(recording, tmp_path):
    _train(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    session.stop()
    run = assemble.load(str(tmp_path / "out" / "shards"))
    ev = run.table.to_pandas()
    assert (ev["category"] == "step").sum() == 3
    fw = ev[(ev["name"] == "forward") & (ev["detail"] == "Sequential")]
    assert len(fw) == 3 and (fw["items"] == 4).all()
    assert run.ranks[0]["models"] == {"Sequential": 8 * 16 + 16 + 16 * 2 + 2}
    assert (ev[ev["category"] == "step"]["items"] == 4).all()


def test_ddp_world_of_one_in_process(recording, tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        _train(model)
        t = torch.ones(3)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        out = torch.empty(6)
        dist.all_gather_into_tensor(out[:3], t)  # deprecated alias of all_gather_single: one record
        dist.all_gather_single(out[3:], t)
        dist.broadcast(t, src=0)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    session.stop()
    ev = assemble.load(str(tmp_path / "out" / "shards")).table.to_pandas()
    comm = ev[ev["category"] == "comm"]
    ddp = comm[comm["source"] == "ddp_reducer"]
    assert len(ddp) == 3 and (ddp["bytes"] == (8 * 2 + 2) * 4).all()
    py = comm[comm["source"] == "torch.distributed"].sort_values("seq")
    # first DDP's construction-time broadcast of the model state (seq 0)
    assert list(py["name"]) == ["broadcast", "all_reduce", "all_reduce", "all_gather", "all_gather", "broadcast",
                                "barrier"]
    assert list(py["blocking"]) == [True, True, False, True, True, True, True]
    assert list(py["bytes"]) == [(8 * 2 + 2) * 4, 12, 12, 12, 12, 12, 0]
    assert list(py["detail"]) == ["_broadcast_coalesced", "all_reduce", "all_reduce", "all_gather_into_tensor",
                                  "all_gather_single", "broadcast", "barrier"]
    # seq continues the group's counter after the three DDP buckets
    assert list(py["seq"]) == [0, 4, 5, 6, 7, 8, 9]


def test_ddp_group_hooks_are_removed_with_the_session(recording, tmp_path):
    """DDP timed through its process group's pre/post hooks (no comm hook:
    DDP keeps its C++ path); stopping the session unregisters them."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        import gc
        import weakref

        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        _train(model)
        assert not model._comm_hooks and model._get_ddp_logging_data().get("comm_hook", "") == ""
        (hooks,) = recording.instruments["ddp"]._pg_hooked.values()
        assert hooks.pg() is dist.group.WORLD
        alive = weakref.ref(hooks)
        del hooks
        gc.collect()
        assert alive() is not None           # held by the process group's hook table
        session.stop()
        gc.collect()
        assert alive() is None               # unregistered: nothing holds the hooks any more
        _train(model)  # still trains
    finally:
        dist.destroy_process_group()
    ev = assemble.load(str(tmp_path / "out" / "shards")).table.to_pandas()
    ddp = ev[ev["source"] == "ddp_reducer"]
    assert len(ddp) == 3 and set(ddp["detail"]) == {"reducer"} and set(ddp["dtype"]) == {"torch.float32"}
    assert (ddp["t_end"] >= ddp["t_start"]).all()


def test_ddp_unused_parameter_map_is_labelled(recording, tmp_path):
    """With find_unused_parameters the Reducer also allreduces its int32 map
    of used parameters each step: recorded, labelled apart from the buckets."""
    class Half(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(8, 2), nn.Linear(8, 2)

        def forward(self, x):
            return self.used(x)

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        _train(nn.parallel.DistributedDataParallel(Half(), find_unused_parameters=True))
    finally:
        dist.destroy_process_group()
    session.stop()
    ev = assemble.load(str(tmp_path / "out" / "shards")).table.to_pandas()
    ddp = ev[ev["source"] == "ddp_reducer"]
    used = ddp[ddp["detail"] == "local_used_map"]
    assert len(used) == 3 and set(used["dtype"]) == {"torch.int32"} and (used["bytes"] == 4 * 4).all()
    grads = ddp[ddp["detail"] == "reducer"]
    assert len(grads) >= 3 and set(grads["dtype"]) == {"torch.float32"}


def test_fork_child_does_not_write(recording, tmp_path):
    _train(nn.Linear(8, 2), steps=1)
    pid = os.fork()
    if pid == 0:  # child: records nothing unless it trains; exits through os._exit
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    session.stop()
    shards, journals = assemble.find_shards(str(tmp_path / "out" / "shards"))
    assert not shards and len(journals) == 1  # the parent's journal only
    assert assemble.open_run(str(tmp_path / "out" / "shards"))[1][0]["status"] == "complete"


def test_metric_api_records_only_when_recording(recording, tmp_path):
    import commprof

    _train(nn.Linear(8, 2), steps=1)
    commprof.metric("loss", 0.5)
    commprof.set_run_info(model="x")
    session.stop()
    commprof.metric("ignored", 1.0)  # no session: a no-op
    ev = assemble.load(str(tmp_path / "out" / "shards")).table.to_pandas()
    m = ev[ev["category"] == "metric"]
    assert list(m["name"]) == ["loss"] and list(m["value"]) == [0.5]
