// Summary statistics of a set of timing samples. Formulas and the median's confidence interval
// are written down in docs/METHODOLOGY.md.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace ab::measure {

struct Summary {
  std::size_t count = 0;
  double min = 0, max = 0, mean = 0, median = 0, p90 = 0, p99 = 0;
  double q1 = 0, q3 = 0, iqr = 0, stddev = 0;
  // Half-width of the distribution-free 95% confidence interval of the median, over the median.
  double rel_spread = 0;
};

// Percentile p in [0, 100] of sorted data, linear interpolation between closest ranks
// (Hyndman & Fan type 7, the default of NumPy and R).
double percentile_sorted(std::span<const double> sorted, double p);

// The order-statistic ranks (0-based, inclusive) bounding a 95% confidence interval of the
// median of n samples, from the normal approximation to Binomial(n, 1/2).
struct RankInterval {
  std::size_t lo = 0, hi = 0;
};
RankInterval median_ci_ranks(std::size_t n);

Summary summarize(std::span<const double> samples);

}  // namespace ab::measure
