// The load generator: issues a scenario's queries from this thread, waits for completions only
// where the scenario says so, then drains, closes the run and judges it (docs/METHODOLOGY.md,
// "Inference scenarios").
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "scenarios/scenarios.h"
#include "scenarios/tracker.h"

namespace ab::scenarios {
namespace {

using detail::Clock;
using detail::Tracker;

constexpr std::uint64_t kOfflineChunk = 1 << 16;  // offline's one query is handed over in pieces this big

double seconds(std::int64_t ns) { return static_cast<double>(ns) * 1e-9; }
std::int64_t nanos(double s) { return static_cast<std::int64_t>(std::llround(s * 1e9)); }
double monotonic(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

std::string fmt(double v) {
  std::ostringstream o;
  o.precision(5);
  o << v;
  return o.str();
}

// A run's trackers can be reported to after it ends by a SUT that still owes samples; those are
// parked here (a few hundred bytes each, their slots freed) instead of being destroyed under it.
void park(std::shared_ptr<Tracker> t) {
  static std::mutex m;
  static std::vector<std::shared_ptr<Tracker>> parked;
  std::lock_guard<std::mutex> lock(m);
  parked.push_back(std::move(t));
}

// The performance set: `performance` distinct indices of `total`, chosen by the library seed.
std::vector<std::size_t> performance_set(std::size_t total, std::size_t performance, std::uint64_t seed) {
  std::vector<std::size_t> all(total);
  std::iota(all.begin(), all.end(), std::size_t{0});
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < performance; ++i) {  // partial Fisher-Yates
    const std::size_t j = i + static_cast<std::size_t>(rng() % (total - i));
    std::swap(all[i], all[j]);
  }
  all.resize(performance);
  std::sort(all.begin(), all.end());
  return all;
}

// Order statistics LoadGen reports, without sorting everything (offline runs hold millions).
LatencyStats describe(std::vector<double>& v) {
  LatencyStats s;
  s.count = v.size();
  if (v.empty()) return s;
  const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  s.min = *mn;
  s.max = *mx;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double* out[] = {&s.p50, &s.p90, &s.p95, &s.p97, &s.p99, &s.p999};
  const double ps[] = {0.50, 0.90, 0.95, 0.97, 0.99, 0.999};
  auto from = v.begin();
  for (int i = 0; i < 6; ++i) {
    const auto idx = std::min(static_cast<std::size_t>(static_cast<double>(v.size()) * ps[i]), v.size() - 1);
    const auto at = v.begin() + static_cast<std::ptrdiff_t>(idx);
    if (at >= from) {
      std::nth_element(from, at, v.end());
      from = at;
    }
    *out[i] = *at;
  }
  return s;
}

// The k-th smallest (0-based) of v, reordering v.
double kth(std::vector<double>& v, std::size_t k) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

class Engine {
 public:
  Engine(SystemUnderTest& sut, const Settings& s, std::span<const std::size_t> perf, const std::atomic<bool>* cancel)
      : sut_(sut), s_(s), perf_(perf), cancel_(cancel), start_(Clock::now()),
        deadline_(start_ + std::chrono::nanoseconds(nanos(s.timeout_s))), sample_rng_(s.sample_seed),
        tracker_(std::make_shared<Tracker>(start_, s.max_samples)) {}

  RunResult run(std::uint64_t offline_samples) {
    try {
      switch (s_.scenario) {
        case Scenario::single_stream:
        case Scenario::multi_stream: issue_streams(); break;
        case Scenario::server: issue_server(); break;
        case Scenario::offline: issue_offline(offline_samples); break;
      }
      sut_.flush_queries();
    } catch (...) {  // the SUT may still hold samples: keep what it reports them to alive
      tracker_->close();
      tracker_->release_slots();
      park(tracker_);
      throw;
    }
    // Unfinished samples get drain_timeout_s more; offline's one query may use the whole timeout,
    // since processing it is the run.
    const double drain = interrupted_ ? std::min(s_.drain_timeout_s, 0.5) : s_.drain_timeout_s;
    auto drain_end = Clock::now() + std::chrono::nanoseconds(nanos(drain));
    if (s_.scenario == Scenario::offline && !interrupted_) drain_end = std::max(drain_end, deadline_);
    tracker_->wait_completed(tracker_->issued(), drain_end, nullptr);
    tracker_->close();
    RunResult r = summarize();
    if (r.lost_samples > 0) {
      tracker_->release_slots();
      park(tracker_);
    }
    return r;
  }

