// The metric table, the combination of ranges, the record block and its derived figures: the parts
// of the counters module that need no GPU (and are tested without one).
#include "counters/counters.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"

namespace ab::counters {

namespace {

constexpr double kSectorBytes = 32;  // a DRAM transaction moves one 32-byte sector

// Names as Nsight Compute and CUPTI's profiler host know them on Volta and later. The tensor pipe
// is two metrics: HMMA (mma.sync, every architecture since Volta) and GMMA (Hopper's wgmma, which
// cuBLAS uses there); a chip keeps whichever it has.
const std::vector<MetricInfo> kTable = {
    {"dram__bytes_read.sum", "byte", MetricSet::memory, Combine::sum, false,
     "DRAM bytes = read + write: measured intensity, DRAM bytes/s, sectors/s, measured/modelled bytes"},
    {"dram__bytes_write.sum", "byte", MetricSet::memory, Combine::sum, false, "DRAM bytes (with the reads)"},
    {"lts__t_bytes.sum", "byte", MetricSet::memory, Combine::sum, false, "L2 bytes and L2 bytes/s"},
    {"gpu__time_duration.sum", "ns", MetricSet::memory, Combine::sum, false,
     "duration: every rate (DRAM bytes/s, sectors/s, achieved TFLOP/s) and the time weights of averages"},
    {"sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", MetricSet::compute, Combine::time_weighted, false,
     "SM throughput, % of peak"},
    {"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%", MetricSet::compute,
     Combine::time_weighted, true, "tensor pipe (HMMA) active share"},
    {"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active", "%", MetricSet::compute,
     Combine::time_weighted, true, "tensor pipe (GMMA, Hopper) active share"},
    {"sm__warps_active.avg.pct_of_peak_sustained_active", "%", MetricSet::compute, Combine::time_weighted, false,
     "achieved occupancy"},
    {"smsp__inst_executed.sum", "inst", MetricSet::compute, Combine::sum, false, "instructions executed"},
};

constexpr const char* kRead = "dram__bytes_read.sum";
constexpr const char* kWrite = "dram__bytes_write.sum";
constexpr const char* kL2 = "lts__t_bytes.sum";
constexpr const char* kDuration = "gpu__time_duration.sum";

std::optional<double> value_of(const std::map<std::string, double>& values, const char* name) {
  const auto it = values.find(name);
  if (it == values.end() || !std::isfinite(it->second)) return std::nullopt;
  return it->second;
}

// Runs the entries in order, each its own range.
class ListPass {
 public:
  explicit ListPass(const std::vector<Range>& ranges) : ranges_(ranges) {}
  void operator()(RangeMarks& marks) const {
    for (const Range& r : ranges_) {
      marks.begin(r.name);
      r.launch();
      marks.end();
    }
  }

 private:
  const std::vector<Range>& ranges_;
};

class UnavailableSession final : public CounterSession {
 public:
  UnavailableSession(MetricSet set, std::string reason) : set_(set), reason_(std::move(reason)) {}
  MetricSet set() const override { return set_; }
  Measurement measure_marked(const std::function<void(RangeMarks&)>&, std::size_t, L2State l2) override {
    Measurement m;
    m.set = set_;
    m.l2 = l2;
    m.reason = reason_;
    return m;
  }

