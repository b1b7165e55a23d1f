#include "harness/workload.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "dist/comm.h"
#include "harness/suggest.h"

namespace ab::harness {

State::State(const Point& point, backend::Backend& backend, const measure::Settings& settings,
             const std::atomic<bool>* cancel, OptionValues options)
    : point_(point), backend_(backend), settings_(settings), cancel_(cancel), options_(std::move(options)) {}

std::int64_t State::get_int(const std::string& axis) const {
  const std::string& v = point_.at(axis);
  std::int64_t out = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size()) throw UsageError("axis " + axis + ": '" + v + "' is not an integer");
  return out;
}

double State::get_real(const std::string& axis) const {
  const std::string& v = point_.at(axis);
  double out = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size()) throw UsageError("axis " + axis + ": '" + v + "' is not a number");
  return out;
}

const std::string& State::get_text(const std::string& axis) const { return point_.at(axis); }

const std::string& State::option_text(const std::string& name) const {
  const auto it = options_.find(name);
  if (it == options_.end()) throw Error("option '" + name + "' is not declared by this workload");
  return it->second;
}

std::int64_t State::option_int(const std::string& name) const {
  const std::string& v = option_text(name);
  std::int64_t out = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size()) throw UsageError("option " + name + ": '" + v + "' is not an integer");
  return out;
}

double State::option_real(const std::string& name) const {
  const std::string& v = option_text(name);
  double out = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size()) throw UsageError("option " + name + ": '" + v + "' is not a number");
  return out;
}

void State::skip(const std::string& reason) const { throw SkipPoint{reason}; }

void State::check(double rel_error, double tolerance, const std::string& what) {
  const bool passed = std::isfinite(rel_error) && rel_error <= tolerance;
  check_ = {{"what", what}, {"tolerance", tolerance}, {"passed", passed}};
  if (std::isfinite(rel_error)) check_["rel_error"] = rel_error;
  if (!passed) {
    std::ostringstream msg;
    msg << "result check failed (" << what << "): relative error " << rel_error << " above tolerance "
        << tolerance;
    throw CheckFailed{msg.str()};
  }
}

void State::exec(const std::function<void()>& iteration, int timed_ranks) { exec(iteration, settings_, timed_ranks); }

void State::exec(measure::IterationTimer& timer, const std::function<void()>& iteration) {
  result_ = measure::run(timer, iteration, settings_, cancel_);
}

void State::exec(const std::function<void()>& iteration, const measure::Settings& settings, int timed_ranks) {
  auto timer = backend_.make_timer();
  dist::Comm& comm = dist::world();
  if (comm.size() == 1) {
    result_ = measure::run(*timer, iteration, settings, cancel_);
    return;
  }
  dist::LockstepResult measured = dist::measure_lockstep(comm, *timer, iteration, settings, cancel_);
  result_ = std::move(measured.result);
  rank_times_ = std::move(measured.ranks);
  const std::size_t n = timed_ranks > 0 ? std::min(rank_times_.size(), static_cast<std::size_t>(timed_ranks))
                                        : rank_times_.size();
  std::vector<double> medians;  // the timed ranks' own time per iteration
  for (std::size_t r = 0; r < n; ++r) medians.push_back(rank_times_[r].median_s);
  if (medians.empty()) return;
  const auto [lo, hi] = std::minmax_element(medians.begin(), medians.end());
  add_metric("rank_step_time_s",
             {{"min", *lo},
              {"avg", std::accumulate(medians.begin(), medians.end(), 0.0) / static_cast<double>(medians.size())},
              {"max", *hi}});
}

std::optional<counters::Measurement> State::measure_counters(const std::vector<counters::Range>& ranges) {
  if (counter_session_ == nullptr) return std::nullopt;
  counters::Measurement m = counter_session_->measure(ranges);
  add_metric("counters", counters::counters_json(m, {counts_.flops, counts_.bytes}));
  return m;
}

std::optional<counters::Measurement> State::measure_counters(const std::function<void(counters::RangeMarks&)>& pass,
                                                             std::size_t max_ranges) {
  if (counter_session_ == nullptr) return std::nullopt;
  counters::Measurement m = counter_session_->measure_marked(pass, max_ranges, counters::L2State::as_left);
  add_metric("counters", counters::counters_json(m, {counts_.flops, counts_.bytes}));
  return m;
}

void State::counters_unavailable(const std::string& why) {
  if (counter_session_ != nullptr) add_metric("counters", counters::unavailable_json(counter_session_->set(), why));
}

Workload& Registry::find(const std::string& name) const {
  std::string valid;
  std::vector<std::string> names;
  for (const auto& w : workloads_) {
    if (w->name() == name) return *w;
    valid += (valid.empty() ? "" : ", ") + w->name();
    names.push_back(w->name());
  }
  throw UsageError("unknown workload '" + name + "'; valid: " + valid + did_you_mean(name, names));
}

}  // namespace ab::harness
