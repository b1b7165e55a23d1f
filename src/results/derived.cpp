#include "results/derived.h"

namespace ab::results {

bool is_memory_ceiling(std::string_view ceiling_key) { return ceiling_key.rfind("memory.", 0) == 0; }

std::string ceiling_unit(std::string_view ceiling_key, std::string_view ops_unit) {
  if (is_memory_ceiling(ceiling_key)) return "GB/s";
  return ops_unit == "OP" ? "TOP/s" : "TFLOP/s";
}

std::optional<Rates> rates_from_counts(const Counts& counts, double median_s, std::string_view ceiling_key) {
  if (median_s <= 0) return std::nullopt;
  Rates r;
  if (counts.samples > 0) r.samples_per_s = counts.samples / median_s;
  if (counts.flops > 0) r.tflops = counts.flops / median_s / 1e12;
  if (counts.bytes > 0) r.gbps = counts.bytes / median_s / 1e9;
  // The rate the device is judged by: bandwidth for memory-bound points, arithmetic otherwise.
  r.primary = is_memory_ceiling(ceiling_key) || !r.tflops ? "gbps" : "tflops";
  return r;
}

double achieved_rate(const Rates& rates, std::string_view ceiling_key) {
  return (is_memory_ceiling(ceiling_key) ? rates.gbps : rates.tflops).value_or(0.0);
}

void divide_by_ceiling(Rates& rates, const CeilingRef& ceiling) {
  rates.pct_of_ceiling = 100.0 * achieved_rate(rates, ceiling.key) / ceiling.value;
  rates.ceiling = ceiling;
}

Rates scenario_rates(double samples_per_s, double flops_per_sample) {
  Rates r;
  r.samples_per_s = samples_per_s;
  r.primary = "samples_per_s";
  if (flops_per_sample > 0) r.tflops = flops_per_sample * samples_per_s / 1e12;
  return r;
}

std::optional<double> scaling_efficiency(double rate_n, double devices, double rate_1) {
  if (rate_1 <= 0 || devices <= 0) return std::nullopt;
  return rate_n / (devices * rate_1);
}

std::optional<double> arithmetic_intensity(double flops, double bytes) {
  if (!(bytes > 0) || !(flops >= 0)) return std::nullopt;
  return flops / bytes;
}

}  // namespace ab::results
