// The server's search for its peak QPS: start at the probe's throughput, double or halve until one
// run passes and one fails, bisect to `search_precision`, then verify the highest passing QPS with
// a run at the full minimums (retrying at 0.95x when it fails). docs/METHODOLOGY.md.
#include <chrono>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "scenarios/scenarios.h"

namespace ab::scenarios {
namespace {

bool failed(const RunResult& r, const char* name) {
  for (const auto& c : r.constraints)
    if (c.name == name) return !c.met;
  return false;
}

// A failure less QPS cannot cure: the SUT misreported samples or broke, or lost samples while the
// ones it did finish met the bound (dropped, not stuck behind a backlog).
bool hard_failure(const RunResult& r) {
  return failed(r, "completion_errors") || failed(r, "sut_failure") ||
         (failed(r, "lost_queries") && !failed(r, "latency_bound"));
}

// The search as a whole holds to the settings' timeout: each run gets what is left of it.
class SearchClock {
 public:
  explicit SearchClock(double timeout_s) : start_(std::chrono::steady_clock::now()), timeout_s_(timeout_s) {}
  double left_s() const {
    return timeout_s_ - std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
  double timeout_s_;
};

SearchStep step_of(const RunResult& r, bool verification) {
  return {r.settings.target_qps, r.valid, r.sample_latency.p99, r.failed(), verification};
}

}  // namespace

SearchResult find_peak_qps(SystemUnderTest& sut, SampleLibrary& library, const Settings& settings,
                           const std::atomic<bool>* cancel) {
  check_settings(settings);
  if (settings.scenario != Scenario::server) throw UsageError("the QPS search applies to the server scenario only");
  const SearchClock clock(settings.timeout_s);
  SearchResult out;
  Settings trial = settings;
  trial.min_duration_s = settings.search_min_duration_s;
  trial.min_query_count = settings.search_min_query_count;
  // Below this rate a search run cannot issue its minimum queries within the timeout.
  const double floor_qps = static_cast<double>(trial.min_query_count) / settings.timeout_s;

  out.probe_samples_per_s = probe_throughput(sut, library, settings, cancel);
  double q = settings.target_qps > 0 ? settings.target_qps : out.probe_samples_per_s;
  if (!(q > 0)) q = std::max(1.0, 2 * floor_qps);
  double pass = 0, fail = std::numeric_limits<double>::infinity();
  RunResult last;
  bool have_last = false;
  for (int i = 0; i < settings.search_max_runs; ++i) {
    if (q < floor_qps) {
      out.stop_reason = "the QPS to try (" + std::to_string(q) + ") is below what a search run can measure within the timeout";
      break;
    }
    if (clock.left_s() <= trial.min_duration_s || clock.left_s() * q < static_cast<double>(trial.min_query_count)) {
      out.stop_reason = "the timeout (" + std::to_string(settings.timeout_s) + " s) ended the search";
      break;
    }
    trial.target_qps = q;
    trial.timeout_s = clock.left_s();
    try {
      last = run(sut, library, trial, cancel);
    } catch (const UsageError& e) {  // e.g. more samples than a run can hold: treat as too fast
      fail = q;
      q = pass > 0 ? (pass + fail) / 2 : q / 2;
      continue;
    }
    have_last = true;
    out.steps.push_back(step_of(last, false));
    if (last.interrupted) {
      out.stop_reason = "interrupted";
      break;
    }
    if (hard_failure(last)) {
      out.stop_reason = "the SUT failed at " + std::to_string(q) + " QPS (" + last.failed().front() + "): no QPS can pass";
      break;
    }
    (last.valid ? pass : fail) = q;
    if (pass > 0 && std::isfinite(fail) && (fail - pass) / pass <= settings.search_precision) {
      out.stop_reason = "bracketed within the search precision";
      break;
    }
    q = !std::isfinite(fail) ? q * 2 : (pass > 0 ? (pass + fail) / 2 : q / 2);
  }
  if (out.stop_reason.empty()) out.stop_reason = pass > 0 ? "search run limit reached" : "no QPS passed";

  // Verification at the full minimums.
  const bool stopped = !out.steps.empty() && (last.interrupted || hard_failure(last));
  if (pass > 0 && !stopped) {
    Settings full = settings;
    bool verified_any = false;
    for (int a = 0; a < settings.verify_attempts && clock.left_s() > settings.min_duration_s; ++a) {
      verified_any = true;
      full.target_qps = pass;
      full.timeout_s = clock.left_s();
      out.final = run(sut, library, full, cancel);
      out.steps.push_back(step_of(out.final, true));
      if (out.final.valid) {
        out.found = true;
        out.peak_qps = pass;
        break;
      }
      if (out.final.interrupted || hard_failure(out.final)) break;
      pass *= 0.95;
    }
    if (!verified_any) {
      out.final = last;
      out.final.notes.push_back("the timeout left no time for a verification run; the last search run is reported");
    } else if (!out.found) {
      out.final.notes.push_back("no verification run passed; the last one is reported");
    }
  } else if (have_last) {
    out.final = last;
    out.final.notes.push_back("no QPS met the constraints (" + out.stop_reason + "); the last search run is reported");
  } else {
    Settings full = settings;
    full.target_qps = std::max(q, floor_qps);
    full.timeout_s = std::max(clock.left_s(), full.min_duration_s + 1e-3);  // the report needs one run
    out.final = run(sut, library, full, cancel);
    out.final.notes.push_back("the search ran nothing (" + out.stop_reason + "); one run at the floor QPS is reported");
  }
  return out;
}

}  // namespace ab::scenarios
