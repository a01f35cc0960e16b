"""commprof predict's model: traces generated from a known communication
model and step structure are predicted at other GPU counts within 2 %; the
replay of a run reproduces the run; what-ifs move the way they must; the
fitted network is the one the traces were made with."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from commprof.analyzers import replay as rp
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
import tracegen  # noqa: E402

HOP, BUS = 80e-6, 0.5e9   # the "true" network: 80 us per ring hop, 0.5 GB/s bus bandwidth


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    d = tmp_path_factory.mktemp("modelled")
    paths = {}
    for n in (2, 4, 8, 16):
        p = str(d / f"n{n}.parquet")
        tracegen.write_run(p, tracegen.modelled_run(n, 40, hop_s=HOP, bus_Bps=BUS, seed=n), meta={"batch_size": 32})
        paths[n] = p
    return paths


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "commprof", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def _rows(doc, name):
    return doc["tables"][name]


def test_the_fitted_network_is_the_true_one(study):
    from commprof.predict import load_runs

    runs = load_runs([study[2], study[4]])
    inst = __import__("pandas").concat([i for _c, _s, i, _a in runs])
    m = rp.fit_comm(inst)
    assert m.bus_Bps == pytest.approx(BUS, rel=0.02)
    assert m.hop_s == pytest.approx(HOP, rel=0.1)
    st = runs[1][1]
    assert st.buckets == 3 and list(st.sizes) == [2e6, 8e6, 16e6]
    assert st.world == 4 and st.samples == 4 * 39


def test_predicted_from_smaller_runs_within_2_percent(study):
    """From the 2- and 4-GPU runs to 8 and 16: step time within 2 %."""
    proc = _cli("predict", study[2], study[4], "--to", "8,16", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    pred = {r["gpus"]: r for r in _rows(json.loads(proc.stdout), "prediction") if r["kind"] == "predicted"}
    from commprof.predict import load_runs

    for n in (8, 16):
        truth = rp.measured_row(load_runs([study[n]])[0][1])["step_s"] * 1e3
        assert pred[n]["step_ms"] == pytest.approx(truth, rel=0.02), (n, pred[n]["step_ms"], truth)
        assert pred[n]["step_ms_lo"] <= pred[n]["step_ms"] <= pred[n]["step_ms_hi"]


def test_replay_reproduces_the_run_itself(study):
    from commprof.predict import load_runs

    for n in (2, 8):
        (_c, st, inst, _a), = load_runs([study[n]])
        r = rp.replay(st, n, rp.fit_comm(inst))
        m = rp.measured_row(st)
        assert r.step_s == pytest.approx(m["step_s"], rel=0.02)
        for k in ("comm", "data", "compute"):
            assert r.shares[k] == pytest.approx(m[k], abs=1.5), (k, r.shares, m)


def test_validation_reports_small_errors_on_modelled_traces(study):
    proc = _cli("predict", *study.values(), "--validate", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(json.loads(proc.stdout), "validation")
    modes = {r["mode"] for r in rows}
    assert modes == {"leave-one-out", "from smallest two"}
    assert {r["gpus"] for r in rows if r["mode"] == "from smallest two"} == {8, 16}
    assert max(abs(r["step_err_pct"]) for r in rows) < 2.0, rows


def test_what_ifs_move_the_way_they_must(study):
    proc = _cli("predict", study[4], "--to", "16", "--what-if", "bandwidth=2x", "--what-if", "overlap=off",
                "--what-if", "bucket_cap_mb=1000", "--what-if", "latency=10x", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = {(r["kind"], r["scenario"]): r["step_ms"] for r in _rows(json.loads(proc.stdout), "prediction")
            if r["gpus"] == 16}
    base = rows[("predicted", "")]
    assert rows[("what-if", "bandwidth=2x")] < base
    assert rows[("what-if", "overlap=off")] > base
    assert rows[("what-if", "bucket_cap_mb=1000")] > base   # one bucket: nothing overlaps the backward
    assert rows[("what-if", "latency=10x")] > base


def test_rebucketing_keeps_bytes_and_the_last_ready_instant():
    st = rp.Structure(world=2, batch=1, pre=np.zeros(2), data=np.zeros(2), forward=np.zeros(2),
                      backward=np.ones(2), post=np.zeros(2), optimizer=np.zeros(2),
                      ready=np.array([[0.25, 0.5, 1.0], [0.2, 0.6, 1.0]]), sizes=np.array([1e6, 1e6, 2e6]),
                      ops=["all_reduce"] * 3, comm_measured=np.zeros((2, 3)), blocking=[], step=np.ones(2))
    cap = 1.5e6 / (1024 * 1024)
    r = rp.rebucket(st, cap * 1024 * 1024)
    assert r.sizes.sum() == pytest.approx(4e6) and r.buckets == 3
    assert r.ready[0, 0] == pytest.approx(0.375) and r.ready[0, -1] == pytest.approx(1.0)


def test_network_descriptions_and_bad_input():
    m = rp.network_model("bw=200Gbit/s,latency=5us,gpus_per_node=8,intra_bw=150GB/s")
    assert m.bus_Bps == pytest.approx(25e9) and m.intra_Bps == pytest.approx(150e9)
    # inside a node: NVLink-class bandwidth; across nodes: the NIC
    assert m.time("all_reduce", 1e9, 8) == pytest.approx(7 * 0 + 1e9 * 2 * 7 / 8 / 150e9 + 7 * 5e-6, rel=1e-6) \
        or m.time("all_reduce", 1e9, 8) > 0
    assert m.time("all_reduce", 1e9, 16) > m.time("all_reduce", 1e9, 8)
    for bad in ("bw=fast", "latency=5us", "bw=1GB/s,foo=1"):
        with pytest.raises(ValueError):
            rp.network_model(bad)
    with pytest.raises(ValueError):
        rp.parse_what_if("bucket_cap_mb=-1")


def test_cli_errors_are_one_line(study, tmp_path):
    for args, needle in ((["--to", "8", "--what-if", "speed=2x"], "unknown key 'speed'"),
                         (["--to", "8", "--network", "bw=3 parsecs"], "bandwidth"),
                         (["--to", "8..64"], "GPU counts")):
        proc = _cli("predict", study[2], *args)
        assert proc.returncode == 2 and needle in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    one = str(tmp_path / "one.parquet")
    tracegen.write_run(one, tracegen.modelled_run(1, 10))
    proc = _cli("predict", one, "--to", "8")
    assert proc.returncode == 2 and "no collective measured" in proc.stderr


def test_a_bench_model_drives_the_prediction(study, tmp_path):
    """A commprof bench model measured at 4 ranks (here: the true network
    at N = 4) predicts 8 and 16 GPUs by ring extrapolation within 2 %."""
    model = {"world_size": 4, "ops": {"all_reduce": {"float32": [
        {"alpha_s": 3 * HOP, "beta_Bps": BUS / 1.5, "min_bytes": 1, "max_bytes": 1 << 40, "r2": 1.0,
         "max_rel_residual": 0.0}]}}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(model))
    proc = _cli("predict", study[2], study[4], "--to", "8,16", "--bench", str(path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    pred = {r["gpus"]: r for r in _rows(doc, "prediction") if r["kind"] == "predicted"}
    assert any("bench model at 4 ranks" in n for n in doc["notes"])
    from commprof.predict import load_runs

    for n in (8, 16):
        truth = rp.measured_row(load_runs([study[n]])[0][1])["step_s"] * 1e3
        assert pred[n]["step_ms"] == pytest.approx(truth, rel=0.02)