 private:
  MetricSet set_;
  std::string reason_;
};

}  // namespace

MetricSet parse_metric_set(std::string_view name) {
  if (name == "off") return MetricSet::off;
  if (name == "memory") return MetricSet::memory;
  if (name == "compute") return MetricSet::compute;
  if (name == "all") return MetricSet::all;
  throw UsageError("unknown counter set '" + std::string(name) + "'; valid: off, memory, compute, all");
}

std::string_view to_string(MetricSet set) {
  switch (set) {
    case MetricSet::off: return "off";
    case MetricSet::memory: return "memory";
    case MetricSet::compute: return "compute";
    case MetricSet::all: return "all";
  }
  return "off";
}

std::string_view to_string(L2State state) { return state == L2State::flushed ? "flushed" : "as_left"; }

const std::vector<MetricInfo>& metric_table() { return kTable; }

std::vector<MetricInfo> metrics_of(MetricSet set) {
  std::vector<MetricInfo> out;
  for (const MetricInfo& m : kTable)
    if (set == MetricSet::all || (set != MetricSet::off && m.set == set)) out.push_back(m);
  return out;
}

const MetricInfo* find_metric(std::string_view name) {
  const auto it = std::find_if(kTable.begin(), kTable.end(), [&](const MetricInfo& m) { return m.name == name; });
  return it == kTable.end() ? nullptr : &*it;
}

std::map<std::string, double> combined(const Measurement& m) {
  std::map<std::string, double> sums, weights;
  for (const RangeValues& r : m.ranges) {
    const double weight = value_of(r.values, kDuration).value_or(1.0);
    for (const auto& [name, v] : r.values) {
      if (!std::isfinite(v)) continue;
      const MetricInfo* info = find_metric(name);
      const bool weighted = info != nullptr && info->combine == Combine::time_weighted;
      sums[name] += weighted ? v * weight : v;
      weights[name] += weighted ? weight : 0.0;
    }
  }
  for (auto& [name, v] : sums)
    if (weights[name] > 0) v /= weights[name];
  return sums;
}

Measurement CounterSession::measure(const std::vector<Range>& ranges) {
  return measure_marked(ListPass(ranges), std::max<std::size_t>(ranges.size(), 1), L2State::flushed);
}

std::unique_ptr<CounterSession> unavailable_session(MetricSet set, std::string reason) {
  return std::make_unique<UnavailableSession>(set, std::move(reason));
}

double dram_bytes(const std::map<std::string, double>& values) {
  const auto read = value_of(values, kRead), write = value_of(values, kWrite);
  return read && write ? *read + *write : 0.0;
}

nlohmann::json unavailable_json(MetricSet set, const std::string& reason) {
  return {{"status", "unavailable"}, {"set", std::string(to_string(set))}, {"reason", reason}};
}

nlohmann::json counters_json(const Measurement& m, const Modelled& modelled) {
  if (!m.available) return unavailable_json(m.set, m.reason);
  const std::map<std::string, double> values = combined(m);
  nlohmann::json j = {{"status", "ok"},
                      {"set", std::string(to_string(m.set))},
                      {"metrics", values},
                      {"ranges", m.ranges.size()},
                      {"passes", m.passes},
                      {"l2_before_range", std::string(to_string(m.l2))},
                      {"overhead_s", m.overhead_s}};
  if (!m.missing.empty()) j["missing"] = m.missing;
  if (m.dropped_ranges > 0) j["dropped_ranges"] = m.dropped_ranges;
  const double dram = dram_bytes(values);
  const double duration_s = value_of(values, kDuration).value_or(0.0) * 1e-9;
  if (dram > 0) {
    j["dram_bytes"] = dram;
    if (modelled.flops > 0) j["measured_intensity_flop_per_byte"] = modelled.flops / dram;
    if (modelled.bytes > 0) {
      j["modelled_bytes"] = modelled.bytes;
      j["measured_over_modelled_bytes"] = dram / modelled.bytes;
    }
  }
  if (duration_s > 0) {
    j["duration_s"] = duration_s;
    if (dram > 0) {
      j["dram_bytes_per_s"] = dram / duration_s;
      j["dram_sectors_per_s"] = dram / kSectorBytes / duration_s;
    }
    if (const auto l2 = value_of(values, kL2); l2 && *l2 > 0) j["l2_bytes_per_s"] = *l2 / duration_s;
    if (modelled.flops > 0) j["achieved_tflops"] = modelled.flops / duration_s / 1e12;
  }
  return j;
}

}  // namespace ab::counters
