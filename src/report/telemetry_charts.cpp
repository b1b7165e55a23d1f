// Power and host CPU over a run, from the raw series of `run --telemetry-trace` (telemetry.json;
// shape in docs/TELEMETRY.md), with the measured points' windows shaded behind.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "report/charts.h"

namespace ab::report::detail {
using nlohmann::json;

namespace {

constexpr std::size_t kMaxReadings = 1500;  // per series; longer series are averaged into buckets

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (t, value)
};

// Bucket means keep the shape of a long series and keep the page small; the table lists exactly
// what is drawn.
std::vector<std::pair<double, double>> downsample(const std::vector<std::pair<double, double>>& pts) {
  if (pts.size() <= kMaxReadings) return pts;
  std::vector<std::pair<double, double>> out;
  const double per = static_cast<double>(pts.size()) / kMaxReadings;
  for (std::size_t b = 0; b < kMaxReadings; ++b) {
    const auto i0 = static_cast<std::size_t>(std::floor(static_cast<double>(b) * per));
    const auto i1 = std::min(pts.size(), static_cast<std::size_t>(std::floor(static_cast<double>(b + 1) * per)));
    if (i1 <= i0) continue;
    double t = 0, v = 0;
    for (std::size_t i = i0; i < i1; ++i) t += pts[i].first, v += pts[i].second;
    out.emplace_back(t / static_cast<double>(i1 - i0), v / static_cast<double>(i1 - i0));
  }
  return out;
}

// "2026-11-29T13:55:01.123Z" -> seconds since the epoch.
std::optional<double> parse_utc(const std::string& s) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec, &ms) < 6)
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const std::time_t t = timegm(&tm);
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<double>(t) + ms / 1000.0;
}

json series_rows(const std::vector<Series>& all, Table& table, const std::string& unit) {
  json rows = json::array();
  table.columns = {"time (s)", "series", unit};
  for (const auto& s : all) {
    for (const auto& [t, v] : downsample(s.points)) {
      rows.push_back({{"t", t}, {"v", v}, {"series", s.name}});
      table.rows.push_back({num_cell(t, 5), text_cell(s.name), num_cell(v)});
    }
  }
  return rows;
}

json window_layer(const json& windows) {
  return {{"data", {{"values", windows}}},
          {"mark", {{"type", "rect"}, {"color", "#1a73e8"}}},
          {"encoding", {{"x", {{"field", "t0"}, {"type", "quantitative"}}}, {"x2", {{"field", "t1"}}},
                        {"opacity", {{"condition", {{"test", "datum.odd"}, {"value", 0.13}}}, {"value", 0.06}}},
                        {"tooltip", json::array({{{"field", "point"}, {"title", "point"}}, {{"field", "status"}},
                                                 {{"field", "t0"}, {"title", "from (s)"}, {"format", ".3f"}},
                                                 {{"field", "t1"}, {"title", "to (s)"}, {"format", ".3f"}}})}}}};
}

Chart time_chart(const std::string& title, const std::string& y_title, const std::string& note, std::vector<Series> series,
                 const json& windows) {
  Chart c;
  c.title = title;
  c.note = note;
  c.table.caption = title + ": every plotted value";
  json rows = series_rows(series, c.table, y_title);
  json spec = base_spec(title);
  json layers = json::array();
  if (!windows.empty()) layers.push_back(window_layer(windows));
  layers.push_back({{"data", {{"values", rows}}}, {"mark", {{"type", "line"}, {"strokeWidth", 1.5}, {"interpolate", "linear"}}},
                    {"encoding", {{"x", {{"field", "t"}, {"type", "quantitative"}, {"title", "time since the first reading (s)"}}},
                                  {"y", {{"field", "v"}, {"type", "quantitative"}, {"title", y_title}}},
                                  {"color", {{"field", "series"}, {"type", "nominal"}, {"title", nullptr}}},
                                  {"tooltip", json::array({{{"field", "series"}}, {{"field", "t"}, {"title", "t (s)"}, {"format", ".3f"}},
                                                           {{"field", "v"}, {"title", y_title}, {"format", ".4~g"}}})}}}});
  spec["layer"] = layers;
  c.spec = std::move(spec);
  return c;
}

}  // namespace

