// Derived figures (rates, % of ceiling, scaling efficiency, arithmetic intensity): the formulas of
// docs/METHODOLOGY.md written once. The runner stores rates in the record; readers use what is stored.
#pragma once

#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "results/record.h"

namespace ab::results {

// A memory.* ceiling judges bandwidth (GB/s); any other (gemm.<precision>) arithmetic (TFLOP/s).
bool is_memory_ceiling(std::string_view ceiling_key);
// The unit a point of this ceiling key publishes: "GB/s", "TOP/s" (ops_unit "OP") or "TFLOP/s".
std::string ceiling_unit(std::string_view ceiling_key, std::string_view ops_unit);

// samples/s, TFLOP/s and GB/s of one iteration from its counts and median time (a rate only where
// its count is non-zero), and the primary rate; nullopt for a median that is not positive.
std::optional<Rates> rates_from_counts(const Counts& counts, double median_s, std::string_view ceiling_key);
// The rate a ceiling of `ceiling_key` is compared with: gbps for memory ceilings, tflops otherwise; 0 if absent.
double achieved_rate(const Rates& rates, std::string_view ceiling_key);
// Sets pct_of_ceiling = achieved / ceiling × 100 and records the ceiling divided by.
void divide_by_ceiling(Rates& rates, const CeilingRef& ceiling);
// MLPerf's olympic mean of times to train: with n >= 3 runs, the fastest and the slowest are
// dropped and the rest averaged. A run that did not converge counts as infinitely slow, so one
// may be dropped as the slowest; with two or more there is no mean (MLPerf rejects the result).
inline constexpr const char* kOlympicMeanRule =
    "mean of the runs' times to train without the fastest and the slowest; a run that did not converge is the "
    "slowest, and more than one such run gives no mean";
struct OlympicMean {
  std::optional<double> mean_s;
  std::size_t converged = 0;  // runs with a finite time
  std::string why_none;       // where mean_s is empty
};
OlympicMean olympic_mean(std::vector<double> times_s);

// A vendor datasheet's peaks for one part: dense (no sparsity) tensor-core arithmetic at boost
// clock in TFLOP/s (TOP/s for int8; fp32 is the non-tensor rate), DRAM bandwidth in GB/s; 0 = the
// datasheet gives none. Figures HPL users know as Rpeak, shown beside the measured ceilings.
struct DatasheetPeaks {
  std::string_view tag;   // a device name containing it is this part (the first row that matches)
  std::string_view part;  // what the figures are of
  double fp64, fp32, tf32, fp16, bf16, fp8, int8, memory_gbps;
};
// Every part of the table, in match order.
std::span<const DatasheetPeaks> datasheet_table();
// The row for a device name, or nullptr for a device not in the table (a host CPU).
const DatasheetPeaks* datasheet_peaks(std::string_view device_name);
// The datasheet figure a ceiling key compares with ("gemm.bf16" -> bf16, "memory.*" -> DRAM); 0 if none.
double datasheet_value(const DatasheetPeaks& row, std::string_view ceiling_key);

// The most a device can do for a ceiling key (TFLOP/s, TOP/s or GB/s) and where that figure is from.
struct PhysicalLimit {
  double value = 0;
  std::string source;  // "datasheet: NVIDIA H200 SXM, dense bf16", or the bound for any device
};
// The datasheet's peak for a known device; for any other device a bound no accelerator reaches,
// so a corrupt figure still fails. `cache_resident`: the point's bytes fit in the device's cache,
// so DRAM bandwidth does not bound it.
PhysicalLimit physical_limit(std::string_view device_name, std::string_view ceiling_key, bool cache_resident = false);
// Why a measured or stored ceiling cannot be divided by (not finite, <= 0, above the physical
// limit); "" when it is plausible.
std::string implausible_ceiling(double ceiling, const PhysicalLimit& limit);
// How far above a plausible measured ceiling a rate may go (noise, a luckier shape) before it is
// impossible, on a device with a datasheet (a dedicated accelerator). On any other (a host CPU)
// a measured ceiling bounds nothing: its rates move with other processes' load, and a ceiling
// measured on a busy machine was 80x below a later point measured beside less load.
inline constexpr double kCeilingMargin = 1.5;
// Why `achieved` (in `unit`) cannot be true: not finite, above the physical limit, or, on a
// datasheet device, above kCeilingMargin × `ceiling` (a plausible ceiling, when there is one);
// "" when it can.
std::string impossible_rate(double achieved, std::string_view unit, const PhysicalLimit& limit,
                            std::optional<double> ceiling);

// A memory point measures DRAM when its bytes are at least this many times the last-level cache:
// below, part of the working set is served from the cache and the rate is the cache's.
inline constexpr double kDramWorkingSetFactor = 4.0;
// The cache assumed where the device reports none (a host whose sysfs hides it): larger than the
// last-level cache of the CPUs and GPUs in use, so a small working set is never taken for DRAM.
inline constexpr double kUnknownCacheBytes = 512.0 * 1024 * 1024;
// Whether a point of `ceiling_key` moving `bytes` measures what its ceiling stands for: every
// gemm.*, and memory.* on a working set of kDramWorkingSetFactor × `cache_bytes` or more.
bool measures_ceiling(std::string_view ceiling_key, double bytes, double cache_bytes);
// Why a point stands above 100% of its ceiling: its working set is cache-resident, or the ceiling
// is one stored from an earlier run (measured under other load or with another build). `stored`:
// the ceiling came from the store. "" when `pct` is not above 100.
std::string above_ceiling_cause(std::string_view ceiling_key, double pct, double bytes, double cache_bytes,
                                bool stored);
// The one line printed when a run divides by no ceiling because none was measured on this device.
std::string missing_ceilings_line(const std::set<std::string>& keys);
// A record's % of ceiling as the terminal shows it: "87.0%", "1990.0% cache" or "131.0% stale" (flagged,
// metrics.above_ceiling says why), "=ceiling" for the point that set it; "" without a ceiling.
std::string pct_of_ceiling_text(const Record& record);
// One line per measured ceiling, HPL's Rmax beside Rpeak: the measured figure, the datasheet's
// for this device and the ratio ("no datasheet figure" for a device not in the table).
std::string ceiling_line(std::string_view device_name, std::string_view ceiling_key, double measured,
                         std::string_view unit);

// A scenario run's rates from its throughput: samples/s (primary) and TFLOP/s where a sample has FLOPs.
Rates scenario_rates(double samples_per_s, double flops_per_sample);

// rate(n) / (n × rate(1)); nullopt without a positive 1-device rate.
std::optional<double> scaling_efficiency(double rate_n, double devices, double rate_1);
// FLOP per byte of one iteration (0 for a point without arithmetic); nullopt without bytes.
std::optional<double> arithmetic_intensity(double flops, double bytes);

}  // namespace ab::results