 private:
  bool stop_now(Clock::time_point now) {
    if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
      interrupted_ = true;
      return true;
    }
    return now >= deadline_;
  }

  std::uint64_t next_index() {  // uniform over the performance set (Lemire's multiply-shift)
    __extension__ using U128 = unsigned __int128;
    const U128 r = static_cast<U128>(sample_rng_()) * perf_.size();
    return perf_[static_cast<std::size_t>(r >> 64)];
  }

  // Hands a query of n samples scheduled at `sched_ns` to the SUT; false at capacity.
  bool issue(std::int64_t sched_ns, std::uint64_t n) {
    const std::uint64_t first = tracker_->issued();
    if (!tracker_->reserve(n)) {
      capacity_hit_ = true;
      return false;
    }
    buffer_.resize(n);
    for (std::uint64_t i = 0; i < n; ++i) buffer_[i] = {first + i, next_index()};
    sched_ns_.push_back(sched_ns);
    const std::int64_t now = tracker_->since_start_ns(Clock::now());
    const double lag = seconds(std::max<std::int64_t>(0, now - sched_ns));
    lag_sum_ += lag;
    lag_max_ = std::max(lag_max_, lag);
    last_issue_ns_ = now;
    sut_.issue_query(buffer_, *tracker_);
    return true;
  }

  bool minimums_met(std::int64_t duration_ns) const {
    return sched_ns_.size() >= s_.min_query_count && duration_ns >= nanos(s_.min_duration_s);
  }

  // Single- and multi-stream: the next query as soon as the last one completed.
  void issue_streams() {
    while (true) {
      const auto now = Clock::now();
      if (stop_now(now)) break;
      if (!sched_ns_.empty() && minimums_met(sched_ns_.back())) break;
      if (!issue(tracker_->since_start_ns(now), s_.samples_per_query)) break;
      if (!tracker_->wait_completed(tracker_->issued(), deadline_, cancel_)) {
        if (cancel_ != nullptr && cancel_->load()) interrupted_ = true;
        break;
      }
    }
  }

  // Server: Poisson arrivals; a query is issued at its scheduled time whether or not the SUT kept up.
  void issue_server() {
    PoissonSchedule schedule(s_.target_qps, s_.schedule_seed);
    double t = schedule.next_gap_s();
    while (true) {
      if (!sched_ns_.empty() && minimums_met(sched_ns_.back())) break;
      const auto target = start_ + std::chrono::nanoseconds(nanos(t));
      if (target > deadline_) break;
      if (!wait_until(target)) break;
      if (!issue(nanos(t), 1)) break;
      t += schedule.next_gap_s();
    }
  }

  // False when the run must stop first (timeout in real time, even if the SUT makes issuing slow; Ctrl-C).
  bool wait_until(Clock::time_point target) {
    using namespace std::chrono_literals;
    for (;;) {
      const auto now = Clock::now();
      if (stop_now(now)) return false;
      if (now >= target) return true;
      const auto left = target - now;
      if (left > 200us) {  // sleep most of a long gap (the OS may oversleep ~60 us), spin the rest
        std::this_thread::sleep_for(std::min<Clock::duration>(left - 100us, 10ms));
      } else {
        detail::cpu_relax();
      }
    }
  }

  // Offline: every sample at once, as one query handed over in pieces.
  void issue_offline(std::uint64_t n) {
    sched_ns_.push_back(0);
    const std::uint64_t first = tracker_->issued();
    for (std::uint64_t done = 0; done < n;) {
      if (stop_now(Clock::now())) break;
      const std::uint64_t k = std::min(kOfflineChunk, n - done);
      if (!tracker_->reserve(k)) {
        capacity_hit_ = true;
        break;
      }
      buffer_.resize(k);
      for (std::uint64_t i = 0; i < k; ++i) buffer_[i] = {first + done + i, next_index()};
      sut_.issue_query(buffer_, *tracker_);
      done += k;
    }
    last_issue_ns_ = tracker_->since_start_ns(Clock::now());
  }

  std::uint64_t query_of(std::uint64_t id) const {
    return s_.scenario == Scenario::offline ? 0 : id / s_.samples_per_query;
  }

  RunResult summarize();

