"""commprof bench on real gloo ranks."""
import json

import pytest

from commprof.convert.nccltests import bandwidths, bus_factor
from conftest import commprof_cmd, run

pytestmark = pytest.mark.slow  # launches torchrun


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_op_and_size_is_right(tmp_path, nproc):
    out, model = tmp_path / "b.json", tmp_path / "m.json"
    proc = run(commprof_cmd("bench", "--nproc", str(nproc), "--max-bytes", "256K", "--iters", "3", "--warmup", "1",
                            "--json", str(out), "--model", str(model)), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == nproc and doc["backend"] == "gloo"
    ops = {r["op"] for r in doc["rows"]}
    assert ops == {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"}
    for r in doc["rows"]:
        modes = [m for m in ("out_of_place", "in_place") if r[m]]
        assert modes and all(r[m]["wrong"] == 0 and r[m]["time_us"] > 0 for m in modes), r
        if r["op"] in ("reduce_scatter", "all_gather", "all_to_all"):
            assert r["count"] % nproc == 0  # S is the full array
    sizes = sorted({r["bytes"] for r in doc["rows"] if r["op"] == "all_reduce"})
    assert sizes[0] == 8 and sizes[-1] == 256 * 1024
    # the table's busbw = algbw x nccl-tests factor
    r = [r for r in doc["rows"] if r["op"] == "all_reduce"][-1]
    alg, bus = bandwidths("all_reduce", r["bytes"], r["in_place"]["time_us"], nproc)
    assert bus == pytest.approx(alg * bus_factor("all_reduce", nproc))
    assert f"{alg:7.2f} {bus:7.2f}" in proc.stdout
    assert "Out of bounds values : 0 OK" in proc.stdout
    m = json.loads(model.read_text())
    assert set(m["ops"]) == ops and all(p["beta_Bps"] > 0 for d in m["ops"].values() for ps in d.values() for p in ps)


def test_bad_bench_input_is_one_line(tmp_path):
    proc = run(commprof_cmd("bench"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--nproc" in proc.stderr
    proc = run(commprof_cmd("bench", "--nproc", "2", "--max-bytes", "lots"))
    assert proc.returncode == 2 and "not a size" in proc.stderr


def test_overlap_and_pipelining_modes(tmp_path):
    out = tmp_path / "b.json"
    proc = run(commprof_cmd("bench", "--nproc", "2", "--ops", "all_reduce", "--max-bytes", "1M", "--iters", "4",
                            "--warmup", "1", "--overlap", "--pipeline", "--json", str(out)), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    ov = doc["overlap"]
    assert [r["bytes"] for r in ov] == [1024, 4096, 16384, 65536, 262144, 1048576]
    for r in ov:
        assert r["comm_us"] > 0 and r["compute_us"] > 0 and r["nonblocking_total_us"] > 0
        assert 0.0 <= r["overlap_pct"] <= 100.0
    pipe = doc["pipeline"]
    assert [r["bytes"] for r in pipe] == [262144, 524288, 1048576]
    for r in pipe:
        assert set(map(int, r["time_us_by_k"])) == {1, 2, 4, 8, 16, 32, 64}
        assert r["best_k"] in (1, 2, 4, 8, 16, 32, 64) and r["gain_pct"] >= 0
    assert "overlap %" in proc.stdout and "best k" in proc.stdout
