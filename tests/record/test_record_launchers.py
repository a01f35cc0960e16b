"""commprof record around torchrun, mp.spawn and a single process (real
processes, gloo)."""
import os
import sys

import pytest

from commprof import assemble
from helpers import TINY, documented_record

pytestmark = pytest.mark.slow  # launches training processes

PY = sys.executable
STEPS = 6


def _load(out):
    run = assemble.load(out)
    return run, run.table.to_pandas()


def _check_ddp(out, res, world):
    run, ev = _load(out)
    assert os.path.exists(os.path.join(out, "trace.parquet"))
    assert not os.path.exists(os.path.join(out, "shards")), "shards removed after a merge"
    assert run.meta["world_size"] == world
    assert sorted(ev["rank"].unique()) == list(range(world))
    assert run.meta["ranks_recorded"] == world
    for r in range(world):
        mine = ev[ev["rank"] == r]
        steps = mine[mine["category"] == "step"]
        assert sorted(steps["step"]) == list(range(STEPS))
        if world > 1:
            buckets = mine[(mine["source"] == "ddp_reducer")]
            per_step = buckets.groupby("step")["bytes"].sum()
            assert len(per_step) == STEPS
            # The bucketed allreduce carries exactly the model's gradients.
            assert (per_step == res[r]["grad_bytes"]).all(), per_step
            assert (buckets["name"] == "all_reduce").all()
            assert (buckets["group_size"] == world).all()
            # Sequence numbers match across ranks (same collective, same seq).
            seqs = buckets.sort_values("seq")["seq"].tolist()
            assert seqs == sorted(set(seqs))
            # DDP's construction broadcast of the model state, before the first bucket
            bc = mine[mine["detail"] == "_broadcast_coalesced"]
            assert len(bc) == 1 and bc["name"].iloc[0] == "broadcast", bc
            assert bc["bytes"].iloc[0] == res[r]["state_bytes"]
            assert bc["seq"].iloc[0] < buckets["seq"].min()
        for name in ("forward", "backward", "optimizer"):
            assert (mine["name"] == name).sum() >= STEPS, name
        data = mine[mine["category"] == "data"]
        assert len(data) >= STEPS
        assert (mine["t_end"] >= mine["t_start"]).all()
    return run, ev


def test_the_quick_start_records_torchrun_with_four_ranks(record):
    """The README's first command (the docs' front page shows it too), its
    train.py a tiny DDP model."""
    script = [TINY, "--result-dir", "{res}", "--steps", str(STEPS)]
    options, cmd = documented_record("README.md", "torchrun --nproc_per_node 4", script=script)
    assert documented_record("docs/index.md", "torchrun --nproc_per_node 4", script=script) == (options, cmd)
    proc, out = record(cmd, *options)
    assert proc.returncode == 0, proc.stderr
    res = proc.results
    assert set(res) == {0, 1, 2, 3}
    run, ev = _check_ddp(out, res, 4)
    assert run.meta["launcher"] == "torchrun"
    assert run.meta["framework"] == "ddp"
    assert run.meta["backend"] == "gloo"
    # Python-issued collectives after training are recorded too, with the same seq on every rank.
    py = ev[ev["source"] == "torch.distributed"]
    assert set(py["name"]) == {"broadcast", "all_reduce", "barrier"}  # broadcast: DDP construction
    first = py[py["rank"] == 0][["name", "seq", "bytes"]].reset_index(drop=True)
    for r in (1, 2, 3):
        assert first.equals(py[py["rank"] == r][["name", "seq", "bytes"]].reset_index(drop=True)), r
    assert (py[py["name"] == "all_reduce"]["bytes"] == 4 * STEPS).all()


def test_nproc_convenience_and_mp_spawn(record):
    # the guide's command, its script a tiny DDP model that calls mp.spawn itself
    options, cmd = documented_record("docs/recording.md", "mp_spawn",
                                     script=[TINY, "--result-dir", "{res}", "--steps", str(STEPS), "--spawn", "2"])
    proc, out = record(cmd, *options)
    assert proc.returncode == 0, proc.stderr
    res = proc.results
    run, ev = _check_ddp(out, res, 2)
    # the parent that called mp.spawn never trained: no third shard
    assert run.meta["ranks_recorded"] == 2


def test_nproc_option(record):
    options, cmd = documented_record("docs/recording.md", "--nproc 2",
                                     script=[TINY, "--result-dir", "{res}", "--steps", str(STEPS)])
    assert options == ["--nproc", "2"]
    proc, out = record(cmd, *options)
    assert proc.returncode == 0, proc.stderr
    _check_ddp(out, proc.results, 2)


def test_single_process_with_dataloader_workers(record):
    proc, out = record([PY, TINY, "--result-dir", "{res}", "--steps", str(STEPS), "--workers", "2"])
    assert proc.returncode == 0, proc.stderr
    run, ev = _check_ddp(out, proc.results, 1)
    # DataLoader worker processes do not write rank traces
    assert run.meta["ranks_recorded"] == 1
    assert run.meta["world_size"] == 1
    assert not (ev["category"] == "comm").any()


def test_user_comm_hook_keeps_working_and_is_timed(record):
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", str(STEPS), "--user-hook"])
    assert proc.returncode == 0, proc.stderr
    run, ev = _check_ddp(out, proc.results, 2)
    buckets = ev[ev["source"] == "ddp_reducer"]
    assert set(buckets["detail"]) == {"train.<locals>.my_hook"}


def test_builtin_comm_hook_is_timed(record):
    """DDP's built-in C++ ALLREDUCE hook cannot be wrapped, but its
    collectives reach the process group's hooks: timed like the default path."""
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", str(STEPS), "--builtin-hook"])
    assert proc.returncode == 0, proc.stderr
    assert proc.results[0]["comm_hook"] == "BuiltinCommHookType.ALLREDUCE", proc.results[0]["comm_hook"]
    run, ev = _check_ddp(out, proc.results, 2)
    assert set(ev[ev["source"] == "ddp_reducer"]["detail"]) == {"reducer"}


def test_small_buckets_give_several_allreduces_per_step(record):
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                        "--steps", str(STEPS), "--hidden", "256", "--layers", "3", "--bucket-mb", "0.1"])
    assert proc.returncode == 0, proc.stderr
    res = proc.results
    run, ev = _check_ddp(out, res, 2)
    b = ev[(ev["source"] == "ddp_reducer") & (ev["rank"] == 0)]
    # DDP rebuilds its buckets after the first iteration; from then on the
    # 0.1 MB cap splits the gradients into several allreduces per step.
    assert b[b["step"] >= 1].groupby("step").size().min() >= 3
