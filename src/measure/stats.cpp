#include "measure/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ab::measure {

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

RankInterval median_ci_ranks(std::size_t n) {
  if (n == 0) return {};
  // Ranks n/2 -+ 1.96 sqrt(n)/2 (1-based), clamped to the sample.
  const double half_width = 1.959964 * std::sqrt(static_cast<double>(n)) / 2.0;
  const double centre = static_cast<double>(n) / 2.0;
  const auto lo1 = static_cast<long long>(std::floor(centre - half_width));
  const auto hi1 = static_cast<long long>(std::ceil(centre + half_width)) + 1;
  const auto last = static_cast<long long>(n) - 1;
  return {static_cast<std::size_t>(std::clamp(lo1 - 1, 0LL, last)),
          static_cast<std::size_t>(std::clamp(hi1 - 1, 0LL, last))};
}

Summary summarize(std::span<const double> samples) {
  Summary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  s.min = sorted.front();
  s.max = sorted.back();
  s.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(sorted.size());
  s.median = percentile_sorted(sorted, 50);
  s.p90 = percentile_sorted(sorted, 90);
  s.p99 = percentile_sorted(sorted, 99);
  s.q1 = percentile_sorted(sorted, 25);
  s.q3 = percentile_sorted(sorted, 75);
  s.iqr = s.q3 - s.q1;
  if (sorted.size() > 1) {
    double sq = 0;
    for (double v : sorted) sq += (v - s.mean) * (v - s.mean);
    s.stddev = std::sqrt(sq / static_cast<double>(sorted.size() - 1));
  }
  const RankInterval ci = median_ci_ranks(sorted.size());
  s.rel_spread = s.median > 0 ? (sorted[ci.hi] - sorted[ci.lo]) / (2.0 * s.median) : 0.0;
  return s;
}

}  // namespace ab::measure
