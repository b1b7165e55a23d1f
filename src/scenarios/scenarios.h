// Inference under load, after MLPerf LoadGen: a system under test (SUT) takes queries of samples
// and reports each sample's completion from any thread; the load generator owns time, issues the
// queries of a scenario from one thread, measures every sample from its *scheduled* time and judges
// the run VALID or INVALID by named constraints. Rules and formulas: docs/METHODOLOGY.md,
// "Inference scenarios". SUTs (null, faulty, dynamic batcher): scenarios/suts.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ab::scenarios {

enum class Scenario { single_stream, multi_stream, server, offline };
enum class Preset { quick, mlperf };

std::string_view to_string(Scenario s);    // "single-stream", "multi-stream", "server", "offline"
std::string_view mlperf_name(Scenario s);  // "SingleStream", "MultiStream", "Server", "Offline"
std::string_view to_string(Preset p);      // "quick", "mlperf"
Scenario parse_scenario(std::string_view s);  // throws UsageError listing the valid names
Preset parse_preset(std::string_view s);

// One sample of a query: `id` is the load generator's handle, given back on completion; `index` is
// the sample library's index of the input.
struct QuerySample {
  std::uint64_t id = 0;
  std::uint64_t index = 0;
};

// Where a SUT reports finished samples: from any thread, without blocking, once per sample.
class Completions {
 public:
  virtual void complete(std::span<const QuerySample> samples) = 0;

 protected:
  ~Completions() = default;
};

class SystemUnderTest {
 public:
  virtual ~SystemUnderTest() = default;
  virtual std::string name() const = 0;
  // Takes a query. Returns promptly (queues the work, never waits for it); reports every sample to
  // `done` exactly once, later, from any thread.
  virtual void issue_query(std::span<const QuerySample> samples, Completions& done) = 0;
  // No more queries are coming for now: run anything held back (a batcher's partial batch).
  virtual void flush_queries() {}
  // Why the SUT stopped serving (an error on its worker thread); empty while it is healthy.
  virtual std::string failure() const { return {}; }
};

// The inputs: `total` samples, of which `performance` are loaded for a performance run.
class SampleLibrary {
 public:
  virtual ~SampleLibrary() = default;
  virtual std::string name() const = 0;
  virtual std::size_t total_sample_count() const = 0;
  virtual std::size_t performance_sample_count() const = 0;
  virtual void load_samples(std::span<const std::size_t> indices) = 0;
  virtual void unload_samples(std::span<const std::size_t> indices) = 0;
};

// A library without data (the null and compute SUTs need none); it remembers what is loaded.
class SyntheticLibrary final : public SampleLibrary {
 public:
  SyntheticLibrary(std::size_t total, std::size_t performance);
  std::string name() const override { return "synthetic"; }
  std::size_t total_sample_count() const override { return total_; }
  std::size_t performance_sample_count() const override { return performance_; }
  void load_samples(std::span<const std::size_t> indices) override;
  void unload_samples(std::span<const std::size_t> indices) override;
  std::size_t loaded() const { return loaded_; }
  int load_calls() const { return load_calls_; }

 private:
  std::size_t total_, performance_, loaded_ = 0;
  int load_calls_ = 0;
};

// What one run of the load generator does. `preset_settings` fills it; docs/METHODOLOGY.md lists
// every value with its source.
struct Settings {
  Scenario scenario = Scenario::single_stream;
  Preset preset = Preset::quick;
  double min_duration_s = 1.0;
  std::uint64_t min_query_count = 100;  // offline: the least samples its one query holds
  double timeout_s = 60.0;        // issuing stops here; a run that had not met its minimums is INVALID
  double drain_timeout_s = 1.0;   // after the last issue, unfinished samples have this long, then are lost
  double target_percentile = 0.90;  // 0.90 single-stream, 0.99 multi-stream and server
  double latency_bound_s = 0;     // server: required; single- and multi-stream: optional (0 = none)
  std::uint64_t samples_per_query = 1;  // multi-stream: 8
  double target_qps = 0;  // server: Poisson rate (0 = search for the peak); offline: expected samples/s (0 = probe)
  double confidence = 0.99;  // early stopping's c (MLPerf: 0.99, tolerance d = 0)
  std::uint64_t schedule_seed = 0x5eed0001, sample_seed = 0x5eed0002, library_seed = 0x5eed0003;
  // The server's search for its peak QPS (accelbench's procedure; the verification run uses the above).
  double search_min_duration_s = 0.25;
  std::uint64_t search_min_query_count = 500;
  double search_precision = 0.05;  // stop when (lowest failing - highest passing) / highest passing <= this
  int search_max_runs = 24;
  int verify_attempts = 3;         // a failed verification retries at 0.95 x the QPS
  std::uint64_t max_samples = std::uint64_t{1} << 28;  // per run: completion slots are 8 B a sample
};

Settings preset_settings(Preset preset, Scenario scenario);
// Refuses (UsageError with the reason) settings under which no run can be VALID by construction.
void check_settings(const Settings& s);

// --- Statistics (stats.cpp); formulas in docs/METHODOLOGY.md --------------------------------------

// LoadGen's percentile: the sorted value at 0-based index floor(n * p), clamped to the last.
double percentile_loadgen(std::span<const double> sorted, double p);
// P[X <= t] for X ~ Binomial(n, q), summed in log space (exact for n in the millions).
double binomial_cdf(std::uint64_t t, std::uint64_t n, double q);
// Early stopping (MLPerf inference rules, appendix "Early Stopping Criterion", d = 0):
// the largest t >= 1 with P[Binomial(n, 1 - p) <= t] < 1 - c; 0 when n is too small for any.
std::uint64_t early_stopping_overlatency(std::uint64_t n, double p, double c);
// The fewest queries for which single-/multi-stream have an estimate (t = 1): 64 at p = 0.90, 662 at 0.99.
std::uint64_t early_stopping_min_queries(double p, double c);
// Server: the fewest queries n for which t overlatency queries still pass (h(t) + t in the rules).
std::uint64_t early_stopping_queries_needed(std::uint64_t t, double p, double c);

