"""Side files of a shard folder (kernel mode's Kineto windows): merged onto
the rank without counting collectives twice; a torn one costs its kernels,
never the rank."""
import os
import shutil

from commprof import assemble
from commprof.trace import journal, parquet, schema
from tracegen import ddp_rank

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "kineto")
FIXTURE = os.path.join(DATA, "resnet_nccl_2gpu_rank0.json.gz")


def _shard(folder, rank=0, host="h", pid=11):
    rows = ddp_rank(rank, 2, 6)
    meta = {"rank": rank, "world_size": 2, "host": host, "pid": pid,
            "clock": {"wall_ns_at_start": 0, "mono_ns_at_start": 0}}
    parquet.write_trace(schema.rows_to_table(rows, rank), os.path.join(folder, journal.shard_name(rank, host, pid)),
                        {}, [meta])
    return rows, meta


def test_kernel_mode_side_file_adds_kernels_not_collectives(tmp_path):
    rows, meta = _shard(str(tmp_path))
    shutil.copy(FIXTURE, journal.kernel_trace_path(str(tmp_path), "h", 11))
    run = assemble.load(str(tmp_path))
    t = run.table.to_pandas()
    kern = t[t["category"] == "kernel"]
    assert (kern["name"] == "nccl").sum() > 0, "the fixture's NCCL kernels are kept as kernels"
    comm = t[t["category"] == "comm"]
    assert len(comm) == sum(r.category == "comm" for r in rows)  # the host rows only
    assert set(comm["source"].astype(str)) == {"ddp_reducer"}
    assert not comm.duplicated(["rank", "group", "seq"]).any()
    assert run.ranks[0]["kernels"] == len(kern)


def test_a_torn_kernel_file_is_left_out_with_a_warning(tmp_path, capsys):
    _shard(str(tmp_path))
    data = open(FIXTURE, "rb").read()
    with open(journal.kernel_trace_path(str(tmp_path), "h", 11), "wb") as fh:
        fh.write(data[: len(data) // 2])  # killed mid-export (before the atomic rename existed)
    run = assemble.load(str(tmp_path))
    assert "kernels_error" in run.ranks[0]
    assert (run.table.column("category").to_pylist().count("kernel")) == 0
    assert run.table.num_rows > 0
    assert "kernel trace left out" in capsys.readouterr().err


def test_import_still_makes_collectives_from_nccl_kernels(tmp_path):
    from commprof.convert.kineto_import import import_kineto

    out = str(tmp_path / "k.parquet")
    import_kineto([FIXTURE], out)
    t = parquet.read_file(out)[0].to_pandas()
    comm = t[t["category"] == "comm"]
    assert len(comm) > 0 and set(comm["source"].astype(str)) == {"kineto"}
    assert not comm.duplicated(["rank", "group", "seq"]).any()
