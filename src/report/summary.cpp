// The terminal summary: the tables `accelbench run` prints at its end and `accelbench results`
// shows for a stored run. One table per workload (per scenario metric for loadgen): the axes that
// are the same on every point said once above it, the ones that vary as columns in declaration
// order, then the workload's own figures (nccl-tests and MLPerf style where those are the anchors).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "report/report.h"
#include "results/derived.h"
#include "results/output.h"
#include "results/text.h"

namespace ab::report {
namespace {

using results::Record;
using Cells = std::vector<std::string>;

struct Column {
  std::string header;
  bool right = true;  // numbers right-aligned, words left
};

struct Table {
  std::vector<Column> columns;
  std::vector<Cells> rows;
};

void print_table(std::ostream& out, const Table& t) {
  std::vector<std::size_t> width(t.columns.size());
  for (std::size_t c = 0; c < t.columns.size(); ++c) {
    width[c] = t.columns[c].header.size();
    for (const auto& row : t.rows) width[c] = std::max(width[c], row[c].size());
  }
  const auto line = [&](const auto& cell_of) {
    std::string text = " ";
    for (std::size_t c = 0; c < t.columns.size(); ++c) {
      const std::string cell = cell_of(c);
      const std::string pad(width[c] - cell.size(), ' ');
      text += "  " + (t.columns[c].right ? pad + cell : cell + pad);
    }
    text.erase(text.find_last_not_of(' ') + 1);
    out << text << '\n';
  };
  line([&](std::size_t c) { return t.columns[c].header; });
  for (const auto& row : t.rows) line([&](std::size_t c) { return row[c]; });
}

std::string number_text(double v) {
  std::ostringstream s;
  s << std::setprecision(4) << v;
  return s.str();
}

std::string percent_text(double fraction_pct, int digits = 1) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << fraction_pct << "%";
  return s.str();
}

// A whole number stored as a float (target_qps 0.0) reads as the integer it is, as --axis took it.
std::string axis_text(const nlohmann::json& v) {
  if (v.is_string()) return results::terminal_safe(v.get<std::string>());
  if (v.is_number_float() && std::abs(v.get<double>()) < 1e15 && v.get<double>() == std::trunc(v.get<double>()))
    return std::to_string(static_cast<std::int64_t>(v.get<double>()));
  return results::terminal_safe(v.dump());
}

// The points of one table: one workload, and for loadgen one scenario metric (each has its header).
struct Group {
  std::string workload, metric;  // metric: the scenario's metric name; "" for other workloads
  std::vector<const Record*> records;
};

// The scenario's metric name ("metric" where the record names none); "" for other workloads.
std::string scenario_metric(const Record& r) {
  if (!r.scenario.is_object()) return "";
  const std::string name =
      r.scenario.contains("metric") && r.scenario["metric"].is_object() ? r.scenario["metric"].value("name", "") : "";
  return name.empty() ? "metric" : name;
}

std::vector<Group> group_records(const std::vector<Record>& records) {
  std::vector<Group> groups;
  for (const auto& r : records) {
    const std::string metric = scenario_metric(r);
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const Group& x) { return x.workload == r.workload && x.metric == metric; });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{r.workload, metric, {}});
    g->records.push_back(&r);
  }
  return groups;
}

// The group's axes: the workload's declaration order where it is known, then any others by name.
std::vector<std::string> axis_names(const Group& g, const AxisOrder& order) {
  std::vector<std::string> names;
  const auto add = [&](const std::string& n) {
    if (std::find(names.begin(), names.end(), n) != names.end()) return;
    for (const Record* r : g.records)
      if (r->params.contains(n)) return names.push_back(n);
  };
  if (const auto it = order.find(g.workload); it != order.end())
    for (const auto& n : it->second) add(n);
  for (const Record* r : g.records)
    for (const auto& [k, v] : r->params.items()) add(k);
  return names;
}

bool varies(const Group& g, const std::string& axis) {
  const nlohmann::json& first = g.records.front()->params;
  for (const Record* r : g.records)
    if (!r->params.contains(axis) || !first.contains(axis) || r->params[axis] != first[axis]) return true;
  return false;
}

// Rows in the order of their varying axes: numbers numerically, words in the order they first came.
void sort_rows(Group& g, const std::vector<std::string>& varying) {
  std::map<std::string, std::vector<nlohmann::json>> seen;
  for (const auto& axis : varying)
    for (const Record* r : g.records) {
      const nlohmann::json v = r->params.value(axis, nlohmann::json());
      auto& list = seen[axis];
      if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
    }
  const auto less = [&](const Record* a, const Record* b) {
    for (const auto& axis : varying) {
      const nlohmann::json va = a->params.value(axis, nlohmann::json()), vb = b->params.value(axis, nlohmann::json());
      if (va == vb) continue;
      if (va.is_number() && vb.is_number()) return va.get<double>() < vb.get<double>();
      const auto& list = seen[axis];
      return std::find(list.begin(), list.end(), va) < std::find(list.begin(), list.end(), vb);
    }
    return false;
  };
  std::stable_sort(g.records.begin(), g.records.end(), less);
}

