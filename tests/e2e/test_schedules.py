"""The LR schedules produce the documented curves."""
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "workloads"))
from schedules import MILESTONES, lr_at, scaled_lr  # noqa: E402


def test_linear_scaling_rule():
    assert scaled_lr(0.1, 256) == pytest.approx(0.1)
    assert scaled_lr(0.1, 8192) == pytest.approx(3.2)


@pytest.mark.parametrize("schedule", ["step", "cosine", "exponential"])
def test_warmup_is_linear_then_annealing_is_monotone(schedule):
    total, warm, lr = 1000, 50, 2.0
    curve = [lr_at(s, total, lr, schedule, warm) for s in range(total)]
    for s in range(warm):
        assert curve[s] == pytest.approx(lr * (s + 1) / warm)
    assert curve[warm] == pytest.approx(lr)
    after = curve[warm:]
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:]))


def test_documented_values():
    total, warm, lr = 1100, 100, 1.0
    span = total - warm
    # step: x0.1 at 30 %, 60 %, 80 % of the post-warm-up steps
    assert lr_at(warm + int(0.3 * span) - 1, total, lr, "step", warm) == pytest.approx(1.0)
    for k, m in enumerate(MILESTONES, 1):
        assert lr_at(warm + int(m * span), total, lr, "step", warm) == pytest.approx(0.1 ** k)
    # cosine: half way -> lr/2, end -> 0
    assert lr_at(warm + span // 2, total, lr, "cosine", warm) == pytest.approx(0.5)
    assert lr_at(total, total, lr, "cosine", warm) == pytest.approx(0.0, abs=1e-12)
    # exponential: end -> lr * 0.01, half way -> lr * 0.1
    assert lr_at(total, total, lr, "exponential", warm) == pytest.approx(0.01)
    assert lr_at(warm + span // 2, total, lr, "exponential", warm) == pytest.approx(0.1)
    assert math.isclose(lr_at(0, 10, 1.0, "cosine"), 1.0)
    with pytest.raises(ValueError):
        lr_at(0, 10, 1.0, "linear")
