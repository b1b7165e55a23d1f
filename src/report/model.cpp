#include "report/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace ab::report::detail {
using nlohmann::json;

namespace {

const json& empty_object() {
  static const json e = json::object();
  return e;
}

bool is_integer(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

}  // namespace

bool value_less(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() < b.get<double>();
  if (a.is_number() != b.is_number()) return a.is_number();
  if (a.is_string() && b.is_string()) return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();
  return a.dump() < b.dump();
}

bool params_less(const Point& a, const Point& b, const std::vector<std::string>& keys, bool multi_run) {
  if (multi_run && a.run != b.run) return a.run->label < b.run->label;
  for (const auto& k : keys) {
    const auto ia = a.params().find(k), ib = b.params().find(k);
    const bool ha = ia != a.params().end(), hb = ib != b.params().end();
    if (ha != hb) return hb;  // a point without the axis first
    if (!ha) continue;
    if (value_less(*ia, *ib)) return true;
    if (value_less(*ib, *ia)) return false;
  }
  return false;
}

std::string Point::quality() const {
  if (external) return "external";
  if (unconverged && noisy) return "unconverged+noisy";
  if (unconverged) return "unconverged";
  if (noisy) return "noisy";
  return "ok";
}

std::vector<std::string> Point::badges() const {
  std::vector<std::string> b{status};
  if (measured() && unconverged) b.push_back("unconverged");
  if (measured() && noisy) b.push_back("noisy");
  if (external) b.push_back("external");
  return b;
}

std::string Point::explanation() const {
  std::string out = reason;
  auto add = [&out](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
  if (measured() && unconverged) add("did not converge: " + (stop_reason.empty() ? "stopping rule not met" : stop_reason));
  if (measured() && noisy)
    add("noisy: median ±" + fmt(rel_spread * 100, 3) + "% > target " + fmt(max_noise * 100, 3) + "%");
  if (external) add("published figure" + (record->source.empty() ? std::string() : ", source: " + record->source));
  return out;
}

const json& Point::params() const { return record->params.is_object() ? record->params : empty_object(); }

std::string Point::workload() const { return record->workload; }

std::vector<Point> make_points(const Run& run) {
  std::vector<Point> out;
  const auto run_noise = num(run.context, "measurement.max_noise_pct");
  for (const auto& rec : run.points) {
    Point p;
    p.rec = &rec;
    p.record = std::make_shared<const results::Record>(results::from_json(rec));
    p.run = &run;
    const results::Record& r = *p.record;
    p.status = std::string(results::to_string(r.status));
    p.reason = r.reason;
    p.external = run.external || r.external;
    if (r.time) {
      p.unconverged = r.time->converged == false;
      p.stop_reason = r.time->stop_reason.value_or("");
      p.rel_spread = r.time_of(&results::TimeStats::rel_spread).value_or(0);
    }
    const auto noise = num(rec, "context.measurement.max_noise_pct");
    if (noise && *noise > 0) p.max_noise = *noise / 100;
    else if (run_noise && *run_noise > 0) p.max_noise = *run_noise / 100;
    p.noisy = p.rel_spread > p.max_noise * (1 + 1e-9);
    out.push_back(std::move(p));
  }
  return out;
}

std::optional<double> sample_count(const Point& p) {
  const auto& t = p.typed().time;
  return t && t->count ? std::optional<double>(static_cast<double>(*t->count)) : std::nullopt;
}

const json* at_path(const json& j, std::string_view dotted) {
  const json* cur = &j;
  while (!dotted.empty()) {
    const auto dot = dotted.find('.');
    const std::string key(dotted.substr(0, dot));
    dotted = dot == std::string_view::npos ? std::string_view{} : dotted.substr(dot + 1);
    if (cur->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos) {
      const std::size_t i = std::stoul(key);  // telemetry.gpus.0: the first GPU
      if (i >= cur->size()) return nullptr;
      cur = &(*cur)[i];
      continue;
    }
    if (!cur->is_object()) return nullptr;
    const auto it = cur->find(key);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

std::optional<double> num(const json& j, std::string_view dotted) {
  const json* v = at_path(j, dotted);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  const double d = v->get<double>();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<std::string> str(const json& j, std::string_view dotted) {
  const json* v = at_path(j, dotted);
  if (v == nullptr || !v->is_string()) return std::nullopt;
  return v->get<std::string>();
}

std::optional<bool> flag(const json& j, std::string_view dotted) {
  const json* v = at_path(j, dotted);
  if (v == nullptr || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::string fmt(double v, int significant) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  if (v == 0) return "0";
  char buf[64];
  const double a = std::fabs(v);
  if (a >= std::pow(10.0, significant) && a < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.*g", significant, v);
  return buf;
}

std::string fmt_opt(const std::optional<double>& v, int significant) { return v ? fmt(*v, significant) : "—"; }

std::string fmt_param(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return fmt(bytes, 4) + " " + units[u];
}

std::string fmt_time(double s) {
  if (s < 1e-3) return fmt(s * 1e6, 4) + " µs";
  if (s < 1) return fmt(s * 1e3, 4) + " ms";
  return fmt(s, 4) + " s";
}

std::string params_label(const json& params, const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    const auto it = params.find(k);
    if (it == params.end()) continue;
    out += (out.empty() ? "" : " ") + k + "=" + fmt_param(*it);
  }
  return out;
}

AxisPlan plan_axes(const std::vector<Point>& points) {
  AxisPlan plan;
  std::map<std::string, std::size_t> index;
  for (const auto& p : points) {
    for (const auto& [k, v] : p.params().items()) {
      auto [it, added] = index.emplace(k, plan.axes.size());
      if (added) plan.axes.push_back({k, true, {}});
      auto& axis = plan.axes[it->second];
      axis.integer = axis.integer && is_integer(v);
      if (std::none_of(axis.values.begin(), axis.values.end(), [&v](const json& x) { return x == v; }))
        axis.values.push_back(v);
    }
  }
  for (auto& a : plan.axes) {
    std::sort(a.values.begin(), a.values.end(), value_less);
    a.constant = a.values.size() == 1 && std::all_of(points.begin(), points.end(),
                                                     [&a](const Point& p) { return p.params().contains(a.name); });
  }

  auto positive_values = [](const AxisInfo& a) {
    return std::count_if(a.values.begin(), a.values.end(), [](const json& v) { return v.get<double>() > 0; });
  };
  static const char* preferred[] = {"batch", "bytes", "array_bytes", "m", "size", "seq_len", "tokens", "n", "k"};
  for (const char* name : preferred) {
    const AxisInfo* a = find_axis(plan, name);
    if (a && a->integer && positive_values(*a) >= 2) {
      plan.x = a->name;
      break;
    }
  }
  if (!plan.x) {
    std::ptrdiff_t best = 2;
    for (const auto& a : plan.axes)
      if (a.integer && positive_values(a) > best) best = positive_values(a), plan.x = a.name;
  }

  // Series: the other axes that vary, except those that are a function of x (zipped with it).
  for (const auto& a : plan.axes) {
    if (plan.x && a.name == *plan.x) continue;
    if (a.values.size() < 2) continue;
    if (plan.x) {
      std::map<std::string, std::set<std::string>> seen;
      for (const auto& p : points) {
        const auto xv = p.params().find(*plan.x);
        const auto ov = p.params().find(a.name);
        if (xv != p.params().end() && ov != p.params().end()) seen[xv->dump()].insert(ov->dump());
      }
      const bool determined = std::all_of(seen.begin(), seen.end(), [](const auto& kv) { return kv.second.size() == 1; });
      if (determined) continue;
    }
    plan.series.push_back(a.name);
  }
  return plan;
}

const AxisInfo* find_axis(const AxisPlan& plan, std::string_view name) {
  for (const auto& a : plan.axes)
    if (a.name == name) return &a;
  return nullptr;
}

std::vector<std::string> varying_axes(const AxisPlan& plan) {
  std::vector<std::string> names;
  for (const auto& a : plan.axes)
    if (!a.constant) names.push_back(a.name);
  return names;
}

std::string constant_axes_label(const AxisPlan& plan) {
  std::string out;
  for (const auto& a : plan.axes)
    if (a.constant) out += (out.empty() ? "" : ", ") + a.name + "=" + fmt_param(a.values.front());
  return out;
}

std::string series_of(const Point& p, const AxisPlan& plan, bool multi_run) {
  std::string s = params_label(p.params(), plan.series);
  if (multi_run) s = p.run->label + (s.empty() ? "" : " " + s);
  return s.empty() ? p.workload() : s;
}

std::optional<Metric> rate_metric(const std::vector<Point>& points, const AxisPlan& plan) {
  auto any_has = [&points](const Metric& m) {
    return std::any_of(points.begin(), points.end(), [&m](const Point& p) { return m.of(p).has_value(); });
  };
  const bool op_units = std::any_of(points.begin(), points.end(),
                                    [](const Point& p) { return p.typed().counts && p.typed().counts->ops_unit == "OP"; });
  const Metric tflops{"rates.tflops", op_units ? "TOP/s" : "TFLOP/s", &results::Rates::tflops},
      gbps{"rates.gbps", "GB/s", &results::Rates::gbps},
      samples{"rates.samples_per_s", "samples/s", &results::Rates::samples_per_s},
      tokens{"rates.tokens_per_s", "tokens/s", &results::Rates::tokens_per_s};
  // Language models compare in tokens (a sequence's length is an axis); only where every point has them.
  const bool all_tokens =
      std::all_of(points.begin(), points.end(), [&tokens](const Point& p) { return tokens.of(p).has_value(); });
  if ((find_axis(plan, "batch") || find_axis(plan, "seq")) && !points.empty() && all_tokens) return tokens;
  if (find_axis(plan, "batch") && any_has(samples)) return samples;
  std::map<std::string, int> primary;
  for (const auto& p : points)
    if (p.typed().rates && !p.typed().rates->primary.empty()) ++primary[p.typed().rates->primary];
  if (!primary.empty()) {
    const auto best = std::max_element(primary.begin(), primary.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    if (best->first == "tflops" && any_has(tflops)) return tflops;
    if (best->first == "gbps" && any_has(gbps)) return gbps;
  }
  if (any_has(samples)) return samples;
  if (any_has(tflops)) return tflops;
  if (any_has(gbps)) return gbps;
  return std::nullopt;
}

Cell text_cell(std::string text, std::string title) { return Cell{std::move(text), {}, std::move(title), false}; }

Cell num_cell(const std::optional<double>& v, int significant) { return Cell{fmt_opt(v, significant), {}, {}, true}; }

Cell status_cell(const Point& p) { return Cell{p.explanation(), p.badges(), {}, false}; }

std::vector<std::string> point_columns(const AxisPlan& plan, bool multi_run) {
  std::vector<std::string> cols;
  if (multi_run) cols.push_back("run");
  for (const auto& a : plan.axes)
    if (!a.constant) cols.push_back(a.name);
  cols.push_back("status");
  return cols;
}

std::vector<Cell> point_cells(const Point& p, const AxisPlan& plan, bool multi_run) {
  std::vector<Cell> cells;
  if (multi_run) cells.push_back(text_cell(p.run->label, p.run->id));
  for (const auto& a : plan.axes) {
    if (a.constant) continue;
    const auto it = p.params().find(a.name);
    Cell c = text_cell(it == p.params().end() ? "" : fmt_param(*it));
    c.numeric = a.integer;
    cells.push_back(std::move(c));
  }
  cells.push_back(status_cell(p));
  return cells;
}

std::vector<Ceiling> collect_ceilings(const std::vector<Run>& runs) {
  std::vector<Ceiling> out;
  std::set<std::string> seen;
  auto add = [&](Ceiling c) {
    if (seen.insert(c.device_name + '\n' + c.key + '\n' + c.source).second) out.push_back(std::move(c));
  };
  std::vector<std::pair<const Run*, results::Record>> records;
  for (const auto& run : runs)
    for (const auto& rec : run.points) records.emplace_back(&run, results::from_json(rec));
  for (const auto& [run, r] : records) {
    if (r.workload != "ceilings") continue;
    const results::CeilingRef* ref = r.rates && r.rates->ceiling ? &*r.rates->ceiling : nullptr;
    if (ref && ref->source != "this point") continue;  // below the best so far: it set no ceiling
    Ceiling c;
    c.device_name = r.device_name;
    c.key = ref && !ref->key.empty() ? ref->key : str(r.params, "target").value_or("?");
    c.unit = ref ? ref->unit : "";
    c.value = ref && std::isfinite(ref->value) ? ref->value : 0;
    c.status = std::string(results::to_string(r.status));
    c.reason = !r.reason.empty() ? r.reason : c.status == "ok" && c.value <= 0 ? "no rate measured" : "";
    c.source = "run " + (r.run_id.empty() ? run->id : r.run_id) + " seq " + (r.seq ? fmt(static_cast<double>(*r.seq), 12) : "?");
    add(std::move(c));
  }
  // Ceilings that points divided by but that were measured in runs not loaded here.
  for (const auto& [run, r] : records) {
    const results::CeilingRef* ref = r.rates && r.rates->ceiling ? &*r.rates->ceiling : nullptr;
    if (!ref || !std::isfinite(ref->value) || ref->source.empty() || ref->source == "this point") continue;
    Ceiling c;
    c.device_name = r.device_name;
    c.key = ref->key.empty() ? "?" : ref->key;
    c.unit = ref->unit;
    c.value = ref->value;
    c.source = ref->source;
    add(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const Ceiling& a, const Ceiling& b) {
    return std::tie(a.device_name, a.key) < std::tie(b.device_name, b.key);
  });
  return out;
}

json base_spec(const std::string& title) {
  // The page heads each chart with an <h3>; the spec carries the title as its description only.
  return {{"description", title},
          {"width", "container"},
          {"height", 300},
          {"config", {{"font", "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"},
                      {"axis", {{"labelFontSize", 11}, {"titleFontSize", 12}, {"gridColor", "#e8eaed"}}},
                      {"legend", {{"labelFontSize", 11}, {"titleFontSize", 12}, {"labelLimit", 260}}},
                      {"view", {{"stroke", "#d0d4da"}}}}}};
}

json log2_scale_axis(const std::string& field, const std::string& title, bool bytes, const std::vector<double>& ticks) {
  json enc = {{"field", field}, {"type", "quantitative"}, {"title", title}, {"scale", {{"type", "log"}, {"base", 2}}},
              {"axis", {{"labelOverlap", true}}}};
  // Ticks at the measured values read better than the log scale's own (1.907 MiB...).
  if (!ticks.empty() && ticks.size() <= 16) enc["axis"]["values"] = ticks;
  if (bytes) {
    enc["axis"]["labelExpr"] =
        "datum.value >= 1073741824 ? format(datum.value / 1073741824, '~g') + ' GiB' : "
                    "datum.value >= 1048576 ? format(datum.value / 1048576, '~g') + ' MiB' : "
                    "datum.value >= 1024 ? format(datum.value / 1024, '~g') + ' KiB' : format(datum.value, '~g') + ' B'";
  }
  return enc;
}

}  // namespace ab::report::detail
