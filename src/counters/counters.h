// Hardware counters of a point's work, read through CUPTI's range profiler in a pass of their own
// after the timed samples (the profiler replays the work once per pass of counters it needs, so it
// never runs inside a timed sample). Everything here but the CUPTI session knows no CUDA: a build or
// a device without CUPTI gets a session whose every measurement is `unavailable` with the reason.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ab::counters {

// What `--counters` asks for: off (the default), the memory metrics, the compute metrics, or both.
enum class MetricSet { off, memory, compute, all };
// Throws UsageError naming the valid words for any other.
MetricSet parse_metric_set(std::string_view name);
std::string_view to_string(MetricSet set);

// How a metric's values of several ranges (a model's ops) combine into the point's: summed, or
// averaged with each range weighted by its duration (gpu__time_duration.sum).
enum class Combine { sum, time_weighted };

// One metric, by the name CUPTI and Nsight Compute call it.
struct MetricInfo {
  std::string_view name;  // "dram__bytes_read.sum"
  std::string_view unit;  // "byte", "ns", "%", "inst"
  MetricSet set;          // memory or compute (all = both)
  Combine combine;
  bool optional;             // a chip may lack it (a tensor pipe of another architecture); absent then
  std::string_view used_by;  // the derived figures that read it, or what it says alone
};
// The metrics, one table (docs/METHODOLOGY.md, "Hardware counters").
const std::vector<MetricInfo>& metric_table();
// The table's entries in `set` (both sets for all; none for off), in table order.
std::vector<MetricInfo> metrics_of(MetricSet set);
const MetricInfo* find_metric(std::string_view name);

// Where a pass's work marks its ranges: begin(name) ... end() around each piece it launches (a
// model's op). Ranges do not nest.
class RangeMarks {
 public:
  virtual ~RangeMarks() = default;
  virtual void begin(const std::string& name) = 0;
  virtual void end() = 0;
};

// One range of a pass: a name and the work it launches (a micro workload's iteration).
struct Range {
  std::string name;
  std::function<void()> launch;
};

// What L2 holds when a range starts. as_left: whatever the work before it left there (a model's op
// after the op before it, as in a real step). flushed: written back and refilled with a buffer of
// its own before each range, as Nsight Compute's default `--cache-control all`, so a micro point's
// DRAM bytes are its own and not the previous launch's dirty lines nor operands still in L2.
enum class L2State { as_left, flushed };
std::string_view to_string(L2State state);

struct RangeValues {
  std::string name;
  std::map<std::string, double> values;  // by metric name
};

// What a counter pass read: every range's values in the order the ranges ran, or why nothing.
struct Measurement {
  bool available = false;
  std::string reason;  // why unavailable: the call that failed and CUPTI's words
  MetricSet set = MetricSet::off;
  L2State l2 = L2State::as_left;
  std::vector<RangeValues> ranges;
  std::vector<std::string> missing;  // optional metrics this chip does not have
  int passes = 0;                    // times the work ran (one per replay pass)
  std::size_t dropped_ranges = 0;    // ranges CUPTI could not keep (more than the pass allowed)
  double overhead_s = 0;             // wall time of the whole pass: what counters add to a point
};

// Combines every range's values into the point's (Combine of each metric).
std::map<std::string, double> combined(const Measurement& m);

class CounterSession {
 public:
  virtual ~CounterSession() = default;
  virtual MetricSet set() const = 0;
  // Runs `pass` as often as the profiler needs (the same work each time: it must be repeatable)
  // and reads each range it marks; at most `max_ranges` ranges a pass, each starting from L2 in
  // state `l2`. Never throws: any failure, the work's included, is an unavailable measurement with
  // the reason.
  virtual Measurement measure_marked(const std::function<void(RangeMarks&)>& pass, std::size_t max_ranges,
                                     L2State l2) = 0;
  // One range per entry, in order, each from a flushed L2 (a micro workload's point).
  Measurement measure(const std::vector<Range>& ranges);
};

// The session for the device "cuda:N" (CUPTI's, in a CUDA build); for any other device, or a build
// without CUDA, one whose measurements are unavailable and say why. Nothing is initialised before
// the first measurement.
std::unique_ptr<CounterSession> open_session(MetricSet set, const std::string& device_id);
std::unique_ptr<CounterSession> unavailable_session(MetricSet set, std::string reason);

// The modelled counts of the measured work, for the derived figures.
struct Modelled {
  double flops = 0;  // FLOPs (or integer OPs) of the work the pass ran once
  double bytes = 0;  // bytes the workload's model says it moves
};
// The record's metrics.counters block (docs/RESULTS.md): status ok, the set, the combined values by
// metric name, passes, ranges, l2_before_range, overhead_s and the derived figures (measured
// arithmetic intensity, DRAM bytes/s and 32-byte sectors/s, achieved TFLOP/s, measured over
// modelled bytes) where their inputs were measured; or {status: unavailable, set, reason}.
nlohmann::json counters_json(const Measurement& m, const Modelled& modelled);
nlohmann::json unavailable_json(MetricSet set, const std::string& reason);

// DRAM bytes (read + written) of one range's values, or of the combined ones; 0 where not measured.
double dram_bytes(const std::map<std::string, double>& values);

}  // namespace ab::counters
