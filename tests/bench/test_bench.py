"""commprof bench on real gloo ranks."""
import json

import pytest

from commprof.convert.nccltests import bandwidths, bus_factor
from helpers import commprof_cmd, documented_scaled, run

pytestmark = pytest.mark.slow  # launches torchrun


#: sizes and iterations of a check, not of a measurement
SMALL = ["--max-bytes", "256K", "--iters", "3", "--warmup", "1"]


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_op_and_size_is_right(tmp_path, nproc):
    """The bench guide's first and third commands (every collective on 2
    ranks; all_reduce on 4 with its JSON and model), up to 256 KiB."""
    out, model = tmp_path / "b.json", tmp_path / "m.json"
    if nproc == 2:
        words = documented_scaled("docs/bench.md", "bench --nproc 2", "sizes of a check",
                                  add=SMALL + ["--json", out, "--model", model])
    else:
        words = documented_scaled("docs/bench.md", "bench --nproc 4 --ops all_reduce", "sizes of a check",
                                  outputs={"b.json": out, "model.json": model}, add=SMALL)
    proc = run(commprof_cmd(*words), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == nproc and doc["backend"] == "gloo"
    ops = {r["op"] for r in doc["rows"]}
    assert ops == ({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"} if nproc == 2
                   else {"all_reduce"})
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


def test_bench_trace_is_reported_and_modelled_like_any_run(tmp_path):
    import commprof

    out, model = tmp_path / "bt", tmp_path / "m.json"
    proc = run(commprof_cmd("bench", "--nproc", "2", "--ops", "all_reduce,broadcast", "--max-bytes", "64K",
                            "--iters", "4", "--warmup", "1", "-o", str(out), "--model", str(model)), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = commprof.load(str(out))
    assert t.meta["source"] == "bench" and t.meta["ranks_recorded"] == 2
    ev = t.events()
    assert set(ev["category"]) == {"comm"} and set(ev["source"]) == {"bench"}
    # every timed call of every rank: 14 sizes (8 B .. 64 KiB) x 4 iterations x modes
    doc = json.loads((out / "bench.json").read_text())
    calls = sum(sum(1 for m in ("out_of_place", "in_place") if r[m]) for r in doc["rows"]) * 4
    assert len(ev) == 2 * calls
    assert ev.groupby(["group", "seq"]).size().eq(2).all()      # the same call on both ranks
    rep = run(commprof_cmd("report", str(out)))
    assert rep.returncode == 0, rep.stderr
    assert "Alpha-beta fit per collective" in rep.stdout and "Benchmark (time" in rep.stdout
    m = run(commprof_cmd("model", str(out), "--against", str(model), "--json", str(tmp_path / "fit.json")))
    assert m.returncode == 0, m.stderr
    assert "Agreement of the fits" in m.stdout
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert set(fit["ops"]) == {"all_reduce", "broadcast"} and "float" in fit["ops"]["all_reduce"]
    # the trace's own fit and the bench's fit take the same statistic of the same calls (per call the
    # slowest rank, median per size, out-of-place where timed): the same points, the same model
    from commprof.api import model as model_report

    agree = model_report([str(out)], [str(model)]).tables["agreement"].frame
    assert set(agree["op"]) == {"all_reduce", "broadcast"}
    assert (agree["max_rel_diff_pct"] < 0.01).all(), agree
    bench_model = json.loads(model.read_text())
    for op in ("all_reduce", "broadcast"):
        mine, theirs = fit["ops"][op]["float"], bench_model["ops"][op]["float"]
        assert [(p["min_bytes"], p["max_bytes"]) for p in mine] == [(p["min_bytes"], p["max_bytes"]) for p in theirs]
        for p, q in zip(mine, theirs):
            assert p["alpha_s"] == pytest.approx(q["alpha_s"], rel=1e-6, abs=1e-12)


def test_model_of_a_training_run_and_mixing_is_refused(tmp_path):
    from helpers import TINY

    out = str(tmp_path / "rec")
    # small buckets: DDP's all_reduces come in several sizes
    proc = run(commprof_cmd("record", "-o", out, "--nproc", "2", "--", "python", TINY, "--steps", "6",
                            "--hidden", "512", "--layers", "4", "--bucket-mb", "0.5"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = run(commprof_cmd("model", out, "--format", "json"))
    assert m.returncode == 0, m.stderr
    doc = json.loads(m.stdout)
    rows = [r for r in doc["tables"]["model"] if r["op"] == "all_reduce"]
    assert rows and all(r["points"] >= 2 and r["alpha_us"] >= 0 for r in rows), rows
    # a short CPU run's bucket times may not grow with size (queued asynchronous calls): then the
    # model says beta is not resolved rather than showing a bandwidth it did not measure
    unresolved = [r for r in rows if r["beta_GBps"] is None]
    assert all(r["beta_GBps"] > 0 for r in rows if r not in unresolved), rows
    if unresolved:
        assert any("all_reduce" in n and "beta not resolved" in n for n in doc["notes"]), doc["notes"]
    b = tmp_path / "bt"     # the README's bench command, one collective and small sizes
    words = documented_scaled("README.md", "bench -o bench --nproc 2", "one collective, sizes of a check",
                              outputs={"bench": b}, add=["--ops", "all_reduce", "--max-bytes", "1K", "--iters", "2",
                                                         "--warmup", "1"])
    assert run(commprof_cmd(*words), timeout=300).returncode == 0
    mixed = run(commprof_cmd("report", out, str(b)))
    assert mixed.returncode == 2 and "reported on their own" in mixed.stderr


def test_pairs_bench_writes_a_trace_that_reports_the_same_pairs(tmp_path):
    """`commprof bench --pairs -o DIR`: every exchange is an event of a
    commprof trace (the round its step, the iteration its seq); `commprof
    report DIR` rebuilds the same pairs as the JSON's samples give."""
    import json

    import commprof
    from commprof.analyzers.report import pairs_report

    out, js, html = tmp_path / "pairs", tmp_path / "pairs.json", tmp_path / "pairs.html"
    # the bench guide's pairs command at 3 ranks (every rank idle in one round), small sizes, a trace too
    words = documented_scaled("docs/bench.md", "--pairs --nproc 4", "3 ranks, sizes of a check, a trace",
                              values={"--nproc": 3}, outputs={"pairs.json": js, "pairs.html": html},
                              add=["--iters", "3", "--warmup", "1", "--pairs-bytes", "1M", "-o", out])
    proc = run(commprof_cmd(*words), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "<svg" in html.read_text() or "<table" in html.read_text()
    t = commprof.load(str(out))
    assert t.meta["source"] == "bench" and t.meta["bench_mode"] == "pairs"
    ev = t.events()
    # 3 ranks: 3 rounds, one rank idle in each; per pair 3 bandwidth and 6 latency exchanges, on both sides
    assert sorted(set(ev["step"])) == [0, 1, 2] and len(ev) == 3 * (3 + 6) * 2
    from_trace = t.report().tables["pairs"].frame.set_index(["a", "b"])
    from_json = pairs_report(json.loads(js.read_text())).tables["pairs"].frame.set_index(["a", "b"])
    assert list(from_trace.index) == list(from_json.index) == [(0, 1), (0, 2), (1, 2)]
    # the same clock readings, through the trace and through the JSON
    ratio = from_trace["bw_GBps"] / from_json["bw_GBps"]
    assert ratio.between(0.97, 1.03).all(), (from_trace, from_json)
    proc = run(commprof_cmd("report", str(out)))
    assert proc.returncode == 0 and "Every pair measured" in proc.stdout, proc.stderr


def test_a_launcher_per_node_on_one_host(tmp_path):
    """Two `commprof bench` around one torchrun each (--nnodes 2, a node
    rank each), on one host: both exit 0; the one holding rank 0 prints
    the table and writes the JSON, the other names rank 0's host and
    writes nothing."""
    import socket
    import subprocess

    from helpers import venv_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for k in range(2):
        cmd = commprof_cmd("bench", "--ops", "all_reduce", "--max-bytes", "4K", "--iters", "2", "--warmup", "1",
                           "--json", str(tmp_path / f"b{k}.json"), "--", "torchrun", "--nnodes", "2", "--node-rank",
                           str(k), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port))
        procs.append(subprocess.Popen(cmd, env=venv_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    (out0, _), (out1, err1) = outs
    assert "Out of bounds values : 0 OK" in out0 and json.loads((tmp_path / "b0.json").read_text())["world_size"] == 2
    assert out1 == "" and not (tmp_path / "b1.json").exists()
    host = socket.gethostname()
    assert err1.strip().splitlines()[-1] == (
        f"commprof: bench: this node ({host}) ran ranks of a 2-rank benchmark on 1 node; rank 0 ran on {host}, "
        f"whose commprof bench prints the report and writes {tmp_path / 'b1.json'} there")
