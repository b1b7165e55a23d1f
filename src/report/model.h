// Internal to src/report: a record seen by the report (status and quality flags), number
// formatting, the axis analysis that picks each workload's charts, and the measured ceilings.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/report.h"
#include "results/record.h"

namespace ab::report::detail {

// One record with what the report needs to know about its quality. Never owns the JSON record;
// shares its typed form, which readers use for every field the schema names.
struct Point {
  const nlohmann::json* rec = nullptr;
  std::shared_ptr<const results::Record> record;
  const Run* run = nullptr;
  std::string status;  // record status: ok, skipped, oom, diverged, invalid, error
  std::string reason;  // why not ok
  bool external = false;
  bool unconverged = false;  // time.converged false
  std::string stop_reason;
  bool noisy = false;  // time.rel_spread above the run's max_noise_pct / 100
  double rel_spread = 0, max_noise = 0.01;

  bool measured() const { return status == "ok"; }
  bool flagged() const { return !measured() || unconverged || noisy; }
  // "ok", "noisy", "unconverged", "unconverged+noisy", "external" (charts' shape legend)
  std::string quality() const;
  std::vector<std::string> badges() const;  // status first, then flags
  std::string explanation() const;          // reason and flags in words, "" for a clean ok point
  const nlohmann::json& params() const;
  std::string workload() const;
  const results::Record& typed() const { return *record; }
};

std::vector<Point> make_points(const Run& run);
// time.count, the number of timing samples, where the record has it.
std::optional<double> sample_count(const Point& p);
// Workload and axis values, numbers normalised (8192 == 8192.0): how points of runs are matched.
std::string point_key(const nlohmann::json& record);

// Dotted lookup (a number indexes an array: "telemetry.gpus.0.mean_sm_clock_mhz"): the value at
// at_path(rec, "metrics.fp8.fallback_reasons") (null where absent); a
// finite number num(rec, "rates.gbps"); a string; a boolean.
const nlohmann::json* at_path(const nlohmann::json& j, std::string_view dotted);
std::optional<double> num(const nlohmann::json& j, std::string_view dotted);
std::optional<std::string> str(const nlohmann::json& j, std::string_view dotted);
std::optional<bool> flag(const nlohmann::json& j, std::string_view dotted);

std::string fmt(double v, int significant = 4);  // 12.35, 0.0001234, 1.235e+09
std::string fmt_opt(const std::optional<double>& v, int significant = 4);
std::string fmt_param(const nlohmann::json& v);  // strings bare, numbers as written
std::string human_bytes(double bytes);           // "64 MiB"
std::string fmt_time(double seconds);            // "12.3 µs", "4.56 ms", "1.2 s"
std::string params_label(const nlohmann::json& params, const std::vector<std::string>& keys);

// Axes of one workload's points and the charts they allow.
struct AxisInfo {
  std::string name;
  bool integer = false;  // every value is an integer
  std::vector<nlohmann::json> values;  // distinct, sorted (numbers by value, before strings)
  bool constant = false;  // one value, which every point has: said once in the section's header, not per row
};
struct AxisPlan {
  std::vector<AxisInfo> axes;    // every axis seen, in first-seen order
  std::optional<std::string> x;  // the axis to plot against (log2), if one fits
  std::vector<std::string> series;  // axes that make separate lines (not x, not determined by x)
};
AxisPlan plan_axes(const std::vector<Point>& points);
const AxisInfo* find_axis(const AxisPlan& plan, std::string_view name);
// The axes that vary (the table columns and point labels) and "name=value" of the constant ones.
std::vector<std::string> varying_axes(const AxisPlan& plan);
std::string constant_axes_label(const AxisPlan& plan);
// Numbers by value (128 before 1024), then strings: how axis values sort everywhere in a report.
bool value_less(const nlohmann::json& a, const nlohmann::json& b);
// Points in the order of these axes' values, compared one axis after the other (the run first).
bool params_less(const Point& a, const Point& b, const std::vector<std::string>& keys, bool multi_run);

// Line label: the series axes' values, with the run's label first when several runs are shown.
std::string series_of(const Point& p, const AxisPlan& plan, bool multi_run);

// The rate a workload is judged by: samples/s where it has a batch axis, else the primary rate.
struct Metric {
  std::string path;  // "rates.gbps"
  std::string label; // "GB/s"
  std::optional<double> results::Rates::*field = nullptr;
  std::optional<double> of(const Point& p) const { return p.typed().rate_of(field); }
};
std::optional<Metric> rate_metric(const std::vector<Point>& points, const AxisPlan& plan);

// Table cells.
Cell text_cell(std::string text, std::string title = {});
Cell num_cell(const std::optional<double>& v, int significant = 4);
Cell status_cell(const Point& p);
// Columns for the leading part of every point table: run (if several), each axis that varies, status.
std::vector<std::string> point_columns(const AxisPlan& plan, bool multi_run);
std::vector<Cell> point_cells(const Point& p, const AxisPlan& plan, bool multi_run);

// A ceiling measured by the `ceilings` workload (or named in a point's rates.ceiling block).
struct Ceiling {
  std::string device_name, key, unit, source, status = "ok", reason;
  double value = 0;
};
std::vector<Ceiling> collect_ceilings(const std::vector<Run>& runs);

// Vega-Lite scaffolding shared by the chart builders.
nlohmann::json base_spec(const std::string& title);
nlohmann::json log2_scale_axis(const std::string& field, const std::string& title, bool bytes,
                               const std::vector<double>& ticks = {});

}  // namespace ab::report::detail
