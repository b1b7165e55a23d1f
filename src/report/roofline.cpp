// Charts that relate points to each other or to the machine: the roofline of the measured ceilings,
// precision speed-ups over fp32, and scaling efficiency over GPU count.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "report/charts.h"
#include "results/derived.h"

namespace ab::report::detail {
using nlohmann::json;

namespace {

// Params without one axis, as a stable key and a label (the run first when several are shown).
std::pair<std::string, std::string> group_of(const Point& p, const std::string& without, const AxisPlan& plan, bool multi_run) {
  json rest = p.params();
  rest.erase(without);
  std::vector<std::string> keys;
  for (const auto& a : plan.axes)
    if (a.name != without) keys.push_back(a.name);
  std::string label = params_label(rest, keys);
  if (multi_run) label = p.run->label + (label.empty() ? "" : " " + label);
  return {p.run->id + '\n' + p.run->label + '\n' + rest.dump(), label.empty() ? "all" : label};
}

json cross_tooltip() {
  return json::array({{{"field", "point"}, {"title", "point"}}, {{"field", "status"}}, {{"field", "note"}, {"title", "reason"}}});
}

}  // namespace

std::optional<Chart> precision_chart(const ChartInput& in, const Metric& metric) {
  const AxisInfo* axis = find_axis(in.plan, "precision");
  if (!axis || axis->values.size() < 2 || std::find(axis->values.begin(), axis->values.end(), json("fp32")) == axis->values.end())
    return std::nullopt;
  std::map<std::string, const Point*> base;
  for (const auto& p : in.points)
    if (str(p.params(), "precision") == "fp32") base[group_of(p, "precision", in.plan, in.multi_run).first] = &p;

  json bars = json::array(), crosses = json::array();
  std::vector<const Point*> rows;
  std::set<std::string> qualities;
  for (const auto& p : in.points) {
    const auto prec = str(p.params(), "precision");
    if (!prec || *prec == "fp32") continue;
    rows.push_back(&p);
    const auto [key, label] = group_of(p, "precision", in.plan, in.multi_run);
    const auto b = base.find(key);
    const Point* bp = b == base.end() ? nullptr : b->second;
    const auto rate = p.measured() ? metric.of(p) : std::nullopt;
    const auto base_rate = bp && bp->measured() ? metric.of(*bp) : std::nullopt;
    if (rate && base_rate && *base_rate > 0) {
      const std::string quality = bp->flagged() && p.quality() == "ok" ? bp->quality() : p.quality();
      qualities.insert(quality);
      bars.push_back({{"group", label}, {"precision", *prec}, {"y", *rate / *base_rate}, {"quality", quality},
                      {"point", label + " " + *prec}, {"note", p.explanation()}});
    } else {
      std::string why = !p.measured() ? p.status : !bp ? "no fp32 point" : !bp->measured() ? "fp32 " + bp->status : "no rate";
      crosses.push_back({{"group", label}, {"precision", *prec}, {"point", label + " " + *prec}, {"status", why},
                         {"note", !p.measured() ? p.explanation() : bp ? bp->explanation() : "no fp32 point with these axis values"}});
    }
  }
  if (bars.empty()) return std::nullopt;  // no precision has a speed-up to draw: the section says why
  json spec = base_spec(in.workload + ": speed-up over fp32 (" + metric.label + ")");
  const json x = {{"field", "group"}, {"type", "nominal"}, {"title", nullptr}, {"sort", nullptr},
                  {"axis", {{"labelAngle", -30}, {"labelLimit", 220}}}};
  const json y = {{"field", "y"}, {"type", "quantitative"}, {"title", "speed-up over fp32 (×)"}};
  json layers = json::array();
  if (!bars.empty())
    layers.push_back({{"data", {{"values", bars}}}, {"mark", {{"type", "bar"}}},
                      {"encoding", {{"x", x}, {"xOffset", {{"field", "precision"}}}, {"y", y},
                                    {"color", {{"field", "precision"}, {"type", "nominal"}, {"title", "precision"}}},
                                    {"opacity", {{"condition", {{"test", "datum.quality !== 'ok' && datum.quality !== 'external'"}, {"value", 0.5}}}, {"value", 1}}},
                                    {"tooltip", json::array({{{"field", "point"}}, {{"field", "y"}, {"title", "speed-up"}, {"format", ".3~g"}},
                                                             {{"field", "quality"}}, {{"field", "note"}}})}}}});
  if (!crosses.empty())
    layers.push_back({{"data", {{"values", crosses}}},
                      {"mark", {{"type", "point"}, {"shape", "cross"}, {"filled", true}, {"size", 110}, {"color", "#c0392b"}}},
                      {"encoding", {{"x", x}, {"xOffset", {{"field", "precision"}}}, {"y", {{"datum", 0}, {"type", "quantitative"}}},
                                    {"tooltip", cross_tooltip()}}}});
  layers.push_back({{"data", {{"values", json::array({json::object()})}}},
                    {"mark", {{"type", "rule"}, {"strokeDash", {4, 4}}, {"color", "#5f6368"}}},
                    {"encoding", {{"y", {{"datum", 1}, {"type", "quantitative"}}}}}});
  spec["layer"] = layers;

  Chart c;
  c.title = "Precision speed-up over fp32";
  c.note = "Each precision's " + metric.label + " divided by the fp32 point with the same other axis values; the dashed "
           "line is 1×. Faded bars: the point or its fp32 baseline did not converge or is noisy." +
           (crosses.empty() ? std::string() : " " + std::to_string(crosses.size()) + " point(s) have no speed-up (✕ at 0; reason in the table).");
  c.spec = std::move(spec);
  c.table.caption = "speed-up over fp32 per point";
  c.table.columns = point_columns(in.plan, in.multi_run);
  for (const std::string& col : std::vector<std::string>{metric.label, "fp32 " + metric.label, "speed-up (×)"}) c.table.columns.push_back(col);
  for (const Point* p : rows) {
    auto cells = point_cells(*p, in.plan, in.multi_run);
    const auto b = base.find(group_of(*p, "precision", in.plan, in.multi_run).first);
    const Point* bp = b == base.end() ? nullptr : b->second;
    const auto rate = p->measured() ? metric.of(*p) : std::nullopt;
    const auto base_rate = bp && bp->measured() ? metric.of(*bp) : std::nullopt;
    cells.push_back(num_cell(rate));
    Cell bc = num_cell(base_rate);
    if (bp && bp->flagged()) bc.badges = bp->badges(), bc.title = bp->explanation();
    if (!bp) bc = text_cell("no fp32 point");
    cells.push_back(bc);
    cells.push_back(num_cell(rate && base_rate && *base_rate > 0 ? std::optional<double>(*rate / *base_rate) : std::nullopt, 3));
    c.table.rows.push_back(std::move(cells));
  }
  return c;
}

std::optional<Chart> roofline_chart(const ChartInput& in, const std::vector<Ceiling>& ceilings) {
  json dots = json::array(), crosses = json::array();
  std::vector<const Point*> rows, not_measured;
  std::set<std::string> devices, precisions, qualities, colors;
  int no_flops = 0;
  double lo = 0, hi = 0;
  const bool by_precision = find_axis(in.plan, "precision") != nullptr;
  auto color_of = [&](const Point& p) {
    std::string s = by_precision ? "precision=" + str(p.params(), "precision").value_or("?") : series_of(p, in.plan, false);
    return in.multi_run ? p.run->label + " " + s : s;
  };
  for (const auto& p : in.points) {
    const auto& counts = p.typed().counts;
    const auto intensity = counts ? results::arithmetic_intensity(counts->flops, counts->bytes) : std::nullopt;
    const bool placed = intensity && *intensity > 0 && std::isfinite(*intensity);
    if (p.measured() && !placed) {
      if (p.typed().rate_of(&results::Rates::tflops) || counts) ++no_flops;
      continue;
    }
    if (!p.measured() && !placed) {
      rows.push_back(&p);
      not_measured.push_back(&p);
      continue;
    }
    const double ai = *intensity;
    rows.push_back(&p);
    if (!p.typed().device_name.empty()) devices.insert(p.typed().device_name);
    if (const auto pr = str(p.params(), "precision")) precisions.insert(*pr);
    const std::string label = params_label(p.params(), [&] {
      std::vector<std::string> k;
      for (const auto& a : in.plan.axes) k.push_back(a.name);
      return k;
    }());
    const auto tf = p.typed().rate_of(&results::Rates::tflops);
    if (!p.measured() || !tf) {
      if (!p.measured()) not_measured.push_back(&p);
      crosses.push_back({{"x", ai}, {"point", label}, {"status", p.status}, {"note", p.explanation()}});
    } else {
      qualities.insert(p.quality());
      colors.insert(color_of(p));
      dots.push_back({{"x", ai}, {"y", *tf}, {"series", color_of(p)}, {"quality", p.quality()}, {"point", label},
                      {"note", p.explanation()}, {"gbps", p.typed().rate_of(&results::Rates::gbps).value_or(0)}});
    }
    lo = lo == 0 ? ai : std::min(lo, ai);
    hi = std::max(hi, ai);
  }
  if (dots.empty()) return std::nullopt;  // nothing measured to place

  // Roofs per device: min(peak, AI x bandwidth), drawn over the points' range widened to show the ridge.
  struct Roof {
    std::string device;
    double bw = 0;
    std::string bw_source;
    std::vector<const Ceiling*> peaks;
  };
  std::vector<Roof> machine;
  std::string roof_note;
  for (const auto& device : devices) {
    Roof r{device, 0, {}, {}};
    for (const auto& c : ceilings) {
      if (c.device_name != device || c.status != "ok" || c.value <= 0) continue;
      if (c.key == "memory.bandwidth" && c.value > r.bw) r.bw = c.value, r.bw_source = c.source;  // the best
      const std::string prec = c.key.rfind("gemm.", 0) == 0 ? c.key.substr(5) : "";
      if (!prec.empty() && (precisions.empty() || precisions.count(prec)) &&
          std::none_of(r.peaks.begin(), r.peaks.end(), [&c](const Ceiling* x) { return x->key == c.key; }))
        r.peaks.push_back(&c);
    }
    if (r.bw > 0) roof_note += (roof_note.empty() ? "" : "; ") + device + " memory " + fmt(r.bw) + " GB/s (" + r.bw_source + ")";
    for (const Ceiling* c : r.peaks) {
      roof_note += (roof_note.empty() ? "" : "; ") + device + " " + c->key + " " + fmt(c->value) + " " + c->unit + " (" + c->source + ")";
      if (r.bw > 0) {
        const double ridge = c->value * 1e3 / r.bw;  // FLOP/B where AI x bandwidth meets the peak
        lo = std::min(lo, ridge / 2);
        hi = std::max(hi, ridge * 2);
      }
    }
    machine.push_back(std::move(r));
  }
  lo /= 4;
  hi *= 4;
  json roofs = json::array(), labels = json::array(), mem_labels = json::array();
  for (const auto& r : machine) {
    const std::string prefix = devices.size() > 1 ? r.device + " " : "";
    for (const Ceiling* c : r.peaks) {
      const std::string roof = prefix + c->key;
      const double bw = r.bw;
      auto y_at = [&](double ai) { return bw > 0 ? std::min(c->value, ai * bw / 1e3) : c->value; };
      std::vector<double> xs = {lo};
      if (bw > 0 && c->value * 1e3 / bw > lo && c->value * 1e3 / bw < hi) xs.push_back(c->value * 1e3 / bw);
      xs.push_back(hi);
      for (std::size_t i = 0; i < xs.size(); ++i) roofs.push_back({{"x", xs[i]}, {"y", y_at(xs[i])}, {"roof", roof}, {"order", i}});
      labels.push_back({{"x", hi}, {"y", c->value}, {"text", roof + " " + fmt(c->value) + " " + c->unit}});
    }
    if (r.peaks.empty() && r.bw > 0) {
      roofs.push_back({{"x", lo}, {"y", lo * r.bw / 1e3}, {"roof", prefix + "memory"}, {"order", 0}});
      roofs.push_back({{"x", hi}, {"y", hi * r.bw / 1e3}, {"roof", prefix + "memory"}, {"order", 1}});
    }
    if (r.bw > 0) mem_labels.push_back({{"x", lo}, {"y", lo * r.bw / 1e3}, {"text", prefix + "memory " + fmt(r.bw) + " GB/s"}});
  }

  labels = merge_close_labels(labels);
  json spec = base_spec(in.workload + ": roofline");
  const json x = {{"field", "x"}, {"type", "quantitative"}, {"title", "arithmetic intensity (FLOP/byte, log)"},
                  {"scale", {{"type", "log"}, {"nice", false}}}};
  const json y = {{"field", "y"}, {"type", "quantitative"}, {"title", "achieved TFLOP/s (log)"}, {"scale", {{"type", "log"}}}};
  json layers = json::array();
  if (!roofs.empty()) {
    layers.push_back({{"data", {{"values", roofs}}}, {"mark", {{"type", "line"}, {"color", "#5f6368"}, {"strokeWidth", 1.5}}},
                      {"encoding", {{"x", x}, {"y", y}, {"detail", {{"field", "roof"}}}, {"order", {{"field", "order"}}}}}});
    for (const auto& [values, align] : {std::pair<const json&, const char*>{labels, "right"}, {mem_labels, "left"}}) {
      if (values.empty()) continue;
      layers.push_back({{"data", {{"values", values}}},
                        {"mark", {{"type", "text"}, {"align", align}, {"baseline", "bottom"}, {"dy", -3}, {"color", "#5f6368"}}},
                        {"encoding", {{"x", x}, {"y", y}, {"text", {{"field", "text"}}}}}});
    }
  }
  if (!dots.empty())
    layers.push_back({{"data", {{"values", dots}}}, {"mark", {{"type", "point"}, {"filled", true}, {"size", 80}}},
                      {"encoding", {{"x", x}, {"y", y}, {"color", {{"field", "series"}, {"type", "nominal"}, {"title", nullptr}}},
                                    {"shape", quality_shape({qualities.begin(), qualities.end()})},
                                    {"tooltip", json::array({{{"field", "point"}}, {{"field", "x"}, {"title", "FLOP/byte"}, {"format", ".3~g"}},
                                                             {{"field", "y"}, {"title", "TFLOP/s"}, {"format", ".4~g"}},
                                                             {{"field", "gbps"}, {"title", "GB/s"}, {"format", ".4~g"}},
                                                             {{"field", "quality"}}, {{"field", "note"}}})}}}});
  if (!crosses.empty())
    layers.push_back({{"data", {{"values", crosses}}},
                      {"mark", {{"type", "point"}, {"shape", "cross"}, {"filled", true}, {"size", 120}, {"color", "#c0392b"}, {"yOffset", -9}}},
                      {"encoding", {{"x", x}, {"y", {{"value", "height"}}}, {"tooltip", cross_tooltip()}}}});
  spec["layer"] = layers;

  Chart c;
  c.title = "Roofline";
  c.note = "Achieved TFLOP/s against arithmetic intensity (counts.flops / counts.bytes), log-log. " +
           (roof_note.empty() ? "No ceilings were measured on " + std::string(devices.size() == 1 ? *devices.begin() : "these devices") +
                                    ": run `accelbench run ceilings` there to draw the roofs."
                              : "Roofs (measured): " + roof_note + ".") +
           (no_flops ? " " + std::to_string(no_flops) + " measured point(s) do no arithmetic and are not placed." : "") +
           (not_measured.empty() ? std::string() : " " + not_drawn_note(not_measured, "as ✕ along the bottom"));
  c.spec = std::move(spec);
  c.table.caption = "roofline placement per point";
  c.table.columns = point_columns(in.plan, in.multi_run);
  const bool any_pct = std::any_of(rows.begin(), rows.end(), [](const Point* p) { return p->typed().rate_of(&results::Rates::pct_of_ceiling).has_value(); });
  for (const char* col : {"FLOP", "bytes", "FLOP/byte", "TFLOP/s", "GB/s"}) c.table.columns.push_back(col);
  if (any_pct) c.table.columns.push_back("% of ceiling");
  for (const Point* p : rows) {
    auto cells = point_cells(*p, in.plan, in.multi_run);
    const auto& counts = p->typed().counts;
    auto finite = [](std::optional<double> v) { return v && std::isfinite(*v) ? v : std::nullopt; };
    cells.push_back(num_cell(finite(counts ? std::optional<double>(counts->flops) : std::nullopt)));
    cells.push_back(num_cell(finite(counts ? std::optional<double>(counts->bytes) : std::nullopt)));
    cells.push_back(num_cell(finite(counts ? results::arithmetic_intensity(counts->flops, counts->bytes) : std::nullopt), 3));
    cells.push_back(num_cell(p->typed().rate_of(&results::Rates::tflops)));
    cells.push_back(num_cell(p->typed().rate_of(&results::Rates::gbps)));
    if (any_pct) cells.push_back(num_cell(p->typed().rate_of(&results::Rates::pct_of_ceiling), 3));
    c.table.rows.push_back(std::move(cells));
  }
  return c;
}

namespace {
constexpr const char* kClockPath = "gpus.0.mean_sm_clock_mhz";  // in the telemetry block
constexpr const char* kThrottlePath = "gpus.0.throttle_fraction";  // per reason; absent: none read
constexpr double kSlowerClocks = 0.99;  // a clock this much below the 1-GPU point's is noted
}  // namespace

std::optional<Chart> scaling_chart(const ChartInput& in, const Metric& metric) {
  const AxisInfo* axis = find_axis(in.plan, "gpus");
  if (!axis || !axis->integer || axis->values.size() < 2) return std::nullopt;
  std::map<std::string, const Point*> one;
  for (const auto& p : in.points)
    if (num(p.params(), "gpus") == 1.0) one[group_of(p, "gpus", in.plan, in.multi_run).first] = &p;
  json dots = json::array(), crosses = json::array();
  std::vector<const Point*> not_measured;
  std::set<std::string> qualities;
  std::vector<std::optional<double>> eff_of(in.points.size());
  for (std::size_t i = 0; i < in.points.size(); ++i) {
    const Point& p = in.points[i];
    const auto n = num(p.params(), "gpus");
    if (!n || *n < 1) continue;
    const auto [key, label] = group_of(p, "gpus", in.plan, in.multi_run);
    const auto b = one.find(key);
    const Point* bp = b == one.end() ? nullptr : b->second;
    const auto rate = p.measured() ? metric.of(p) : std::nullopt;
    const auto base = bp && bp->measured() ? metric.of(*bp) : std::nullopt;
    if (rate && base && *base > 0) {
      eff_of[i] = results::scaling_efficiency(*rate, *n, *base);
      qualities.insert(p.quality());
      dots.push_back({{"x", *n}, {"y", *eff_of[i]}, {"series", label}, {"quality", p.quality()}, {"point", label + " gpus=" + fmt(*n)},
                      {"note", p.explanation()}});
    } else {
      if (!p.measured()) not_measured.push_back(&p);
      crosses.push_back({{"x", *n}, {"point", label + " gpus=" + fmt(*n)},
                         {"status", !p.measured() ? p.status : !bp ? "no 1-GPU point" : "1-GPU point " + bp->status},
                         {"note", !p.measured() ? p.explanation() : bp ? bp->explanation() : ""}});
    }
  }
  if (dots.empty()) return std::nullopt;  // nothing measured to place
  json spec = base_spec(in.workload + ": scaling efficiency vs GPU count");
  std::vector<double> ticks;
  for (const auto& v : axis->values) ticks.push_back(v.get<double>());
  const json x = log2_scale_axis("x", "GPUs (log2)", false, ticks);
  const json y = {{"field", "y"}, {"type", "quantitative"}, {"title", "efficiency = rate(n) / (n × rate(1))"},
                  {"scale", {{"domain", {0, 1.1}}, {"clamp", false}}}};
  json layers = json::array();
  if (!dots.empty()) {
    const json color = {{"field", "series"}, {"type", "nominal"}, {"title", nullptr}};
    layers.push_back({{"data", {{"values", dots}}}, {"mark", {{"type", "line"}, {"strokeWidth", 2}}},
                      {"encoding", {{"x", x}, {"y", y}, {"color", color}}}});
    layers.push_back({{"data", {{"values", dots}}}, {"mark", {{"type", "point"}, {"filled", true}, {"size", 70}}},
                      {"encoding", {{"x", x}, {"y", y}, {"color", color}, {"shape", quality_shape({qualities.begin(), qualities.end()})},
                                    {"tooltip", json::array({{{"field", "point"}}, {{"field", "y"}, {"title", "efficiency"}, {"format", ".3~g"}},
                                                             {{"field", "quality"}}, {{"field", "note"}}})}}}});
  }
  if (!crosses.empty())
    layers.push_back({{"data", {{"values", crosses}}},
                      {"mark", {{"type", "point"}, {"shape", "cross"}, {"filled", true}, {"size", 120}, {"color", "#c0392b"}, {"yOffset", -9}}},
                      {"encoding", {{"x", x}, {"y", {{"value", "height"}}}, {"tooltip", cross_tooltip()}}}});
  layers.push_back({{"data", {{"values", json::array({json::object()})}}},
                    {"mark", {{"type", "rule"}, {"strokeDash", {4, 4}}, {"color", "#5f6368"}}},
                    {"encoding", {{"y", {{"datum", 1}, {"type", "quantitative"}}}}}});
  spec["layer"] = layers;
  Chart c;
  c.title = "Scaling efficiency vs GPU count";
  c.spec = std::move(spec);
  c.table.caption = "scaling per point";
  c.table.columns = point_columns(in.plan, in.multi_run);
  for (const std::string& col : std::vector<std::string>{metric.label, "1-GPU " + metric.label, "efficiency",
                                                         "SM clock / 1-GPU's", "power-capped readings"})
    c.table.columns.push_back(col);
  // A GPU at its power limit runs slower clocks with more GPUs (communication draws power too):
  // such a point's efficiency counts clocks lost to power as well as time lost to communication.
  std::size_t slower_clocks = 0;
  for (std::size_t i = 0; i < in.points.size(); ++i) {
    const Point& p = in.points[i];
    const auto n = num(p.params(), "gpus");
    if (!n) continue;
    auto cells = point_cells(p, in.plan, in.multi_run);
    const auto b = one.find(group_of(p, "gpus", in.plan, in.multi_run).first);
    const Point* bp = b == one.end() ? nullptr : b->second;
    cells.push_back(num_cell(p.measured() ? metric.of(p) : std::nullopt));
    cells.push_back(!bp ? text_cell("no 1-GPU point") : num_cell(bp->measured() ? metric.of(*bp) : std::nullopt));
    cells.push_back(num_cell(eff_of[i], 3));
    const auto clock = p.measured() ? p.typed().telemetry_number(kClockPath) : std::nullopt;
    const auto base_clock = bp && bp->measured() ? bp->typed().telemetry_number(kClockPath) : std::nullopt;
    const std::optional<double> clock_ratio =
        clock && base_clock && *base_clock > 0 ? std::optional<double>(*clock / *base_clock) : std::nullopt;
    slower_clocks += *n > 1 && clock_ratio && *clock_ratio < kSlowerClocks;
    cells.push_back(num_cell(clock_ratio, 3));
    const json* throttle = p.measured() ? results::find_path(p.typed().telemetry, kThrottlePath) : nullptr;
    const auto capped = throttle ? std::optional<double>(num(*throttle, "sw_power_cap").value_or(0.0)) : std::nullopt;
    cells.push_back(capped ? text_cell(fmt(*capped * 100, 3) + "%") : text_cell("—"));
    c.table.rows.push_back(std::move(cells));
  }
  c.note = "Efficiency(n) = " + metric.label + "(n) / (n × " + metric.label + "(1)) for the same other axis values "
           "(docs/METHODOLOGY.md); 1 is perfect scaling. The table gives the first GPU's mean SM clock against its 1-GPU "
           "point's and the share of its telemetry readings with the software power cap active." +
           (slower_clocks == 0 ? std::string()
                               : " At " + std::to_string(slower_clocks) + " multi-GPU point(s) that clock was more than " +
                                     fmt((1 - kSlowerClocks) * 100, 2) + "% below the 1-GPU point's: their efficiency "
                                     "counts clocks lost to the power limit as well as time lost to communication.") +
           (not_measured.empty() ? std::string() : " " + not_drawn_note(not_measured, "as ✕ along the bottom"));
  return c;
}

}  // namespace ab::report::detail
