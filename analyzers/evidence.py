"""The statistics behind every finding: each rule's statistic, its null
hypothesis and its threshold, in one place.

A finding that names a rank or a node ("rank 3 is a straggler") is a claim
that one member of a group differs from the others; with N exchangeable
ranks one of them is always the slowest, the last ready, the last to
arrive. So each such rule is a test against chance, corrected for having
looked at every rank, and the rules of one run share one false-accusation
budget: ``FAMILY_ALPHA`` (5 %) split evenly over the ``ACCUSING_RULES``
(Bonferroni), each of them Bonferroni-corrected over the ranks or hosts it
tests. On data with no straggler the chance that a report accuses anybody
is therefore at most 5 %.

A share finding ("communication-bound") compares a time-weighted share
with its threshold and carries the share's 95 % interval over steps; a
share whose interval straddles the threshold is said to be near it.

The tests (pure functions, no SciPy):

- ``binomial_test``: k of n trials against a per-trial chance p0 (exact
  upper tail);
- the sign test (``stragglers.sign_tests``, vectorised over ranks or
  hosts, on ``binomial_sf`` and ``median_rank`` here): paired per-step
  excesses over the median of the other ranks, positive in k of n steps
  against 1/2, with the distribution-free 95 % interval of the median
  excess (``median_interval``: order statistics);
- ``ratio_interval``: a time-weighted share over steps with its 95 %
  interval (linearised ratio estimator, normal quantile).

``RULES`` lists every rule with its statistic, null and threshold;
``rules_markdown()`` renders it for the docs (docs/findings.md is that
text, kept equal by a test).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import List, Optional, Sequence, Tuple

import numpy as np

#: the chance that one run's report accuses a rank or host of a data set
#: that has no straggler, over all accusing rules together
FAMILY_ALPHA = 0.05
#: rules that name a rank or a host: critical-path gate, straggler in
#: work, data and step time, late arrival, slow node
ACCUSING_RULES = 6
#: each accusing rule's share of the family's budget (Bonferroni)
RULE_ALPHA = FAMILY_ALPHA / ACCUSING_RULES
#: an effect smaller than this is not reported even when significant: the
#: larger of this many ms and this share of the other ranks' median value
MIN_EFFECT_MS, MIN_EFFECT_REL = 0.25, 0.02
#: normal quantile of a two-sided 95 % interval
Z95 = 1.959963984540054


@lru_cache(maxsize=8)
def _log_choose(n: int) -> np.ndarray:
    """log C(n, k) for k = 0..n (cumulative sums of logs: no gamma calls).
    Kept for the last few n (read-only): a run's sign tests ask for the
    same n once per rank and metric (100 M events: 384 times n = 71,022)."""
    k = np.arange(1, n + 1, dtype=np.float64)
    out = np.concatenate([[0.0], np.cumsum(np.log(n - k + 1.0) - np.log(k))])
    out.setflags(write=False)
    return out


def _log_pmf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    return _log_choose(n)[k.astype(np.int64)] + k * math.log(p) + (n - k) * math.log1p(-p)


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exact."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp = _log_pmf(np.arange(k, n + 1, dtype=np.float64), n, p)
    m = float(lp.max())
    return float(min(1.0, math.exp(m) * np.exp(lp - m).sum()))


@lru_cache(maxsize=256)
def median_rank(n: int) -> int:
    """The largest j <= n // 2 with P(Binomial(n, 1/2) < j) <= 2.5 %."""
    cdf = np.cumsum(np.exp(_log_pmf(np.arange(n + 1, dtype=np.float64), n, 0.5)))
    ok = np.nonzero(cdf[: n // 2] <= 0.025)[0]   # cdf[j - 1] = P(X < j)
    return int(ok[-1] + 1) if len(ok) else 0


def bonferroni(p: float, m: int) -> float:
    return float(min(1.0, p * max(1, m)))


def min_trials(p0: float, members: int, alpha: float = RULE_ALPHA) -> int:
    """The fewest trials in which even a member that "wins" every one of
    them would be significant after correcting over ``members``: below this
    a rule cannot accuse anybody, whatever the data."""
    if not 0.0 < p0 < 1.0:
        return 1
    return max(1, math.ceil(math.log(alpha / max(1, members)) / math.log(p0) - 1e-12))


@dataclass(frozen=True)
class Binomial:
    k: int
    n: int
    p0: float
    members: int
    p: float          # corrected (Bonferroni over members)
    alpha: float

    @property
    def significant(self) -> bool:
        return self.n >= self.needed and self.p < self.alpha

    @property
    def needed(self) -> int:
        return min_trials(self.p0, self.members, self.alpha)

    def text(self, what: str = "steps") -> str:
        return (f"{self.k} of {self.n} {what} (chance {100 * self.p0:.0f} % each for {self.members}; "
                f"p = {format_p(self.p)} corrected over {self.members})")


def binomial_test(k: int, n: int, p0: float, members: int, alpha: float = RULE_ALPHA) -> Binomial:
    """Is k of n more than chance p0 gives, having looked at ``members``
    candidates? One-sided exact test, Bonferroni-corrected."""
    return Binomial(int(k), int(n), float(p0), int(members),
                    bonferroni(binomial_sf(int(k), int(n), float(p0)), members), alpha)


def median_interval(x: np.ndarray) -> Tuple[float, float]:
    """Distribution-free 95 % interval of the median of x (order
    statistics: the widest j with P(Binomial(n, 1/2) < j) <= 2.5 %)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = len(x)
    if n == 0:
        return (float("nan"), float("nan"))
    j = median_rank(n)
    if j == 0:
        return (float(x[0]), float(x[-1]))
    return (float(x[j - 1]), float(x[n - j]))


def ratio_interval(num: Sequence[float], den: Sequence[float]) -> Tuple[float, float, float, int]:
    """A time-weighted share sum(num) / sum(den) over steps, in percent,
    with its 95 % interval (linearised ratio estimator): (share, lo, hi, n)."""
    a = np.asarray(num, dtype=np.float64)
    b = np.asarray(den, dtype=np.float64)
    n = len(a)
    if n == 0 or b.sum() <= 0:
        return (float("nan"), float("nan"), float("nan"), n)
    r = float(a.sum() / b.sum())
    if n < 2:
        return (100 * r, float("nan"), float("nan"), n)
    e = a - r * b
    se = math.sqrt(float((e ** 2).sum()) / (n * (n - 1))) / float(b.mean())
    return (100 * r, 100 * (r - Z95 * se), 100 * (r + Z95 * se), n)


def format_p(p: float) -> str:
    if p != p:
        return "n/a"
    if p < 1e-4:
        return "< 0.0001"
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def min_effect_ms(median_ms: float) -> float:
    return max(MIN_EFFECT_MS, MIN_EFFECT_REL * abs(median_ms)) if median_ms == median_ms else MIN_EFFECT_MS


def share_claim(share: float, lo: float, hi: float, threshold: float) -> Optional[str]:
    """"above" when the whole interval is at or over the threshold, "near"
    when the share is over it but the interval reaches below, None below."""
    if share != share or share < threshold:
        return None
    return "above" if lo == lo and lo >= threshold else "near"


@dataclass(frozen=True)
class Rule:
    finding: str
    statistic: str
    null: str
    threshold: str


def _alpha() -> str:
    return (f"corrected p < {RULE_ALPHA:.4f} ({100 * FAMILY_ALPHA:.0f} % over {ACCUSING_RULES} accusing rules, "
            "Bonferroni)")


def _effect() -> str:
    return (f"and a median excess of at least {MIN_EFFECT_MS} ms and {100 * MIN_EFFECT_REL:.0f} % of the "
            "other ranks' median")


RULES: List[Rule] = [
    Rule("critical path: rank r is the last ready",
         "k of n measured steps in which rank r's bucket (or backward) was the last one ready",
         "every rank is last with chance 1/N per step; one-sided exact binomial test, Bonferroni over the N ranks",
         f"{_alpha()} and a median margin over the next-latest rank of at least {MIN_EFFECT_MS} ms and "
         f"{100 * MIN_EFFECT_REL:.0f} % of the median step"),
    Rule("straggler: rank r (work | data | step)",
         "per step, rank r's value minus the median of the other ranks (work = step time minus exposed communication); "
         "k of n steps positive, median excess with its distribution-free 95 % interval",
         "exceeding the others' median is a fair coin (sign test), Bonferroni over the N ranks",
         f"{_alpha()} {_effect()}"),
    Rule("straggler: rank r (arrival)",
         "per step (the collectives of a step taken as one block), the rank that arrived last most often; "
         "k of n blocks, and its mean lateness behind the earliest rank vs the other ranks' median",
         "every rank arrives last with chance 1/N per block; exact binomial, Bonferroni over the N ranks",
         f"{_alpha()} and a mean lateness over the other ranks' median of at least {MIN_EFFECT_MS} ms and "
         f"{100 * MIN_EFFECT_REL:.0f} % of the median step"),
    Rule("slow node in compute: host h",
         "per step, the mean work of h's ranks minus the median of the other hosts; sign test as for ranks",
         "exceeding the other hosts' median is a fair coin, Bonferroni over the hosts",
         f"{_alpha()} {_effect().replace('rank', 'host')}"),
    Rule("slow node in communication: host h / slow link: h <-> g",
         "per inter-node group of a class (op, size within x2), its instances' transfer bus bandwidth: the "
         "duration of the last rank to arrive, which waits for nobody; median and upper quartile",
         "none (an effect size, as `commprof bench --pairs`): not tested against chance",
         "a host: more than half of its groups (>= 2) with an upper quartile below 60 % of the median of the groups "
         "without it; a link: a group of normal hosts below 60 % of the normal groups' median; a class needs >= 3 "
         "groups over different host sets, a group >= 3 instances every rank recorded"),
    Rule("data loading stalls training / communication-bound / compute-bound / time outside recorded regions",
         "time-weighted share of step time over all ranks and steps, with its 95 % interval over steps "
         "(linearised ratio estimator)",
         "none (a share, not a comparison): the finding says 'near the threshold' when the interval reaches below it",
         "data wait >= 10 %, exposed comm >= 20 %, compute >= 60 %, other >= 20 %"),
    Rule("many small collectives / communication is not hidden / ranks wait for late peers",
         "collectives per step and mean size; overlap share; arrival-skew share of collective time",
         "none (descriptive, under a communication-bound finding)",
         ">= 8 calls per step under 1 MiB; overlap < 50 %; skew > 30 %"),
    Rule("a broadcast every step",
         "broadcasts per step times their transfer time after all ranks arrived, as a share of the median step",
         "none (a cost)", ">= 2 % of the median step"),
    Rule("collective mismatch",
         "collective instances (group, seq) whose op, size, dtype or issuer differ across ranks",
         "none: one such instance is a fact, not a sample", ">= 1 instance"),
]


def rules_markdown() -> str:
    """The rules as a Markdown table (docs/findings.md)."""
    lines = ["| finding | statistic | null hypothesis | reported when |", "|---|---|---|---|"]
    for r in RULES:
        lines.append(f"| {r.finding} | {r.statistic} | {r.null} | {r.threshold} |")
    return "\n".join(lines) + "\n"