// What ended the point: the stopping rule's reason for a measured point, else why it has no result.
std::string stop_text(const Record& r) {
  if (!r.ok() && !r.reason.empty()) return results::terminal_safe(r.reason);
  if (r.time && r.time->stop_reason) return results::terminal_safe(*r.time->stop_reason);
  return "";
}

bool unconverged(const Record& r) { return r.time && r.time->converged && !*r.time->converged; }

std::string noise_text(const Record& r) {
  const auto spread = r.time_of(&results::TimeStats::rel_spread);
  if (!spread) return "";
  return percent_text(*spread * 100) + (unconverged(r) ? "!" : "");
}

std::string seconds_text(std::optional<double> s) { return s ? results::format_seconds(*s) : ""; }

std::string rate_text(const Record& r) {
  if (!r.rates) return "";
  if (r.rates->primary == "tflops" && r.rates->tflops) {
    const double t = *r.rates->tflops;
    const std::string unit = r.counts && r.counts->ops_unit == "OP" ? "OP/s" : "FLOP/s";
    return t >= 1 ? number_text(t) + " T" + unit : number_text(t * 1e3) + " G" + unit;
  }
  if (r.rates->gbps) return number_text(*r.rates->gbps) + " GB/s";
  if (r.rates->samples_per_s) return number_text(*r.rates->samples_per_s) + " /s";
  return "";
}

// Each kind of workload's own figures: the columns after the axes and the status.
struct Figures {
  std::vector<Column> columns;
  std::function<Cells(const Record&)> cells;
};

std::string metric_header(const std::string& name) {
  std::string h = name;
  if (h.size() > 6 && h.ends_with("_per_s")) h = h.substr(0, h.size() - 6) + "/s";
  else if (h.size() > 2 && h.ends_with("_s")) h = h.substr(0, h.size() - 2);
  std::replace(h.begin(), h.end(), '_', ' ');
  return h;
}

// LoadGen's shape: the scenario's metric, the sample latency percentiles, VALID or INVALID.
Figures scenario_figures(const std::string& metric) {
  const bool is_latency = !metric.ends_with("_per_s");
  std::vector<Column> cols = {{metric_header(metric)}, {"p50"}, {"p99"}};
  if (is_latency) cols.push_back({"samples/s"});
  cols.push_back({"result", false});
  return {cols, [is_latency](const Record& r) {
            const nlohmann::json& sc = r.scenario;
            const nlohmann::json lat = sc.value("latency_s", nlohmann::json::object());
            const double value =
                sc.contains("metric") && sc["metric"].is_object() ? sc["metric"].value("value", 0.0) : 0.0;
            Cells c = {is_latency ? results::format_seconds(value) : number_text(value),
                       results::format_seconds(lat.value("p50", 0.0)), results::format_seconds(lat.value("p99", 0.0))};
            if (is_latency) c.push_back(number_text(sc.value("completed_samples_per_s", 0.0)));
            c.push_back(results::terminal_safe(sc.value("result", "")));
            return c;
          }};
}

// nccl-tests' columns: time, algbw, busbw, #wrong (the check counts wrong elements).
Figures collective_figures() {
  return {{{"time"}, {"algbw GB/s"}, {"busbw GB/s"}, {"#wrong"}, {"noise"}}, [](const Record& r) {
            const auto gbps = [&](const char* key) {
              const auto v = r.metric(key);
              return v ? number_text(*v) : std::string();
            };
            std::string wrong;
            if (r.check.is_object() && r.check.contains("rel_error"))
              wrong = number_text(r.check["rel_error"].get<double>());
            return Cells{seconds_text(r.time_of(&results::TimeStats::median_s)), gbps("algbw_gbps"), gbps("busbw_gbps"),
                         wrong, noise_text(r)};
          }};
}

// Training and inference: throughput in the model's samples (images, or tokens for language
// models) with the latency of one step or batch.
Figures model_figures(const std::string& noun) {
  return {{{noun + "/s"}, {"p50"}, {"p99"}, {"TFLOP/s"}, {"noise"}}, [noun](const Record& r) {
            const auto rate =
                noun == "tokens" ? r.rate_of(&results::Rates::tokens_per_s) : r.rate_of(&results::Rates::samples_per_s);
            const auto tflops = r.rate_of(&results::Rates::tflops);
            return Cells{rate ? number_text(*rate) : "", seconds_text(r.time_of(&results::TimeStats::median_s)),
                         seconds_text(r.time_of(&results::TimeStats::p99_s)), tflops ? number_text(*tflops) : "",
                         noise_text(r)};
          }};
}

