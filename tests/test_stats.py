"""stats.py against hand-computed values (and SciPy, where it is installed, as a second opinion)."""

import math

import numpy as np
import pytest

from nexus_cli.lab import stats


def test_wilson_hand_computed():
    # 89/100, z = 1.96: center = (0.89 + 1.92/200)/(1.0384) ; the paper's Table IV reports [81.4, 93.7]
    iv = stats.wilson(89, 100)
    assert iv.value == pytest.approx(0.89)
    assert iv.lo == pytest.approx(0.8138, abs=5e-4)
    assert iv.hi == pytest.approx(0.9374, abs=5e-4)
    # 26/30 -> the paper's [70.3, 94.7]
    iv = stats.wilson(26, 30)
    assert (round(iv.lo * 100, 1), round(iv.hi * 100, 1)) == (70.3, 94.7)
    # 40/50 -> [67.0, 88.8]
    iv = stats.wilson(40, 50)
    assert (round(iv.lo * 100, 1), round(iv.hi * 100, 1)) == (67.0, 88.8)


def test_wilson_boundaries():
    iv = stats.wilson(40, 40)  # the paper's ">= 91.2" for 40/40
    assert iv.hi == 1.0 and round(iv.lo * 100, 1) == 91.2
    iv = stats.wilson(30, 30)
    assert round(iv.lo * 100, 1) == 88.6
    iv = stats.wilson(0, 10)
    assert iv.lo == 0.0 and iv.value == 0.0 and iv.hi == pytest.approx(0.2775, abs=1e-4)
    iv = stats.wilson(0, 0)
    assert math.isnan(iv.value) and (iv.lo, iv.hi) == (0.0, 1.0)
    with pytest.raises(ValueError):
        stats.wilson(3, 2)


def test_bootstrap_median_ci_is_seeded_and_brackets():
    x = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 100.0]
    a = stats.median_ci(x, n_boot=4000, seed=7)
    b = stats.median_ci(x, n_boot=4000, seed=7)
    assert a == b
    assert a.value == 13.5
    assert a.lo <= 13.5 <= a.hi
    assert 10.0 <= a.lo and a.hi <= 100.0
    # the bootstrap median of n=8 can only land on sample values or midpoints of two of them
    assert a.lo in {10, 10.5, 11, 11.5, 12, 12.5, 13, 13.5}
    one = stats.median_ci([5.0])
    assert (one.value, one.lo, one.hi) == (5.0, 5.0, 5.0)
    const = stats.median_ci([2.0] * 9)
    assert (const.lo, const.hi) == (2.0, 2.0)


def test_bootstrap_median_ci_hand_case():
    # n = 2: each resample is (a,a), (a,b), (b,a), (b,b) -> medians a, (a+b)/2, (a+b)/2, b with prob 1/4, 1/2, 1/4.
    ci = stats.median_ci([1.0, 3.0], n_boot=20000, seed=1)
    assert ci.value == 2.0 and ci.lo == 1.0 and ci.hi == 3.0


def test_speedup_ci():
    rng = np.random.default_rng(0)
    base = 100 + rng.normal(0, 1, 15)
    cand = 50 + rng.normal(0, 1, 15)
    s = stats.speedup_ci(base, cand, n_boot=2000, seed=3)
    assert s.value == pytest.approx(np.median(base) / np.median(cand))
    assert s.lo < s.value < s.hi
    assert 1.9 < s.lo and s.hi < 2.1
    # the ratio-of-resamples interval sits inside the conservative bounds
    assert s.bounds_lo <= s.lo + 1e-12 and s.hi <= s.bounds_hi + 1e-12
    # constant samples: a degenerate interval at the exact ratio
    s = stats.speedup_ci([30.0] * 5, [10.0] * 5)
    assert (s.value, s.lo, s.hi) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        stats.speedup_ci([1.0], [0.0])


def test_spearman_hand_computed():
    # no ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)); x ranks 1..5, y ranks 2,1,4,3,5 -> d^2 = 1+1+1+1+0 = 4
    assert stats.spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50]) == pytest.approx(1 - 6 * 4 / (5 * 24))
    assert stats.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties: average ranks
    assert list(stats.rankdata([10, 20, 20, 30])) == [1.0, 2.5, 2.5, 4.0]
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))


def test_spearman_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    x = rng.integers(0, 6, 40).astype(float)  # many ties
    y = x + rng.normal(0, 2, 40)
    assert stats.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)


def test_kl_divergence():
    """The KL every fidelity figure uses (adapters.llama.kl_divergence), against its closed form."""
    from nexus_cli.adapters.llama import kl_divergence

    p = np.log(np.array([0.5, 0.5]))
    q = np.log(np.array([0.25, 0.75]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_divergence(p, q) == pytest.approx(expected)
    assert kl_divergence(p + 7.0, q - 3.0) == pytest.approx(expected)  # shift-invariant in logits
    assert kl_divergence(q, q) == 0.0


def test_percentile():
    assert stats.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)


def test_sign_test_hand_computed():
    # n = 6 discordant pairs, 5 against 1: P(X <= 1) = (1 + 6) / 64, two-sided 14 / 64
    assert stats.sign_test(5, 1) == pytest.approx(14 / 64)
    assert stats.sign_test(1, 5) == stats.sign_test(5, 1)
    assert stats.sign_test(3, 3) == 1.0 and stats.sign_test(0, 0) == 1.0  # capped at 1; no pairs, no evidence
    assert stats.sign_test(11, 1) == pytest.approx(2 * 13 / 4096)
