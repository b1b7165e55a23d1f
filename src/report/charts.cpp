// Rate, latency and energy against the workload's x axis (log2), or per point where no axis fits.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "report/charts.h"

namespace ab::report::detail {
using nlohmann::json;

namespace {

const std::vector<std::string> kQualities = {"ok", "noisy", "unconverged", "unconverged+noisy", "external"};
const std::vector<std::string> kShapes = {"circle", "triangle-up", "diamond", "square", "triangle-down"};

std::optional<double> x_of(const Point& p, const std::string& axis) {
  const auto it = p.params().find(axis);
  if (it == p.params().end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!(v > 0)) return std::nullopt;
  return v;
}

// The axes a table and a label order points by: the series' axes, then x, then the rest that vary.
std::vector<std::string> order_keys(const AxisPlan& plan) {
  std::vector<std::string> keys = plan.series;
  if (plan.x) keys.push_back(*plan.x);
  for (const auto& a : varying_axes(plan))
    if (std::find(keys.begin(), keys.end(), a) == keys.end()) keys.push_back(a);
  return keys;
}

std::vector<const Point*> in_order(const ChartInput& in) {
  std::vector<const Point*> order;
  for (const auto& p : in.points) order.push_back(&p);
  const auto keys = order_keys(in.plan);
  std::stable_sort(order.begin(), order.end(),
                   [&](const Point* a, const Point* b) { return params_less(*a, *b, keys, in.multi_run); });
  return order;
}

// The lines' names in numeric order (k=128 before k=1024), for the legend.
json series_order(const ChartInput& in) {
  json names = json::array();
  for (const Point* p : in_order(in)) {
    const std::string s = series_of(*p, in.plan, in.multi_run);
    if (std::find(names.begin(), names.end(), json(s)) == names.end()) names.push_back(s);
  }
  return names;
}

std::string point_label(const Point& p, const AxisPlan& plan, bool multi_run) {
  std::string s = params_label(p.params(), varying_axes(plan));
  if (multi_run) s = p.run->label + (s.empty() ? "" : " " + s);
  return s.empty() ? p.workload() : s;
}

// The rows an x/y chart draws, and what it cannot.
struct XY {
  json measured = json::array(), unmeasured = json::array();
  std::vector<const Point*> not_measured, no_value;
  std::vector<std::string> qualities;
};

// `rows_of` turns one measured point into zero or more rows ({y, ...}); x, series, quality, point
// and note are added here.
template <class RowsOf>
XY collect_xy(const ChartInput& in, RowsOf rows_of) {
  XY d;
  std::set<std::string> q;
  for (const auto& p : in.points) {
    const auto x = x_of(p, *in.plan.x);
    const std::string label = point_label(p, in.plan, in.multi_run);
    if (!p.measured()) {
      d.not_measured.push_back(&p);
      if (x) d.unmeasured.push_back({{"x", *x}, {"point", label}, {"status", p.status}, {"note", p.explanation()}});
      continue;
    }
    std::vector<json> rows = x ? rows_of(p) : std::vector<json>{};
    if (rows.empty()) {
      d.no_value.push_back(&p);
      continue;
    }
    for (auto& r : rows) {
      r["x"] = *x;
      r["series"] = series_of(p, in.plan, in.multi_run);
      r["quality"] = p.quality();
      r["point"] = label;
      r["note"] = p.explanation();
      q.insert(p.quality());
      d.measured.push_back(std::move(r));
    }
  }
  for (const auto& name : kQualities)
    if (q.count(name)) d.qualities.push_back(name);
  return d;
}

json color_title(const ChartInput& in) {
  std::string t;
  if (in.multi_run) t = "run";
  for (const auto& s : in.plan.series) t += (t.empty() ? "" : " ") + s;
  return t.empty() ? json("series") : json(t);
}

json y_scale(const json& rows, const char* field) {
  double lo = 0, hi = 0;
  bool first = true;
  for (const auto& r : rows) {
    const double v = r.at(field).get<double>();
    if (!(v > 0)) return {{"zero", true}};
    lo = first ? v : std::min(lo, v);
    hi = first ? v : std::max(hi, v);
    first = false;
  }
  if (!first && hi / lo > 30) return {{"type", "log"}};
  return {{"zero", true}};
}

json xy_layers(const ChartInput& in, const XY& d, const json& x_enc, json y_enc, const json& y_tooltip,
               const std::optional<json>& dash = std::nullopt) {
  json layers = json::array();
  json color = {{"field", "series"}, {"type", "nominal"}, {"title", color_title(in)}, {"sort", series_order(in)}};
  std::set<std::string> series;
  for (const auto& r : d.measured) series.insert(r["series"].get<std::string>());
  if (series.size() <= 1) color["legend"] = nullptr;  // one line: its name is the chart's title
  json tooltip = json::array({{{"field", "point"}, {"title", "point"}}, y_tooltip,
                              {{"field", "quality"}, {"title", "quality"}}, {{"field", "note"}, {"title", "note"}}});
  if (dash) tooltip.push_back({{"field", dash->at("field")}, {"title", dash->at("title")}});
  if (!d.measured.empty()) {
    json line = {{"data", {{"values", d.measured}}},
                 {"mark", {{"type", "line"}, {"strokeWidth", 2}, {"opacity", 0.85}}},
                 {"encoding", {{"x", x_enc}, {"y", y_enc}, {"color", color}}}};
    if (dash) line["encoding"]["strokeDash"] = *dash;
    layers.push_back(std::move(line));
    json dots = {{"data", {{"values", d.measured}}},
                 {"mark", {{"type", "point"}, {"filled", true}, {"size", 70}, {"opacity", 1}}},
                 {"encoding",
                  {{"x", x_enc}, {"y", y_enc}, {"color", color}, {"shape", quality_shape(d.qualities)}, {"tooltip", tooltip}}}};
    layers.push_back(std::move(dots));
  }
  if (!d.unmeasured.empty()) {
    layers.push_back(
        {{"data", {{"values", d.unmeasured}}},
         {"mark", {{"type", "point"}, {"shape", "cross"}, {"filled", true}, {"size", 120}, {"color", "#c0392b"}, {"yOffset", -9}}},
         {"encoding",
          {{"x", x_enc},
           {"y", {{"value", "height"}}},
           {"tooltip", json::array({{{"field", "point"}, {"title", "point"}}, {{"field", "status"}, {"title", "status"}},
                                    {{"field", "note"}, {"title", "reason"}}})}}}});
  }
  return layers;
}

json x_encoding(const ChartInput& in) {
  const std::string& x = *in.plan.x;
  std::vector<double> ticks;
  if (const AxisInfo* a = find_axis(in.plan, x))
    for (const auto& v : a->values)
      if (v.is_number() && v.get<double>() > 0) ticks.push_back(v.get<double>());
  return log2_scale_axis("x", x + " (log2)", x.find("bytes") != std::string::npos, ticks);
}

// Leading cells plus the chart's own numbers, rows in series then x order.
Table point_table(const ChartInput& in, const std::string& caption, const std::vector<std::string>& value_cols,
                  const std::function<std::vector<Cell>(const Point&)>& values) {
  Table t;
  t.caption = caption;
  t.columns = point_columns(in.plan, in.multi_run);
  t.columns.insert(t.columns.end(), value_cols.begin(), value_cols.end());
  for (const Point* p : in_order(in)) {
    auto row = point_cells(*p, in.plan, in.multi_run);
    auto v = values(*p);
    row.insert(row.end(), v.begin(), v.end());
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::string with_note(const std::string& base, const XY& d) {
  std::string note = base;
  const std::string nd = not_drawn_note(d.not_measured, "as ✕ along the bottom of the plot where their x is known");
  if (!nd.empty()) note += " " + nd;
  if (!d.no_value.empty())
    note += " " + std::to_string(d.no_value.size()) + " measured point(s) have no value for this chart (see the table).";
  return note;
}

}  // namespace

json quality_shape(const std::vector<std::string>& present) {
  json domain = json::array(), range = json::array();
  for (std::size_t i = 0; i < kQualities.size(); ++i) {
    if (std::find(present.begin(), present.end(), kQualities[i]) == present.end()) continue;
    domain.push_back(kQualities[i]);
    range.push_back(kShapes[i]);
  }
  json enc = {{"field", "quality"}, {"type", "nominal"}, {"title", "quality"}, {"scale", {{"domain", domain}, {"range", range}}}};
  if (present.size() == 1 && present.front() == "ok") enc["legend"] = nullptr;  // nothing to tell apart
  return enc;
}

std::string not_drawn_note(const std::vector<const Point*>& unmeasured, const std::string& where) {
  if (unmeasured.empty()) return {};
  std::map<std::string, int> by_status;
  for (const Point* p : unmeasured) ++by_status[p->status];
  std::string s;
  for (const auto& [status, n] : by_status) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + status;
  return "Not measured: " + s + " — shown " + where + ", with the reason in the table.";
}

json merge_close_labels(const json& labels) {
  std::vector<json> sorted(labels.begin(), labels.end());
  std::sort(sorted.begin(), sorted.end(), [](const json& a, const json& b) { return a["y"].get<double>() > b["y"].get<double>(); });
  json out = json::array();
  for (auto& l : sorted) {
    if (!out.empty() && out.back()["y"].get<double>() <= l["y"].get<double>() * 1.05) {
      out.back()["text"] = out.back()["text"].get<std::string>() + " · " + l["text"].get<std::string>();
      continue;
    }
    out.push_back(l);
  }
  return out;
}

bool lines_fit(const ChartInput& in) {
  if (!in.plan.x) return false;
  std::map<std::string, int> per_series;
  for (const auto& p : in.points)
    if (x_of(p, *in.plan.x)) ++per_series[series_of(p, in.plan, in.multi_run)];
  if (per_series.empty() || per_series.size() > 12) return false;
  int total = 0;
  for (const auto& [s, n] : per_series) total += n;
  return total >= 2 * static_cast<int>(per_series.size());
}

std::optional<Chart> throughput_chart(const ChartInput& in, const Metric& metric, const std::vector<Ceiling>& ceilings) {
  if (!lines_fit(in)) return std::nullopt;
  XY d = collect_xy(in, [&metric](const Point& p) {
    const auto y = metric.of(p);
    return y ? std::vector<json>{{{"y", *y}}} : std::vector<json>{};
  });
  if (d.measured.empty()) return std::nullopt;  // nothing to draw: the section's table lists every point
  json y_enc = {{"field", "y"}, {"type", "quantitative"}, {"title", metric.label}, {"scale", y_scale(d.measured, "y")}};
  json spec = base_spec(in.workload + ": " + metric.label + " vs " + *in.plan.x);
  json layers = xy_layers(in, d, x_encoding(in), y_enc, {{"field", "y"}, {"title", metric.label}, {"format", ".4~g"}});

  // The measured ceilings these points are judged against, as dashed roofs.
  const bool memory = metric.path == "rates.gbps", compute = metric.path == "rates.tflops";
  std::set<std::string> devices, precisions;
  for (const auto& p : in.points) {
    if (!p.typed().device_name.empty()) devices.insert(p.typed().device_name);
    if (const auto pr = str(p.params(), "precision")) precisions.insert(*pr);
  }
  json roofs = json::array();
  std::string roof_note;
  std::vector<std::string> drawn;
  for (const auto& c : ceilings) {
    if (c.status != "ok" || c.value <= 0 || !devices.count(c.device_name)) continue;
    const bool is_memory = c.key.rfind("memory.", 0) == 0;
    const bool fits = memory ? is_memory
                             : compute && !is_memory && (precisions.empty() || precisions.count(c.key.substr(c.key.find('.') + 1)));
    if (!fits) continue;
    const std::string id = c.device_name + '\n' + c.key;
    if (std::find(drawn.begin(), drawn.end(), id) != drawn.end()) continue;  // one roof per key: the loaded runs' own measurement comes first
    drawn.push_back(id);
    roofs.push_back({{"y", c.value}, {"label", "ceiling " + c.key + " " + fmt(c.value) + " " + c.unit}, {"text", c.key + " " + fmt(c.value) + " " + c.unit},
                     {"source", c.source}});
    roof_note += (roof_note.empty() ? "" : "; ") + c.key + " = " + fmt(c.value) + " " + c.unit + " (" + c.source + ")";
  }
  if (!roofs.empty()) {
    layers.push_back({{"data", {{"values", roofs}}},
                      {"mark", {{"type", "rule"}, {"strokeDash", {6, 4}}, {"color", "#5f6368"}}},
                      {"encoding", {{"y", {{"field", "y"}, {"type", "quantitative"}}},
                                    {"tooltip", json::array({{{"field", "label"}}, {{"field", "source"}}})}}}});
    layers.push_back({{"data", {{"values", merge_close_labels(roofs)}}},
                      {"mark", {{"type", "text"}, {"align", "right"}, {"baseline", "bottom"}, {"dy", -3}, {"color", "#5f6368"}}},
                      {"encoding", {{"y", {{"field", "y"}, {"type", "quantitative"}}}, {"x", {{"value", "width"}}},
                                    {"text", {{"field", "text"}}}}}});
  }
  spec["layer"] = layers;

  const bool any_pct = std::any_of(in.points.begin(), in.points.end(),
                                   [](const Point& p) { return p.typed().rate_of(&results::Rates::pct_of_ceiling).has_value(); });
  std::vector<std::string> cols = {metric.label, "median time", "±95% CI", "samples"};
  if (any_pct) cols.push_back("% of ceiling");
  Chart c;
  c.title = metric.label + " vs " + *in.plan.x;
  c.note = with_note("One line per " + color_title(in).get<std::string>() + "; x on a log2 scale; the point's shape "
                     "shows its quality (circle: ok; triangle: noisy; diamond: did not converge; square: both; "
                     "inverted triangle: published figure)." +
                         (roof_note.empty() ? "" : " Dashed: measured ceiling " + roof_note + "."),
                     d);
  c.spec = std::move(spec);
  c.table = point_table(in, metric.label + " per point", cols, [&](const Point& p) {
    std::vector<Cell> v = {num_cell(metric.of(p)), text_cell(p.typed().time_of(&results::TimeStats::median_s) ? fmt_time(*p.typed().time_of(&results::TimeStats::median_s)) : "—"),
                           text_cell(p.typed().time_of(&results::TimeStats::rel_spread) ? "±" + fmt(*p.typed().time_of(&results::TimeStats::rel_spread) * 100, 3) + "%" : "—"),
                           num_cell(sample_count(p))};
    v[1].numeric = v[2].numeric = true;
    if (any_pct) v.push_back(num_cell(p.typed().rate_of(&results::Rates::pct_of_ceiling), 3));
    return v;
  });
  return c;
}

std::optional<Chart> per_point_chart(const ChartInput& in, const Metric& metric) {
  json measured = json::array(), unmeasured = json::array();
  std::vector<const Point*> not_measured;
  int no_value = 0;
  for (const Point* pp : in_order(in)) {
    const Point& p = *pp;
    const std::string label = point_label(p, in.plan, in.multi_run);
    if (!p.measured()) {
      not_measured.push_back(&p);
      unmeasured.push_back({{"point", label}, {"status", p.status}, {"note", p.explanation()}});
      continue;
    }
    const auto y = metric.of(p);
    if (!y) {
      ++no_value;
      continue;
    }
    measured.push_back({{"point", label}, {"y", *y}, {"series", in.multi_run ? p.run->label : p.quality()},
                        {"quality", p.quality()}, {"note", p.explanation()}});
  }
  if (measured.empty()) return std::nullopt;
  json spec = base_spec(in.workload + ": " + metric.label + " per point");
  // A fixed height of 20 px a bar, not {"step": 20}: a step height beside width "container" makes
  // Vega-Lite drop its fit and log a warning on every page.
  std::set<std::string> bars;
  for (const auto& r : measured) bars.insert(r["point"].get<std::string>());
  for (const auto& r : unmeasured) bars.insert(r["point"].get<std::string>());
  spec["height"] = 20 * static_cast<int>(bars.size());
  const json y_enc = {{"field", "point"}, {"type", "nominal"}, {"title", nullptr}, {"sort", nullptr},
                      {"axis", {{"labelLimit", 360}}}};
  json color = {{"field", "series"}, {"type", "nominal"}, {"title", in.multi_run ? "run" : "quality"}};
  json layers = json::array();
  if (!measured.empty())
    layers.push_back({{"data", {{"values", measured}}},
                      {"mark", {{"type", "bar"}, {"height", {{"band", 0.75}}}}},
                      {"encoding", {{"y", y_enc}, {"x", {{"field", "y"}, {"type", "quantitative"}, {"title", metric.label}}},
                                    {"color", color},
                                    {"opacity", {{"condition", {{"test", "datum.quality !== 'ok' && datum.quality !== 'external'"}, {"value", 0.5}}}, {"value", 1}}},
                                    {"tooltip", json::array({{{"field", "point"}}, {{"field", "y"}, {"title", metric.label}, {"format", ".4~g"}},
                                                             {{"field", "quality"}}, {{"field", "note"}}})}}}});
  if (!unmeasured.empty())
    layers.push_back({{"data", {{"values", unmeasured}}},
                      {"mark", {{"type", "text"}, {"align", "left"}, {"dx", 4}, {"color", "#c0392b"}, {"fontWeight", "bold"}}},
                      {"encoding", {{"y", y_enc}, {"x", {{"datum", 0}, {"type", "quantitative"}}}, {"text", {{"field", "status"}}},
                                    {"tooltip", json::array({{{"field", "point"}}, {{"field", "status"}}, {{"field", "note"}}})}}}});
  spec["layer"] = layers;
  Chart c;
  c.title = metric.label + " per point";
  c.note = "No axis of this workload makes a line (none is a numeric sweep with two or more points per line), so "
           "each point is a bar; faded bars did not converge or are noisy." +
           (not_measured.empty() ? std::string() : " " + not_drawn_note(not_measured, "by name in red")) +
           (no_value ? " " + std::to_string(no_value) + " measured point(s) have no " + metric.label + " (see the table)." : "");
  c.spec = std::move(spec);
  c.table = point_table(in, metric.label + " per point", {metric.label, "median time", "±95% CI"}, [&](const Point& p) {
    const auto t = p.typed().time_of(&results::TimeStats::median_s);
    const auto s = p.typed().time_of(&results::TimeStats::rel_spread);
    std::vector<Cell> v = {num_cell(metric.of(p)), text_cell(t ? fmt_time(*t) : "—"),
                           text_cell(s ? "±" + fmt(*s * 100, 3) + "%" : "—")};
    v[1].numeric = v[2].numeric = true;
    return v;
  });
  return c;
}

std::optional<Chart> latency_chart(const ChartInput& in) {
  if (!lines_fit(in) || *in.plan.x != "batch") return std::nullopt;
  double max_median = 0;
  for (const auto& p : in.points) max_median = std::max(max_median, p.typed().time_of(&results::TimeStats::median_s).value_or(0));
  if (max_median <= 0) return std::nullopt;
  const double scale = max_median < 1e-3 ? 1e6 : max_median < 1 ? 1e3 : 1;
  const std::string unit = max_median < 1e-3 ? "µs" : max_median < 1 ? "ms" : "s";
  static const std::pair<const char*, std::optional<double> results::TimeStats::*> kPct[] = {
      {"median", &results::TimeStats::median_s}, {"p90", &results::TimeStats::p90_s}, {"p99", &results::TimeStats::p99_s}};
  XY d = collect_xy(in, [scale](const Point& p) {
    std::vector<json> rows;
    for (const auto& [name, path] : kPct)
      if (const auto v = p.typed().time_of(path)) rows.push_back({{"y", *v * scale}, {"percentile", name}});
    return rows;
  });
  if (d.measured.empty()) return std::nullopt;
  const std::string label = "time per iteration (" + unit + ")";
  json y_enc = {{"field", "y"}, {"type", "quantitative"}, {"title", label}, {"scale", y_scale(d.measured, "y")}};
  const json dash = {{"field", "percentile"}, {"type", "nominal"}, {"title", "percentile"},
                     {"scale", {{"domain", {"median", "p90", "p99"}}}}};
  json spec = base_spec(in.workload + ": latency percentiles vs " + *in.plan.x);
  spec["layer"] = xy_layers(in, d, x_encoding(in), y_enc, {{"field", "y"}, {"title", label}, {"format", ".4~g"}}, dash);
  Chart c;
  c.title = "Latency percentiles vs " + *in.plan.x;
  c.note = with_note("Median, p90 and p99 of the per-iteration time (solid, dashed, dotted); x on a log2 scale.", d);
  c.spec = std::move(spec);
  c.table = point_table(in, "latency per point (" + unit + ")", {"median", "p90", "p99", "samples"}, [scale](const Point& p) {
    std::vector<Cell> v;
    for (const auto& [name, path] : kPct) {
      const auto t = p.typed().time_of(path);
      v.push_back(num_cell(t ? std::optional<double>(*t * scale) : std::nullopt));
    }
    v.push_back(num_cell(sample_count(p)));
    return v;
  });
  return c;
}

std::optional<Chart> energy_chart(const ChartInput& in) {
  const bool any = std::any_of(in.points.begin(), in.points.end(),
                               [](const Point& p) { return p.typed().telemetry_number("samples_per_j").has_value(); });
  if (!any || !lines_fit(in)) return std::nullopt;
  XY d = collect_xy(in, [](const Point& p) {
    const auto y = p.typed().telemetry_number("samples_per_j");
    return y ? std::vector<json>{{{"y", *y}}} : std::vector<json>{};
  });
  if (d.measured.empty()) return std::nullopt;
  json y_enc = {{"field", "y"}, {"type", "quantitative"}, {"title", "samples/J"}, {"scale", y_scale(d.measured, "y")}};
  json spec = base_spec(in.workload + ": samples per joule vs " + *in.plan.x);
  spec["layer"] = xy_layers(in, d, x_encoding(in), y_enc, {{"field", "y"}, {"title", "samples/J"}, {"format", ".4~g"}});
  Chart c;
  c.title = "Energy efficiency (samples/J) vs " + *in.plan.x;
  c.note = with_note("Samples processed in the measured window / device energy of the window (docs/TELEMETRY.md).", d);
  c.spec = std::move(spec);
  c.table = point_table(in, "energy per point", {"samples/J", "mean power (W)", "energy (J)", "method"}, [](const Point& p) {
    return std::vector<Cell>{num_cell(p.typed().telemetry_number("samples_per_j")), num_cell(p.typed().telemetry_number("mean_power_w")),
                             num_cell(p.typed().telemetry_number("energy_j")),
                             text_cell(str(p.typed().telemetry, "energy_method").value_or("—"))};
  });
  return c;
}

}  // namespace ab::report::detail