Figures kernel_figures() {
  return {{{"median"}, {"rate"}, {"% ceil"}, {"noise"}}, [](const Record& r) {
            return Cells{seconds_text(r.time_of(&results::TimeStats::median_s)), rate_text(r),
                         results::pct_of_ceiling_text(r), noise_text(r)};
          }};
}

// The workloads whose samples are images (a sample is otherwise named by its rate).
bool images_are_samples(const std::string& workload) { return workload == "train" || workload == "infer"; }

Figures figures_for(const Group& g) {
  if (!g.metric.empty()) return scenario_figures(g.metric);
  const auto any = [&](const auto& has) {
    return std::any_of(g.records.begin(), g.records.end(), [&](const Record* r) { return has(*r); });
  };
  if (any([](const Record& r) { return r.metric("busbw_gbps").has_value(); })) return collective_figures();
  if (any([](const Record& r) { return r.rate_of(&results::Rates::tokens_per_s).has_value(); }))
    return model_figures("tokens");
  if (images_are_samples(g.workload)) return model_figures("images");
  return kernel_figures();
}

// Every point of the table skipped: "copy: 12 points skipped: REASON (10); REASON (2)", the
// reasons in the order they came (a step that does not apply to the device is one line, not 12).
std::optional<std::string> all_skipped_line(const Group& g) {
  std::vector<std::pair<std::string, std::size_t>> reasons;
  for (const Record* r : g.records) {
    if (r->status != results::Status::skipped) return std::nullopt;
    auto it = std::find_if(reasons.begin(), reasons.end(), [&](const auto& x) { return x.first == r->reason; });
    if (it == reasons.end()) reasons.emplace_back(r->reason, 1);
    else ++it->second;
  }
  const std::size_t n = g.records.size();
  std::string line = std::to_string(n) + (n == 1 ? " point" : " points") + " skipped: ";
  for (std::size_t i = 0; i < reasons.size(); ++i) {
    line += (i ? "; " : "") + results::terminal_safe(reasons[i].first);
    if (reasons.size() > 1) line += " (" + std::to_string(reasons[i].second) + ")";
  }
  return line;
}

bool print_group(std::ostream& out, Group g, const AxisOrder& order) {
  const std::vector<std::string> names = axis_names(g, order);
  std::vector<std::string> varying;
  std::string constant;
  for (const auto& n : names) {
    if (varies(g, n)) varying.push_back(n);
    else constant += " " + results::terminal_safe(n) + "=" + axis_text(g.records.front()->params[n]);
  }
  out << results::terminal_safe(g.workload) << (constant.empty() ? "" : ":" + constant);
  if (const auto skipped = all_skipped_line(g)) {
    out << (constant.empty() ? ": " : "; ") << *skipped << '\n';
    return false;
  }
  out << '\n';
  sort_rows(g, varying);
  const Figures figures = figures_for(g);
  Table t;
  for (const auto& n : varying) {
    const bool numbers = std::all_of(g.records.begin(), g.records.end(),
                                     [&](const Record* r) { return r->params.value(n, nlohmann::json()).is_number(); });
    t.columns.push_back({results::terminal_safe(n), numbers});
  }
  t.columns.push_back({"status", false});
  t.columns.insert(t.columns.end(), figures.columns.begin(), figures.columns.end());
  t.columns.push_back({"stop", false});
  bool flagged = false;
  for (const Record* r : g.records) {
    Cells row;
    for (const auto& n : varying) row.push_back(r->params.contains(n) ? axis_text(r->params[n]) : "-");
    row.push_back(std::string(results::to_string(r->status)));
    Cells fig = r->time || r->scenario.is_object() ? figures.cells(*r) : Cells(figures.columns.size());
    row.insert(row.end(), fig.begin(), fig.end());
    row.push_back(stop_text(*r));
    flagged = flagged || unconverged(*r);
    t.rows.push_back(std::move(row));
  }
  print_table(out, t);
  return flagged;
}

}  // namespace

void print_summary(std::ostream& out, const std::vector<results::Record>& records, const AxisOrder& axis_order) {
  bool flagged = false, first = true;
  for (const Group& g : group_records(records)) {
    if (!first) out << '\n';
    first = false;
    flagged = print_group(out, g, axis_order) || flagged;
  }
  if (flagged)
    out << "\n! = did not converge: the noise stayed above the target (--max-noise) until the reason in `stop` ended "
           "the point\n";
}

void print_summary(std::ostream& out, const std::vector<nlohmann::json>& records, const AxisOrder& axis_order) {
  std::vector<results::Record> typed;
  typed.reserve(records.size());
  for (const auto& r : records) typed.push_back(results::from_json(r));
  print_summary(out, typed, axis_order);
}

}  // namespace ab::report
