#include "harness/workload.h"

#include <charconv>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace ab::harness {

State::State(const Point& point, backend::Backend& backend, const measure::Settings& settings,
             const std::atomic<bool>* cancel)
    : point_(point), backend_(backend), settings_(settings), cancel_(cancel) {}

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

void State::exec(const std::function<void()>& iteration) { exec(iteration, settings_); }

void State::exec(measure::IterationTimer& timer, const std::function<void()>& iteration) {
  result_ = measure::run(timer, iteration, settings_, cancel_);
}

void State::exec(const std::function<void()>& iteration, const measure::Settings& settings) {
  auto timer = backend_.make_timer();
  result_ = measure::run(*timer, iteration, settings, cancel_);
}

Workload& Registry::find(const std::string& name) const {
  std::string valid;
  for (const auto& w : workloads_) {
    if (w->name() == name) return *w;
    valid += (valid.empty() ? "" : ", ") + w->name();
  }
  throw UsageError("unknown workload '" + name + "'; valid: " + valid);
}

}  // namespace ab::harness
