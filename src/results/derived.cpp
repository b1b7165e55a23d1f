#include "results/derived.h"

#include <array>
#include <cmath>
#include <sstream>

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
  if (counts.tokens > 0) r.tokens_per_s = counts.tokens / median_s;
  if (counts.flops > 0) r.tflops = counts.flops / median_s / 1e12;
  if (counts.bytes > 0) r.gbps = counts.bytes / median_s / 1e9;
  // The rate the device is judged by: bandwidth for memory-bound points, arithmetic otherwise;
  // items per second where a point counts neither (the input pipeline's images).
  r.primary = is_memory_ceiling(ceiling_key) || !r.tflops ? "gbps" : "tflops";
  if (!r.tflops && !r.gbps && r.samples_per_s) r.primary = "samples_per_s";
  return r;
}

double achieved_rate(const Rates& rates, std::string_view ceiling_key) {
  return (is_memory_ceiling(ceiling_key) ? rates.gbps : rates.tflops).value_or(0.0);
}

void divide_by_ceiling(Rates& rates, const CeilingRef& ceiling) {
  rates.pct_of_ceiling = 100.0 * achieved_rate(rates, ceiling.key) / ceiling.value;
  rates.ceiling = ceiling;
}

namespace {

// Vendor datasheets, dense (no sparsity), boost clock: TFLOP/s (TOP/s for int8) and DRAM GB/s.
// A name matches the first row whose tag it contains; H100 takes the SXM arithmetic and the NVL
// bandwidth, the highest of its forms, so that every H100 is bounded from above.
struct DatasheetRow {
  std::string_view tag, part;
  double fp32, tf32, fp16, bf16, fp8, int8, memory_gbps;
};
constexpr std::array<DatasheetRow, 3> kDatasheet{{
    {"H200", "NVIDIA H200 SXM", 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9, 4800.0},
    {"H100", "NVIDIA H100 SXM/NVL", 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9, 3900.0},
    {"A100", "NVIDIA A100 SXM", 19.5, 156.0, 312.0, 312.0, 0.0, 624.0, 2039.0},
}};

// Bounds no device reaches (an order of magnitude above the fastest datasheet figures).
constexpr double kAnyDeviceTflops = 1e5;
constexpr double kAnyDeviceGbps = 1e5;

double datasheet_value(const DatasheetRow& row, std::string_view key) {
  if (is_memory_ceiling(key)) return row.memory_gbps;
  const std::string_view precision = key.substr(key.find('.') + 1);
  if (precision == "fp32") return row.fp32;
  if (precision == "tf32") return row.tf32;
  if (precision == "fp16") return row.fp16;
  if (precision == "bf16") return row.bf16;
  if (precision == "fp8") return row.fp8;
  if (precision == "int8") return row.int8;
  return 0;
}

std::string format_rate(double v) {
  std::ostringstream out;
  out.precision(6);
  out << v;
  return out.str();
}

}  // namespace

PhysicalLimit physical_limit(std::string_view device_name, std::string_view ceiling_key, bool cache_resident) {
  const bool memory = is_memory_ceiling(ceiling_key);
  if (!(memory && cache_resident))
    for (const DatasheetRow& row : kDatasheet)
      if (device_name.find(row.tag) != std::string_view::npos)
        if (const double v = datasheet_value(row, ceiling_key); v > 0)
          return {v, "datasheet: " + std::string(row.part) + ", " +
                         (memory ? std::string("DRAM bandwidth") : "dense " + std::string(ceiling_key.substr(ceiling_key.find('.') + 1)))};
  return {memory ? kAnyDeviceGbps : kAnyDeviceTflops, "the bound for any device"};
}

std::string implausible_ceiling(double ceiling, const PhysicalLimit& limit) {
  if (!std::isfinite(ceiling)) return "ceiling " + format_rate(ceiling) + " is not finite";
  if (ceiling <= 0) return "ceiling " + format_rate(ceiling) + " is not positive";
  if (ceiling > limit.value)
    return "ceiling " + format_rate(ceiling) + " is above " + format_rate(limit.value) + " (" + limit.source + ")";
  return "";
}

std::string impossible_rate(double achieved, std::string_view unit, const PhysicalLimit& limit,
                            std::optional<double> ceiling) {
  const std::string rate = format_rate(achieved) + " " + std::string(unit);
  if (!std::isfinite(achieved)) return "rate " + rate + " is not finite";
  if (achieved > limit.value)
    return "rate " + rate + " is above the physical limit " + format_rate(limit.value) + " (" + limit.source + ")";
  const bool datasheet = limit.source.rfind("datasheet", 0) == 0;
  if (ceiling && datasheet && achieved > kCeilingMargin * *ceiling)
    return "rate " + rate + " is more than " + format_rate(kCeilingMargin) + "x the measured ceiling " +
           format_rate(*ceiling) + " " + std::string(unit);
  return "";
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