std::vector<Block> telemetry_blocks(const Run& run) {
  std::vector<Block> out;
  if (!run.telemetry_trace) return out;
  const json& tr = *run.telemetry_trace;
  std::vector<Series> power, cpu;
  double t_first = 1e300, t_last = -1e300;
  auto see = [&](double t) {
    t_first = std::min(t_first, t);
    t_last = std::max(t_last, t);
  };
  const json gpus = tr.contains("gpus") && tr["gpus"].is_array() ? tr["gpus"] : json::array();
  const json host = tr.contains("host") && tr["host"].is_object() ? tr["host"] : json::object();
  const json host_samples = host.contains("samples") && host["samples"].is_array() ? host["samples"] : json::array();
  for (const auto& g : gpus)
    if (g.contains("samples") && g["samples"].is_array())
      for (const auto& s : g["samples"])
        if (const auto t = num(s, "t_s")) see(*t);
  for (const auto& s : host_samples)
    if (const auto t = num(s, "t_s")) see(*t);
  if (t_first > t_last) {
    out.push_back(Paragraph{"The telemetry trace of run " + run.label + " holds no readings.", true});
    return out;
  }

  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const auto& g = gpus[i];
    const std::string name = "GPU " + std::to_string(i) + " " + str(g, "name").value_or("");
    Series avg{name + " power", {}}, inst{name + " instant power", {}};
    if (g.contains("samples") && g["samples"].is_array())
      for (const auto& s : g["samples"]) {
        const auto t = num(s, "t_s");
        if (!t) continue;
        if (const auto w = num(s, "power_w")) avg.points.emplace_back(*t - t_first, *w);
        if (const auto w = num(s, "power_instant_w")) inst.points.emplace_back(*t - t_first, *w);
      }
    for (auto* s : {&avg, &inst})
      if (!s->points.empty()) power.push_back(std::move(*s));
  }
  Series pkg{"CPU packages (from energy counter)", {}}, mean{"host CPU, mean of all cores", {}}, busiest{"host CPU, busiest core", {}};
  std::optional<std::pair<double, double>> prev_energy;
  for (const auto& s : host_samples) {
    const auto t = num(s, "t_s");
    if (!t) continue;
    if (const auto e = num(s, "package_energy_j")) {
      if (prev_energy && *t > prev_energy->first) pkg.points.emplace_back(*t - t_first, (*e - prev_energy->second) / (*t - prev_energy->first));
      prev_energy = std::make_pair(*t, *e);
    }
    if (s.contains("core_busy_frac") && s["core_busy_frac"].is_array() && !s["core_busy_frac"].empty()) {
      double sum = 0, top = 0;
      std::size_t n = 0;
      for (const auto& v : s["core_busy_frac"])
        if (v.is_number()) sum += v.get<double>(), top = std::max(top, v.get<double>()), ++n;
      if (n) {
        mean.points.emplace_back(*t - t_first, 100 * sum / static_cast<double>(n));
        busiest.points.emplace_back(*t - t_first, 100 * top);
      }
    }
  }
  if (!pkg.points.empty()) power.push_back(std::move(pkg));
  if (!mean.points.empty()) cpu.push_back(std::move(mean)), cpu.push_back(std::move(busiest));

  // Point windows: the trace clock is monotonic, the records' started_at is UTC, so the two are
  // aligned at the run's end (the sampler's last reading follows the last point by milliseconds).
  json windows = json::array();
  Table window_table;
  window_table.caption = "measured points on the time axis (aligned at the run's end)";
  window_table.columns = {"seq", "workload", "point", "status", "from (s)", "to (s)"};
  double last_end = -1e300;
  std::vector<std::tuple<results::Record, double, double>> spans;
  for (const auto& point : run.points) {
    results::Record rec = results::from_json(point);
    const auto start = parse_utc(rec.started_at);
    if (!start || !rec.wall_s || !std::isfinite(*rec.wall_s)) continue;
    const double end = *start + *rec.wall_s;
    spans.emplace_back(std::move(rec), *start, end);
    last_end = std::max(last_end, end);
  }
  const double shift = (t_last - t_first) - last_end;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const auto& [rec, s0, s1] = spans[i];
    std::vector<std::string> keys;
    for (const auto& [k, v] : rec.params.items()) keys.push_back(k);
    const std::string label = rec.workload + " " + params_label(rec.params, keys);
    const std::string status(results::to_string(rec.status));
    windows.push_back({{"t0", s0 + shift}, {"t1", s1 + shift}, {"point", label}, {"status", status}, {"odd", i % 2 == 1}});
    window_table.rows.push_back({num_cell(rec.seq ? std::optional<double>(static_cast<double>(*rec.seq)) : std::nullopt),
                                 text_cell(rec.workload), text_cell(params_label(rec.params, keys)),
                                 Cell{"", {status}, rec.reason, false}, num_cell(s0 + shift, 5), num_cell(s1 + shift, 5)});
  }

  const std::string period = num(tr, "period_s") ? fmt(*num(tr, "period_s") * 1000, 3) + " ms" : "?";
  const std::string shading = windows.empty() ? "" : " Shaded bands: the measured points' wall-clock windows (hover for the point).";
  const std::string thinned = " Series longer than " + std::to_string(kMaxReadings) + " readings are averaged into that many buckets.";
  if (!power.empty()) {
    out.push_back(time_chart(run.label + ": power over time", "power (W)",
                             "Device power as the driver reports it (on recent GPUs a 1 s running average; instant power "
                             "where the driver has it), and CPU package power from the powercap energy counter; readings "
                             "every " + period + "." + shading + thinned,
                             std::move(power), windows));
  } else {
    std::string why = gpus.empty() ? "no GPU was sampled (no NVML device)" : "the GPUs reported no power";
    if (const auto note = str(host, "package_energy_note")) why += "; host: " + *note;
    out.push_back(Paragraph{"No power readings in the telemetry trace of " + run.label + ": " + why + ".", false});
  }
  if (!cpu.empty()) {
    out.push_back(time_chart(run.label + ": host CPU over time", "busy (%)",
                             "Share of each interval the host cores were busy (/proc/stat), mean over all cores and the "
                             "busiest core; readings every " + period + "." + shading + thinned,
                             std::move(cpu), windows));
  }
  if (!windows.empty()) out.push_back(std::move(window_table));
  return out;
}

}  // namespace ab::report::detail
