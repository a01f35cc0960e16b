"""The alpha-beta fit recovers known parameters."""
import numpy as np
import pytest

from commprof.analyzers.alphabeta import fit, fit_line, predict

SIZES = [2 ** k for k in range(3, 28)]


def test_recovers_alpha_and_beta_exactly():
    alpha, beta = 25e-6, 12e9
    t = [alpha + s / beta for s in SIZES]
    (p,) = fit(SIZES, t)
    assert p["alpha_s"] == pytest.approx(alpha, rel=1e-9) and p["beta_Bps"] == pytest.approx(beta, rel=1e-9)
    assert p["r2"] == pytest.approx(1.0) and p["max_rel_residual"] < 1e-9


def test_recovers_within_two_percent_under_noise():
    rng = np.random.default_rng(3)
    alpha, beta = 40e-6, 2.5e9
    t = [(alpha + s / beta) * (1 + rng.normal(0, 0.01)) for s in SIZES]
    p = fit_line(SIZES, t)
    assert p["alpha_s"] == pytest.approx(alpha, rel=0.02) and p["beta_Bps"] == pytest.approx(beta, rel=0.02)


def test_two_protocols_are_split_at_the_switch():
    # latency-bound protocol below 64 KiB, bandwidth-bound above
    t = [(5e-6 + s / 1e9) if s < 65536 else (60e-6 + s / 20e9) for s in SIZES]
    pieces = fit(SIZES, t)
    assert len(pieces) == 2
    lo, hi = pieces
    assert lo["max_bytes"] < 65536 <= hi["min_bytes"]
    assert hi["beta_Bps"] == pytest.approx(20e9, rel=1e-6) and lo["alpha_s"] == pytest.approx(5e-6, rel=1e-6)
    assert predict(pieces, 1 << 26) == pytest.approx(60e-6 + (1 << 26) / 20e9, rel=1e-9)
    assert predict(pieces, 1024) == pytest.approx(5e-6 + 1024 / 1e9, rel=1e-9)


def test_needs_two_sizes():
    with pytest.raises(ValueError):
        fit_line([8], [1e-5])


def test_parameters_stay_physical_on_noisy_data():
    # a negative intercept is what the unconstrained line through these points wants
    sizes = [1e3, 1e6, 1e7]
    t = [1e-6, 1.2e-3, 9e-3]
    p = fit_line(sizes, t)
    assert p["alpha_s"] >= 0 and p["beta_Bps"] > 0
    flat = fit_line([8, 16, 32, 64], [10e-6, 9e-6, 10e-6, 9.5e-6])  # latency only
    assert flat["alpha_s"] > 0 and flat["beta_Bps"] > 0


def test_a_trace_whose_times_do_not_grow_with_size_states_beta_unresolved():
    """Collectives of a run where larger messages are no slower (queued
    asynchronous buckets): the model keeps alpha and says beta is not resolved
    in its note instead of showing a bandwidth it did not measure."""
    import pandas as pd

    from commprof.analyzers.model import fit_trace

    rows = []
    for seq, (size, us) in enumerate([(1 << 16, 900), (1 << 18, 850), (1 << 20, 800), (1 << 22, 700)]):
        for rank in (0, 1):
            rows.append({"name": "all_reduce", "rank": rank, "seq": seq, "group": "0", "group_size": 2,
                         "bytes": size, "dtype": "torch.float32", "blocking": False, "detail": "",
                         "t_start": 1_000_000 * seq, "t_end": 1_000_000 * seq + us * 1000})
    m = fit_trace(pd.DataFrame(rows))
    (piece,) = m["pieces"]
    assert piece["beta_GBps"] == float("inf") and piece["alpha_us"] > 0
    assert "all_reduce (float, 2 ranks, intra-node)" in m["note"] and "beta not resolved" in m["note"]
