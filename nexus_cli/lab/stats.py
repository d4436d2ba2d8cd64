"""Interval estimates for the measurement suites: Wilson, bootstrap, speedup, Spearman, the sign test.

Every suite reports its headline numbers with a 95 % interval, computed here and nowhere else:

- proportions (routing accuracy, top-1 agreement, JSON validity): the Wilson score interval, which stays inside [0, 1]
  and behaves at p = 0 and p = 1 where the normal approximation collapses to a zero-width interval;
- medians (TTFT and other latencies): the percentile bootstrap, B resamples with replacement from a seeded generator,
  so a results file reproduces its own intervals from its raw samples;
- speedups (median of a baseline over median of the splice path, two independent timing loops): the percentile
  interval of the ratio of the two bootstrap medians. Each of the B rounds resamples *both* sample sets independently
  and takes median(baseline*) / median(splice*); the 2.5th and 97.5th percentiles of those B ratios are the interval.
  This propagates the uncertainty of both medians jointly (it is the bootstrap distribution of the ratio statistic
  itself), and is never wider than the conservative bound baseline_lo/splice_hi .. baseline_hi/splice_lo, which
  `speedup_ci` also returns for reference ("bounds");
- rank correlation: Spearman's rho with average ranks for ties (the Pearson correlation of the ranks);
- paired decisions (requests one variant fixes and another breaks): the two-sided exact sign test.

Only NumPy is needed; SciPy, when installed, is used by the tests as a cross-check, never here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

Z95 = 1.959963984540054  # the 97.5th percentile of the standard normal
DEFAULT_BOOT = 2000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval; `method` says how the interval was made."""

    value: float
    lo: float
    hi: float
    method: str
    n: int

    def as_dict(self) -> dict:
        return asdict(self)

    def fmt(self, digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
        v, lo, hi = self.value * scale, self.lo * scale, self.hi * scale
        return f"{v:.{digits}f}{suffix} [{lo:.{digits}f}, {hi:.{digits}f}]"


def wilson(successes: int, n: int, z: float = Z95) -> Interval:
    """Wilson score interval of a binomial proportion. n = 0 gives the uninformative [0, 1] with value nan."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"wilson: need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return Interval(float("nan"), 0.0, 1.0, "wilson", 0)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = (z / denom) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    lo, hi = max(0.0, center - half), min(1.0, center + half)
    # exact endpoints at the boundaries (floating error otherwise leaves 1e-17 dust)
    if successes == 0:
        lo = 0.0
    if successes == n:
        hi = 1.0
    return Interval(p, lo, hi, "wilson", n)


def _as_array(samples: Sequence[float]) -> np.ndarray:
    a = np.asarray(samples, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError("no samples")
    if not np.all(np.isfinite(a)):
        raise ValueError("samples contain nan or inf")
    return a


def _boot_medians(a: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    return np.median(a[idx], axis=1)


def bootstrap_ci(
    samples: Sequence[float],
    stat: Callable[[np.ndarray], float] = np.median,
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
    alpha: float = 0.05,
    name: str = "median",
) -> Interval:
    """Percentile bootstrap interval of `stat` (median by default) over `samples`, seeded and reproducible.

    With one sample the interval is the point itself (nothing to resample)."""
    a = _as_array(samples)
    value = float(stat(a))
    if a.size == 1:
        return Interval(value, value, value, f"bootstrap-percentile-{name}(B={n_boot},seed={seed})", 1)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    if stat is np.median:
        boots = np.median(a[idx], axis=1)
    elif stat is np.mean:
        boots = np.mean(a[idx], axis=1)
    else:
        boots = np.array([stat(a[row]) for row in idx])
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return Interval(value, float(lo), float(hi), f"bootstrap-percentile-{name}(B={n_boot},seed={seed})", int(a.size))


def median_ci(samples: Sequence[float], n_boot: int = DEFAULT_BOOT, seed: int = DEFAULT_SEED) -> Interval:
    """The median with its percentile-bootstrap 95 % interval."""
    return bootstrap_ci(samples, np.median, n_boot=n_boot, seed=seed, name="median")


def mean_ci(samples: Sequence[float], n_boot: int = DEFAULT_BOOT, seed: int = DEFAULT_SEED) -> Interval:
    """The mean with its percentile-bootstrap 95 % interval (used for KL averaged over queries)."""
    return bootstrap_ci(samples, np.mean, n_boot=n_boot, seed=seed, name="mean")


@dataclass(frozen=True)
class Speedup:
    """median(baseline) / median(candidate) with the bootstrap-ratio interval and the conservative bounds."""

    value: float
    lo: float
    hi: float
    bounds_lo: float  # baseline_ci.lo / candidate_ci.hi
    bounds_hi: float  # baseline_ci.hi / candidate_ci.lo
    baseline: Interval
    candidate: Interval
    method: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["baseline"] = self.baseline.as_dict()
        d["candidate"] = self.candidate.as_dict()
        return d

    def fmt(self, digits: int = 2) -> str:
        return f"{self.value:.{digits}f}x [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def speedup_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    n_boot: int = DEFAULT_BOOT,
    seed: int = DEFAULT_SEED,
    alpha: float = 0.05,
) -> Speedup:
    """Speedup of `candidate` over `baseline` (both timing samples, lower is better) with a 95 % interval.

    value = median(baseline) / median(candidate). Interval: B rounds; each resamples baseline and candidate
    independently (they come from independent timing loops) and records median(baseline*) / median(candidate*);
    the alpha/2 and 1 - alpha/2 percentiles of the B ratios are [lo, hi]. The conservative interval from the two
    medians' own bootstrap CIs (baseline_lo / candidate_hi .. baseline_hi / candidate_lo) is returned alongside."""
    b = _as_array(baseline)
    c = _as_array(candidate)
    if np.any(c <= 0) or np.any(b <= 0):
        raise ValueError("timings must be positive")
    rng = np.random.default_rng(seed)
    mb = _boot_medians(b, n_boot, rng)
    mc = _boot_medians(c, n_boot, rng)
    lo, hi = np.quantile(mb / mc, [alpha / 2, 1 - alpha / 2])
    bci = median_ci(b, n_boot=n_boot, seed=seed)
    cci = median_ci(c, n_boot=n_boot, seed=seed + 1)
    value = float(np.median(b) / np.median(c))
    return Speedup(
        value=value,
        lo=float(lo),
        hi=float(hi),
        bounds_lo=bci.lo / cci.hi,
        bounds_hi=bci.hi / cci.lo,
        baseline=bci,
        candidate=cci,
        method=f"bootstrap ratio of medians, independent resampling (B={n_boot}, seed={seed})",
    )


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (scipy.stats.rankdata's 'average')."""
    a = np.asarray(x, dtype=np.float64).ravel()
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.size, dtype=np.float64)
    sa = a[order]
    i = 0
    while i < a.size:
        j = i
        while j + 1 < a.size and sa[j + 1] == sa[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the average ranks. nan when either side is constant or n < 2."""
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.size != b.size:
        raise ValueError(f"spearman: length mismatch {a.size} != {b.size}")
    if a.size < 2:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    if den == 0.0:
        return float("nan")
    return float(ra @ rb) / den


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation (NumPy's default)."""
    return float(np.percentile(_as_array(samples), q))


def sign_test(fixed: int, broken: int) -> float:
    """Two-sided exact sign test: the p-value of `fixed` against `broken` discordant pairs under p = 1/2 (1.0 when
    there are none)."""
    n, low = fixed + broken, min(fixed, broken)
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(low + 1)) / 2 ** n)
