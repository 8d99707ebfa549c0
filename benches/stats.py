"""Small statistics for the benches that compare runs on a noisy machine.

`paired` benches (record_overhead.sh, memtrack_sampled.sh) take one figure
per round, from runs made next to each other, so that the machine's slow
drifts cancel; these helpers summarize those per-round figures.
"""
import math
import statistics


def median_ci(xs, level=0.95):
    """(median, low, high): the median of `xs` and a distribution-free
    confidence interval of it at `level`, from the order statistics whose
    ranks the binomial(n, 1/2) law puts around the middle. Needs no
    assumption on the figures' distribution; with fewer than 6 figures the
    interval is the whole range (it cannot reach 95%)."""
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    tail = (1 - level) / 2
    cdf, k = 0.0, 0
    while k < n:
        cdf += math.comb(n, k) / 2**n
        if cdf > tail:
            break
        k += 1
    # xs[k-1] .. xs[n-k] holds the median with probability >= level.
    lo, hi = max(k - 1, 0), min(n - k, n - 1)
    return statistics.median(xs), xs[lo], xs[hi]


def mean_se(xs):
    """(mean, standard error of the mean) of `xs`."""
    n = len(xs)
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(n) if n > 1 else float("nan"))