// Poisson arrivals: exponential gaps -ln(1 - u) / qps, u from the 53 high bits of a seeded
// std::mt19937_64 (fully specified by the standard, so every platform gets the same schedule).
class PoissonSchedule {
 public:
  PoissonSchedule(double qps, std::uint64_t seed);
  double next_gap_s();

 private:
  double qps_;
  std::mt19937_64 rng_;
};

// --- One run ----------------------------------------------------------------------------------

struct LatencyStats {  // seconds; LoadGen's percentiles
  std::uint64_t count = 0;
  double min = 0, max = 0, mean = 0, p50 = 0, p90 = 0, p95 = 0, p97 = 0, p99 = 0, p999 = 0;
};

struct Constraint {
  std::string name;  // min_duration, min_query_count, min_sample_count, early_stopping, latency_bound,
                     // lost_queries, completion_errors, sut_failure, capacity, interrupted
  bool met = true;
  std::string detail;
};

struct RunResult {
  Settings settings;
  bool valid = false;
  std::vector<Constraint> constraints;  // every rule checked, in this order
  std::vector<std::string> notes;
  std::uint64_t queries_issued = 0, samples_issued = 0, samples_completed = 0;
  std::uint64_t lost_samples = 0, lost_queries = 0, duplicate_completions = 0, unknown_completions = 0;
  bool interrupted = false;
  double duration_s = 0;  // what min_duration is checked against (the scenario's rule)
  double last_completion_s = 0;
  double window_start_s = 0, window_end_s = 0;  // measure::monotonic_seconds() clock
  double scheduled_qps = 0, completed_samples_per_s = 0;
  double issue_lag_mean_s = 0, issue_lag_max_s = 0;  // issue time - scheduled time
  LatencyStats sample_latency, query_latency;  // query latency: multi-stream only
  bool early_stopping_met = false;
  double target_percentile_latency_s = 0;  // LoadGen's percentile at target_percentile (multi-stream: of queries)
  double early_stopping_latency_s = 0;  // single-/multi-stream: the percentile claimable at confidence c
  std::uint64_t overlatency_queries = 0, queries_needed = 0;  // server
  std::string sut_failure;

  std::vector<std::string> failed() const;  // names of the constraints not met
  double metric() const;                    // the scenario's headline figure (metric_name())
  std::string metric_name() const;
};

// Runs one scenario. Never hangs: issuing stops at timeout_s, and samples the SUT has not reported
// drain_timeout_s later are lost (INVALID). `cancel` (Ctrl-C) stops issuing early.
RunResult run(SystemUnderTest& sut, SampleLibrary& library, const Settings& settings,
              const std::atomic<bool>* cancel = nullptr);

struct SearchStep {
  double target_qps = 0;
  bool valid = false;
  double p99_s = 0;
  std::vector<std::string> failed;
  bool verification = false;
};

struct SearchResult {
  RunResult final;  // the verification run (or the last attempt)
  std::vector<SearchStep> steps;
  double probe_samples_per_s = 0;
  double peak_qps = 0;  // the QPS the final run verified; 0 when none passed
  bool found = false;
  std::string stop_reason;
};

// Offline's probe: samples per second of short back-to-back bursts (also the server search's start).
double probe_throughput(SystemUnderTest& sut, SampleLibrary& library, const Settings& settings,
                        const std::atomic<bool>* cancel = nullptr);
// Server: doubles or halves the QPS until one run passes and one fails, bisects to
// search_precision, then verifies the highest passing QPS with a full run (docs/METHODOLOGY.md).
SearchResult find_peak_qps(SystemUnderTest& sut, SampleLibrary& library, const Settings& settings,
                           const std::atomic<bool>* cancel = nullptr);

// The run as the record's `scenario` block (docs/RESULTS.md).
nlohmann::json to_json(const RunResult& r);
nlohmann::json to_json(const SearchResult& s);

// --- MLLOG (mllog.cpp) -------------------------------------------------------------------------

struct LogInfo {
  std::string version;  // "accelbench 0.1.0 @ <commit>"
  std::string sut, library;
  std::size_t total_samples = 0, performance_samples = 0;
  std::string started_at;  // UTC ISO 8601
};

// One MLPerf log line: ":::MLLOG {"key": ..., "value": ..., "time_ms": ..., "namespace": ...,
// "event_type": "POINT_IN_TIME", "metadata": {...}}".
std::string mllog_line(std::string_view key, const nlohmann::json& value, double time_ms, bool is_error = false);
std::vector<std::string> mllog_summary(const RunResult& r, const LogInfo& info);
std::vector<std::string> mllog_detail(const RunResult& r, const SearchResult* search, const LogInfo& info);
// mlperf_log_summary.txt as LoadGen writes it: "MLPerf Results Summary", the headline figure,
// "Result is : VALID" or INVALID with each rule's Yes/NO, the latency percentiles in ns, the settings.
std::string loadgen_summary_text(const RunResult& r, const SearchResult* search, const LogInfo& info);
// Writes mlperf_log_summary.txt (LoadGen's text) and mlperf_log_detail.txt (MLLOG lines, the
// results included) into `dir` (created); throws Error.
void write_mllog(const std::filesystem::path& dir, const RunResult& r, const SearchResult* search, const LogInfo& info);

}  // namespace ab::scenarios