  SystemUnderTest& sut_;
  const Settings& s_;
  std::span<const std::size_t> perf_;
  const std::atomic<bool>* cancel_;
  Clock::time_point start_, deadline_;
  std::mt19937_64 sample_rng_;
  std::shared_ptr<Tracker> tracker_;
  std::deque<std::int64_t> sched_ns_;  // per query
  std::vector<QuerySample> buffer_;
  std::int64_t last_issue_ns_ = 0;
  double lag_sum_ = 0, lag_max_ = 0;
  bool capacity_hit_ = false, interrupted_ = false;
};

RunResult Engine::summarize() {
  RunResult r;
  r.settings = s_;
  r.queries_issued = sched_ns_.size();
  r.samples_issued = tracker_->issued();
  r.duplicate_completions = tracker_->duplicates();
  r.unknown_completions = tracker_->unknown();
  r.interrupted = interrupted_;
  r.sut_failure = sut_.failure();
  r.issue_lag_mean_s = r.queries_issued ? lag_sum_ / static_cast<double>(r.queries_issued) : 0.0;
  r.issue_lag_max_s = lag_max_;

  const bool multi = s_.scenario == Scenario::multi_stream;
  std::vector<double> latencies, query_latencies;
  latencies.reserve(r.samples_issued);
  std::vector<char> query_lost(multi ? r.queries_issued : 0, 0);
  if (multi) query_latencies.assign(r.queries_issued, 0.0);
  std::int64_t last_done = 0;
  for (std::uint64_t id = 0; id < r.samples_issued; ++id) {
    const std::int64_t done = tracker_->completion_ns(id);
    const std::uint64_t q = query_of(id);
    if (done < 0) {
      ++r.lost_samples;
      if (multi) query_lost[q] = 1;
      continue;
    }
    last_done = std::max(last_done, done);
    const double lat = seconds(done - sched_ns_[q]);
    latencies.push_back(lat);
    if (multi) query_latencies[q] = std::max(query_latencies[q], lat);
  }
  r.samples_completed = latencies.size();
  if (multi) {
    r.lost_queries = static_cast<std::uint64_t>(std::count(query_lost.begin(), query_lost.end(), 1));
    std::vector<double> kept;
    kept.reserve(query_latencies.size());
    for (std::size_t q = 0; q < query_latencies.size(); ++q)
      if (!query_lost[q]) kept.push_back(query_latencies[q]);
    query_latencies.swap(kept);
  } else {
    r.lost_queries = s_.scenario == Scenario::offline ? (r.lost_samples > 0 ? 1 : 0) : r.lost_samples;
  }
  r.last_completion_s = seconds(last_done);
  const double last_sched_s = sched_ns_.empty() ? 0.0 : seconds(sched_ns_.back());
  switch (s_.scenario) {  // LoadGen's MinDurationMet
    case Scenario::single_stream:
    case Scenario::multi_stream: r.duration_s = last_sched_s; break;  // the last query's issue time
    case Scenario::server: r.duration_s = last_sched_s; break;        // the last query's scheduled time
    case Scenario::offline: r.duration_s = r.last_completion_s; break;  // the longest latency
  }
  r.window_start_s = monotonic(start_);
  r.window_end_s = monotonic(start_) + std::max(r.last_completion_s, seconds(last_issue_ns_));
  if (r.last_completion_s > 0) r.completed_samples_per_s = static_cast<double>(r.samples_completed) / r.last_completion_s;
  const double sched_span = s_.scenario == Scenario::server ? last_sched_s : r.duration_s;
  if (sched_span > 0) r.scheduled_qps = static_cast<double>(r.queries_issued) / sched_span;

  // The statistics: early stopping reads order statistics, so it goes before describe() reorders.
  const double p = s_.target_percentile, c = s_.confidence;
  std::vector<Constraint>& cs = r.constraints;
  cs.push_back({"min_duration", r.duration_s >= s_.min_duration_s,
                "ran " + fmt(r.duration_s) + " s of a required " + fmt(s_.min_duration_s) + " s"});
  if (s_.scenario == Scenario::offline)
    cs.push_back({"min_sample_count", r.samples_issued >= s_.min_query_count,
                  std::to_string(r.samples_issued) + " samples of a required " + std::to_string(s_.min_query_count)});
  else
    cs.push_back({"min_query_count", r.queries_issued >= s_.min_query_count,
                  std::to_string(r.queries_issued) + " queries of a required " + std::to_string(s_.min_query_count)});

  std::vector<double>& per_query = multi ? query_latencies : latencies;
  const std::uint64_t n = per_query.size();
  if (s_.scenario == Scenario::single_stream || s_.scenario == Scenario::multi_stream) {
    const std::uint64_t t = early_stopping_overlatency(n, p, c);
    r.early_stopping_met = t >= 1;
    r.queries_needed = early_stopping_min_queries(p, c);
    if (r.early_stopping_met) r.early_stopping_latency_s = kth(per_query, n - t);
    cs.push_back({"early_stopping", r.early_stopping_met,
                  r.early_stopping_met
                      ? std::to_string(n) + " queries: the p" + fmt(p * 100) + " estimate discards the " +
                            std::to_string(t - 1) + " slowest"
                      : "only " + std::to_string(n) + " completed queries; an estimate needs " +
                            std::to_string(r.queries_needed)});
  } else if (s_.scenario == Scenario::server) {
    const std::uint64_t over = static_cast<std::uint64_t>(std::count_if(
        latencies.begin(), latencies.end(), [&](double l) { return l > s_.latency_bound_s; }));
    const std::uint64_t t = over + r.lost_samples, total = r.queries_issued;
    const double q = 1.0 - p;
    r.overlatency_queries = t;
    // A fraction of overlatency queries at or above 1 - p can never pass: skip the O(t) sums.
    const bool reachable = static_cast<double>(t) < q * static_cast<double>(total);
    r.early_stopping_met = total > 0 && reachable && binomial_cdf(t, total, q) < 1.0 - c;
    r.queries_needed = reachable ? early_stopping_queries_needed(t, p, c) : 0;
    cs.push_back({"early_stopping", r.early_stopping_met,
                  std::to_string(t) + " of " + std::to_string(total) + " queries over the bound; " +
                      (reachable ? "passing needs at least " + std::to_string(r.queries_needed) + " queries"
                                 : "at least " + fmt(q * 100) + "% over it can never pass")});
  }
  // LoadGen's percentile at p of what the scenario judges (samples; multi-stream: queries).
  r.target_percentile_latency_s =
      n == 0 ? 0.0 : kth(per_query, std::min<std::size_t>(static_cast<std::size_t>(static_cast<double>(n) * p), n - 1));
  r.sample_latency = describe(latencies);
  if (multi) r.query_latency = describe(query_latencies);

  if (s_.scenario == Scenario::server || s_.latency_bound_s > 0) {
    // Server: the percentile itself (LoadGen's PerfConstraintsMet); the streams: the early-stopping estimate.
    const double at = s_.scenario != Scenario::server && r.early_stopping_met ? r.early_stopping_latency_s
                                                                                : r.target_percentile_latency_s;
    cs.push_back({"latency_bound", n > 0 && at <= s_.latency_bound_s,
                  "p" + fmt(p * 100) + " latency " + fmt(at * 1e3) + " ms against a bound of " +
                      fmt(s_.latency_bound_s * 1e3) + " ms"});
  }
  cs.push_back({"lost_queries", r.lost_samples == 0,
                std::to_string(r.lost_samples) + " of " + std::to_string(r.samples_issued) + " samples (" +
                    std::to_string(r.lost_queries) + " queries) never reported within " + fmt(s_.drain_timeout_s) +
                    " s of the last issue"});
  cs.push_back({"completion_errors", r.duplicate_completions + r.unknown_completions == 0,
                std::to_string(r.duplicate_completions) + " samples reported twice, " +
                    std::to_string(r.unknown_completions) + " reports of ids never issued"});
  cs.push_back({"sut_failure", r.sut_failure.empty(), r.sut_failure.empty() ? "none" : r.sut_failure});
  cs.push_back({"capacity", !capacity_hit_,
                capacity_hit_ ? "stopped at the per-run capacity of " + std::to_string(s_.max_samples) + " samples"
                              : "within " + std::to_string(s_.max_samples) + " samples"});
  cs.push_back({"interrupted", !interrupted_, interrupted_ ? "stopped by the user" : "ran to its end"});
  r.valid = std::all_of(cs.begin(), cs.end(), [](const Constraint& x) { return x.met; });
  if (!r.valid && !minimums_met(sched_ns_.empty() ? 0 : sched_ns_.back()) && Clock::now() >= deadline_)
    r.notes.push_back("issuing stopped at the timeout (" + fmt(s_.timeout_s) + " s) before the minimums were met");
  return r;
}

RunResult run_engine(SystemUnderTest& sut, std::span<const std::size_t> perf, const Settings& s,
                     const std::atomic<bool>* cancel, std::uint64_t offline_samples) {
  Engine e(sut, s, perf, cancel);
  return e.run(offline_samples);
}

}  // namespace

