#include "results/derived.h"

#include <algorithm>
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

// Vendor datasheets (NVIDIA's product briefs), dense figures: half of the "with sparsity" ones.
// Matched by the first tag a device name contains, so the specific forms come before the
// family: an H100 whose name tells no form takes the highest figure of its forms (SXM arithmetic,
// NVL bandwidth) and an A100 that of the SXM4 80GB, so that every one is bounded from above.
// B200 and GB200 are per GPU (HGX B200 and GB200 NVL72 divided by their GPU counts).
constexpr std::array<DatasheetPeaks, 10> kDatasheet{{
    // tag, part, fp64 (tensor), fp32, tf32, fp16, bf16, fp8, int8 TFLOP/s or TOP/s, DRAM GB/s
    {"GB200", "NVIDIA GB200 (one Blackwell GPU)", 45.0, 80.0, 1250.0, 2500.0, 2500.0, 5000.0, 5000.0, 8000.0},
    {"B200", "NVIDIA B200 (HGX B200)", 37.0, 75.0, 1125.0, 2250.0, 2250.0, 4500.0, 4500.0, 8000.0},
    {"H200 NVL", "NVIDIA H200 NVL", 60.0, 60.0, 417.5, 835.5, 835.5, 1670.5, 1670.5, 4800.0},
    {"H200", "NVIDIA H200 SXM", 67.0, 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9, 4800.0},
    {"H100 NVL", "NVIDIA H100 NVL", 60.0, 60.0, 417.5, 835.5, 835.5, 1670.5, 1670.5, 3900.0},
    {"H100 PCIe", "NVIDIA H100 PCIe", 51.0, 51.0, 378.0, 756.5, 756.5, 1513.0, 1513.0, 2000.0},
    {"H100 80GB HBM3", "NVIDIA H100 SXM", 67.0, 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9, 3350.0},
    {"H100", "NVIDIA H100 (any form: SXM arithmetic, NVL bandwidth)", 67.0, 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9,
     3900.0},
    {"A100", "NVIDIA A100 (SXM4 80GB, the highest of its forms)", 19.5, 19.5, 156.0, 312.0, 312.0, 0.0, 624.0, 2039.0},
    {"L40S", "NVIDIA L40S", 0.0, 91.6, 183.0, 362.0, 362.0, 733.0, 733.0, 864.0},
}};

// Bounds no device reaches (an order of magnitude above the fastest datasheet figures).
constexpr double kAnyDeviceTflops = 1e5;
constexpr double kAnyDeviceGbps = 1e5;

std::string format_rate(double v) {
  std::ostringstream out;
  out.precision(6);
  out << v;
  return out.str();
}

std::string format_mib(double bytes) {
  std::ostringstream out;
  out.precision(4);
  out << bytes / (1024.0 * 1024.0) << " MiB";
  return out.str();
}

std::string_view precision_of(std::string_view key) { return key.substr(key.find('.') + 1); }

}  // namespace

std::span<const DatasheetPeaks> datasheet_table() { return kDatasheet; }

const DatasheetPeaks* datasheet_peaks(std::string_view device_name) {
  if (device_name.empty()) return nullptr;
  for (const DatasheetPeaks& row : kDatasheet)
    if (device_name.find(row.tag) != std::string_view::npos) return &row;
  return nullptr;
}

double datasheet_value(const DatasheetPeaks& row, std::string_view key) {
  if (is_memory_ceiling(key)) return row.memory_gbps;
  const std::string_view precision = precision_of(key);
  if (precision == "fp64") return row.fp64;
  if (precision == "fp32") return row.fp32;
  if (precision == "tf32") return row.tf32;
  if (precision == "fp16") return row.fp16;
  if (precision == "bf16") return row.bf16;
  if (precision == "fp8") return row.fp8;
  if (precision == "int8") return row.int8;
  return 0;
}

