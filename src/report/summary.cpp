// The terminal summary: the table `accelbench run` prints at its end and `accelbench results` shows
// for a stored run, one line per point with status, median time, rate, % of ceiling and noise.
#include <iomanip>
#include <ostream>
#include <set>
#include <sstream>

#include "report/report.h"
#include "results/derived.h"
#include "results/output.h"
#include "results/text.h"

namespace ab::report {
namespace {

// The axes whose values differ between the records (what tells their lines apart).
std::set<std::string> varying_axes(const std::vector<results::Record>& records) {
  std::set<std::string> varying;
  if (records.empty()) return varying;
  const nlohmann::json& first = records.front().params;
  for (const auto& r : records)
    for (const auto& [k, v] : r.params.items())
      if (!first.contains(k) || first[k] != v) varying.insert(k);
  for (const auto& [k, v] : first.items())
    for (const auto& r : records)
      if (!r.params.contains(k)) varying.insert(k);
  return varying;
}

// The axes that vary between the run's points come first (a train point has 14 axes, and the
// column holds about 40 characters); within each group text axes (model, precision, op), which
// say most about a point, before numbers.
std::string point_text(const nlohmann::json& params, const std::set<std::string>& varying) {
  std::string parts[4];  // varying text, varying numbers, other text, other numbers
  for (const auto& [k, v] : params.items()) {
    std::string& part = parts[(varying.count(k) ? 0 : 2) + (v.is_string() ? 0 : 1)];
    part += (part.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  std::string joined;
  for (const std::string& part : parts)
    if (!part.empty()) joined += (joined.empty() ? "" : " ") + part;
  std::string point = results::terminal_safe(joined);
  if (point.size() > 43) point = point.substr(0, 40) + "...";
  return point;
}

// Scenario runs: the headline latency (server and offline: p99), the throughput, the verdict.
void scenario_cells(std::ostream& out, const nlohmann::json& sc) {
  const double latency = sc.value("name", "") == "single-stream" || sc.value("name", "") == "multi-stream"
                             ? sc["metric"].value("value", 0.0)
                             : sc["latency_s"].value("p99", 0.0);
  std::ostringstream rate;
  rate << std::setprecision(4) << sc.value("completed_samples_per_s", 0.0) << " /s";
  out << std::setw(12) << results::format_seconds(latency) << std::setw(16) << rate.str() << std::setw(10) << ""
      << std::setw(8) << results::terminal_safe(sc.value("result", "")) << '\n';
}

std::string rate_text(const results::Record& r) {
  std::ostringstream rate;
  rate << std::setprecision(4);
  if (!r.rates) return {};
  if (r.rates->primary == "tflops") {
    const double t = r.rates->tflops.value();
    const std::string unit = r.counts.value().ops_unit == "OP" ? "OP/s" : "FLOP/s";
    if (t >= 1) rate << t << " T" << unit;
    else rate << t * 1e3 << " G" << unit;
  } else if (r.rates->gbps) {
    rate << *r.rates->gbps << " GB/s";
  }
  return rate.str();
}

}  // namespace

void print_summary(std::ostream& out, const std::vector<results::Record>& records) {
  out << std::left << std::setw(12) << "workload" << std::setw(44) << "point" << std::setw(9) << "status"
      << std::right << std::setw(12) << "median" << std::setw(16) << "rate" << std::setw(10) << "% ceil"
      << std::setw(8) << "noise" << '\n';
  const std::set<std::string> varying = varying_axes(records);
  for (const auto& r : records) {
    out << std::left << std::setw(12) << results::terminal_safe(r.workload) << std::setw(44)
        << point_text(r.params, varying) << std::setw(9) << results::to_string(r.status) << std::right;
    if (r.scenario.is_object()) {
      scenario_cells(out, r.scenario);
      continue;
    }
    if (!r.time) {
      out << '\n';
      continue;
    }
    out << std::setw(12) << results::format_seconds(r.time->median_s.value()) << std::setw(16) << rate_text(r);
    std::ostringstream noise;
    noise << std::fixed << std::setprecision(1) << r.time->rel_spread.value() * 100 << "%" << (r.time->converged.value() ? "" : "!");
    out << std::setw(10) << results::pct_of_ceiling_text(r) << std::setw(8) << noise.str() << '\n';
  }
}

void print_summary(std::ostream& out, const std::vector<nlohmann::json>& records) {
  std::vector<results::Record> typed;
  typed.reserve(records.size());
  for (const auto& r : records) typed.push_back(results::from_json(r));
  print_summary(out, typed);
}

}  // namespace ab::report