double probe_throughput(SystemUnderTest& sut, SampleLibrary& library, const Settings& settings,
                        const std::atomic<bool>* cancel) {
  Settings p = settings;
  p.scenario = Scenario::offline;
  p.samples_per_query = 1;
  p.min_duration_s = 0;
  const double want_s = std::clamp(0.05 * settings.min_duration_s, 0.02, 2.0);
  // A burst is at most 4x the last one, which took under want_s: a SUT that needs far longer lost samples.
  p.timeout_s = std::min(settings.timeout_s, std::max(1.0, 20 * want_s));
  const auto perf = performance_set(library.total_sample_count(), library.performance_sample_count(), p.library_seed);
  library.load_samples(perf);
  double rate = 0;
  for (std::uint64_t burst = 256; burst <= p.max_samples; burst *= 4) {
    const RunResult r = run_engine(sut, perf, p, cancel, burst);
    if (r.last_completion_s > 0) rate = static_cast<double>(r.samples_completed) / r.last_completion_s;
    if (r.interrupted || r.lost_samples > 0 || r.last_completion_s >= want_s) break;
  }
  library.unload_samples(perf);
  return rate;
}

RunResult run(SystemUnderTest& sut, SampleLibrary& library, const Settings& settings, const std::atomic<bool>* cancel) {
  check_settings(settings);
  if (settings.scenario == Scenario::server && settings.target_qps <= 0)
    throw UsageError("the server scenario runs at a target QPS: pass one, or search with find_peak_qps");
  std::vector<std::string> notes;
  // LoadGen's offline query: enough samples for the minimum duration at the expected rate, plus 10%.
  auto offline_size = [&](double qps, double margin) {
    const double want = std::ceil(qps * settings.min_duration_s * margin);
    std::uint64_t n = std::max<std::uint64_t>(settings.min_query_count,
                                              want > 1e18 ? std::uint64_t{1} << 62 : static_cast<std::uint64_t>(want));
    if (n > settings.max_samples) {
      notes.push_back("the query was capped at the per-run capacity of " + std::to_string(settings.max_samples) +
                      " samples (wanted " + std::to_string(n) + ")");
      n = settings.max_samples;
    }
    return n;
  };
  const bool probed = settings.scenario == Scenario::offline && settings.target_qps <= 0;
  std::uint64_t offline_samples = 0;
  if (settings.scenario == Scenario::offline) {
    double qps = settings.target_qps;
    if (probed) {
      qps = probe_throughput(sut, library, settings, cancel);
      notes.push_back("expected throughput from the probe: " + fmt(qps) + " samples/s");
    }
    offline_samples = offline_size(qps, 1.1);
  }
  const auto perf = performance_set(library.total_sample_count(), library.performance_sample_count(), settings.library_seed);
  library.load_samples(perf);
  RunResult r = run_engine(sut, perf, settings, cancel, offline_samples);
  // The probe's short bursts can underestimate a SUT that speeds up under a long query (a CPU SUT
  // whose threads settle, a GPU that clocks up): up to kReruns more runs, each sized from the rate
  // the last one reached (+20%) and at least 1.5x its size, while only the duration falls short.
  constexpr int kReruns = 3;
  for (int rerun = 0; rerun < kReruns && probed && r.failed() == std::vector<std::string>{"min_duration"} &&
                      offline_samples < settings.max_samples;
       ++rerun) {
    notes.push_back("the run of " + std::to_string(offline_samples) + " samples ended after " + fmt(r.duration_s) +
                    " s: rerun sized from its " + fmt(r.completed_samples_per_s) + " samples/s");
    offline_samples = std::min<std::uint64_t>(
        settings.max_samples,
        std::max(offline_samples + offline_samples / 2, offline_size(r.completed_samples_per_s, 1.2)));
    r = run_engine(sut, perf, settings, cancel, offline_samples);
  }
  library.unload_samples(perf);
  r.notes.insert(r.notes.begin(), notes.begin(), notes.end());
  return r;
}

}  // namespace ab::scenarios
