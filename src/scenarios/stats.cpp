// The statistics a scenario's verdict rests on: LoadGen's percentile, the binomial tail behind
// early stopping, and the Poisson arrival schedule. Sources: docs/METHODOLOGY.md.
#include <algorithm>
#include <cmath>
#include <limits>

#include "scenarios/scenarios.h"

namespace ab::scenarios {
namespace {

// log(exp(a) + exp(b)) without overflow.
double log_add(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double hi = std::max(a, b), lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

}  // namespace

double percentile_loadgen(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0.0;
  const auto n = sorted.size();
  const auto index = static_cast<std::size_t>(static_cast<double>(n) * std::clamp(p, 0.0, 1.0));
  return sorted[std::min(index, n - 1)];
}

double binomial_cdf(std::uint64_t t, std::uint64_t n, double q) {
  if (t >= n || q <= 0.0) return 1.0;
  if (q >= 1.0) return 0.0;
  // pmf(k+1) = pmf(k) (n-k)/(k+1) q/(1-q), from pmf(0) = (1-q)^n; in logs so (1-q)^n cannot underflow.
  const double nd = static_cast<double>(n);
  const double log_ratio = std::log(q) - std::log1p(-q);
  double log_pmf = nd * std::log1p(-q);
  double log_cdf = -std::numeric_limits<double>::infinity();
  for (std::uint64_t k = 0;; ++k) {
    log_cdf = log_add(log_cdf, log_pmf);
    if (k == t) break;
    const double kd = static_cast<double>(k);
    log_pmf += std::log(nd - kd) - std::log(kd + 1.0) + log_ratio;
  }
  return std::min(1.0, std::exp(log_cdf));
}

std::uint64_t early_stopping_overlatency(std::uint64_t n, double p, double c) {
  if (n == 0) return 0;
  const double q = 1.0 - p, limit = 1.0 - c, nd = static_cast<double>(n);
  const double log_ratio = std::log(q) - std::log1p(-q), log_limit = std::log(limit);
  double log_pmf = nd * std::log1p(-q);
  double log_cdf = -std::numeric_limits<double>::infinity();
  // The CDF grows with t: walk it until it reaches 1 - c; the t before that is the largest that passes.
  for (std::uint64_t k = 0; k < n; ++k) {
    log_cdf = log_add(log_cdf, log_pmf);
    if (!(log_cdf < log_limit)) return k == 0 ? 0 : k - 1;
    const double kd = static_cast<double>(k);
    log_pmf += std::log(nd - kd) - std::log(kd + 1.0) + log_ratio;
  }
  return n - 1;  // only when 1 - c is above every partial sum (c near 0)
}

std::uint64_t early_stopping_queries_needed(std::uint64_t t, double p, double c) {
  const double q = 1.0 - p, limit = 1.0 - c;
  auto passes = [&](std::uint64_t n) { return binomial_cdf(t, n, q) < limit; };
  std::uint64_t lo = t + 1, hi = std::max<std::uint64_t>(2 * (t + 1), 16);  // lo fails or is the answer
  if (passes(lo)) return lo;
  while (!passes(hi)) {
    lo = hi;
    if (hi > (std::uint64_t{1} << 62)) return hi;  // p so close to 1 that no count suffices
    hi *= 2;
  }
  while (hi - lo > 1) {  // invariant: lo fails, hi passes
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (passes(mid) ? hi : lo) = mid;
  }
  return hi;
}

std::uint64_t early_stopping_min_queries(double p, double c) { return early_stopping_queries_needed(1, p, c); }

PoissonSchedule::PoissonSchedule(double qps, std::uint64_t seed) : qps_(qps), rng_(seed) {}

double PoissonSchedule::next_gap_s() {
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // [0, 1)
  return -std::log1p(-u) / qps_;
}

}  // namespace ab::scenarios