PhysicalLimit physical_limit(std::string_view device_name, std::string_view ceiling_key, bool cache_resident) {
  const bool memory = is_memory_ceiling(ceiling_key);
  const DatasheetPeaks* row = datasheet_peaks(device_name);
  if (row != nullptr && !(memory && cache_resident))
    if (const double v = datasheet_value(*row, ceiling_key); v > 0)
      return {v, "datasheet: " + std::string(row->part) + ", " +
                     (memory ? std::string("DRAM bandwidth") : "dense " + std::string(precision_of(ceiling_key)))};
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

bool measures_ceiling(std::string_view ceiling_key, double bytes, double cache_bytes) {
  if (!is_memory_ceiling(ceiling_key)) return !ceiling_key.empty();
  const double cache = cache_bytes > 0 ? cache_bytes : kUnknownCacheBytes;
  return bytes >= kDramWorkingSetFactor * cache;
}

std::string above_ceiling_cause(std::string_view ceiling_key, double pct, double bytes, double cache_bytes,
                                bool stored) {
  if (!(pct > 100.0)) return "";
  if (!measures_ceiling(ceiling_key, bytes, cache_bytes))
    return "cache-resident working set: " + format_mib(bytes) + " moved per iteration, under " +
           format_rate(kDramWorkingSetFactor) + "x the " +
           (cache_bytes > 0 ? format_mib(cache_bytes) + " last-level cache"
                            : "assumed cache (the device reports none)") +
           ", so the rate is the cache's, not DRAM's";
  if (stored)
    return "above the ceiling stored from an earlier run (measured under other load, clocks or build): "
           "`accelbench run ceilings` measures it again";
  return "above the ceiling measured in this run";
}

std::string missing_ceilings_line(const std::set<std::string>& keys) {
  if (keys.empty()) return "";
  std::string names;
  for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
  return "no % of ceiling: no " + names + " ceiling measured on this device; `accelbench run ceilings` measures " +
         (keys.size() == 1 ? "it" : "them") + " (about a minute), later runs use them";
}

std::string pct_of_ceiling_text(const Record& record) {
  if (!record.rates) return "";
  if (!record.rates->pct_of_ceiling)
    return record.rates->ceiling && record.rates->ceiling->source == "this point" ? "=ceiling" : "";
  std::ostringstream out;
  out << std::fixed;
  out.precision(1);
  out << *record.rates->pct_of_ceiling << "%";
  if (record.metrics.is_object() && record.metrics.contains("above_ceiling")) {
    const auto& why = record.metrics["above_ceiling"];
    out << (why.is_string() && why.get<std::string>().rfind("cache-resident", 0) == 0 ? " cache" : " stale");
  }
  return out.str();
}

std::string ceiling_line(std::string_view device_name, std::string_view ceiling_key, double measured,
                         std::string_view unit) {
  std::ostringstream out;
  out.precision(4);
  out << "ceiling " << ceiling_key << ": " << measured << " " << unit << " measured";
  const DatasheetPeaks* row = datasheet_peaks(device_name);
  const double peak = row != nullptr ? datasheet_value(*row, ceiling_key) : 0.0;
  if (peak > 0) {
    out << ", datasheet " << peak << " " << unit << " (" << row->part << "): ";
    out.precision(3);
    out << 100.0 * measured / peak << "% of it";
  } else {
    out << " (no datasheet figure for this device)";
  }
  return out.str();
}

Rates scenario_rates(double samples_per_s, double flops_per_sample) {
  Rates r;
  r.samples_per_s = samples_per_s;
  r.primary = "samples_per_s";
  if (flops_per_sample > 0) r.tflops = flops_per_sample * samples_per_s / 1e12;
  return r;
}

OlympicMean olympic_mean(std::vector<double> times_s) {
  OlympicMean m;
  for (const double t : times_s) m.converged += std::isfinite(t) ? 1 : 0;
  if (times_s.size() < 3) {
    m.why_none = std::to_string(times_s.size()) + " runs (at least 3: the fastest and slowest are dropped)";
    return m;
  }
  if (times_s.size() - m.converged > 1) {
    m.why_none = std::to_string(times_s.size() - m.converged) + " of " + std::to_string(times_s.size()) +
                 " runs did not converge (at most one may)";
    return m;
  }
  std::sort(times_s.begin(), times_s.end());
  double sum = 0;
  for (std::size_t i = 1; i + 1 < times_s.size(); ++i) sum += times_s[i];
  m.mean_s = sum / static_cast<double>(times_s.size() - 2);
  return m;
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
