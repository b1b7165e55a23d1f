// The sections of points with hardware counters (metrics.counters, docs/RESULTS.md): the measured
// roofline (each point, and each op of a model, at the intensity and rate the counters measured,
// the modelled point beside it, under the device's measured ceilings) and the suite character
// (memory transactions/s against compute rate, one colour per suite family). Neither exists
// without a point whose counters were read.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "report/charts.h"
#include "results/derived.h"

namespace ab::report::detail {
using nlohmann::json;

namespace {

// Which kind of benchmark a workload stands for in the characterisation study: DeepBench's
// kernels, MLPerf's models, STREAM's memory traffic, communication. Unlisted: its own name.
const std::map<std::string, std::string>& family_of_workload() {
  static const std::map<std::string, std::string> table = {
      {"gemm", "DeepBench kernels"}, {"conv", "DeepBench kernels"},  {"train", "MLPerf models"},
      {"infer", "MLPerf models"},    {"loadgen", "MLPerf models"},   {"stream", "STREAM memory"},
      {"copy", "STREAM memory"},     {"collectives", "collectives"}, {"p2p", "collectives"}};
  return table;
}

std::string family(const std::string& workload) {
  const auto it = family_of_workload().find(workload);
  return it == family_of_workload().end() ? workload : it->second;
}

const json* counters_of(const Point& p) {
  const json* c = at_path(*p.rec, "metrics.counters");
  return c != nullptr && c->is_object() && c->value("status", "") == "ok" ? c : nullptr;
}

std::string label_of(const Point& p, bool multi_run) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : p.params().items()) keys.push_back(k);
  std::string label = p.workload() + " " + params_label(p.params(), keys);
  return multi_run ? p.run->label + " " + label : label;
}

// The device's roofs as lines over [lo, hi]: min(peak, intensity x bandwidth) for each GEMM
// ceiling, the memory line alone where no peak was measured.
json roof_lines(const std::vector<Ceiling>& ceilings, const std::set<std::string>& devices, double lo, double hi,
                std::string& note) {
  json lines = json::array();
  for (const auto& device : devices) {
    double bw = 0;
    std::vector<const Ceiling*> peaks;
    for (const auto& c : ceilings) {
      if (c.device_name != device || c.status != "ok" || c.value <= 0) continue;
      if (c.key == "memory.bandwidth") bw = std::max(bw, c.value);
      if (c.key.rfind("gemm.", 0) == 0) peaks.push_back(&c);
    }
    if (bw > 0) note += (note.empty() ? "" : "; ") + device + " memory " + fmt(bw) + " GB/s";
    const std::string prefix = devices.size() > 1 ? device + " " : "";
    for (const Ceiling* c : peaks) {
      note += (note.empty() ? "" : "; ") + device + " " + c->key + " " + fmt(c->value) + " " + c->unit;
      std::vector<double> xs = {lo};
      if (bw > 0 && c->value * 1e3 / bw > lo && c->value * 1e3 / bw < hi) xs.push_back(c->value * 1e3 / bw);
      xs.push_back(hi);
      for (std::size_t i = 0; i < xs.size(); ++i)
        lines.push_back({{"x", xs[i]},
                         {"y", bw > 0 ? std::min(c->value, xs[i] * bw / 1e3) : c->value},
                         {"roof", prefix + c->key},
                         {"order", i}});
    }
    if (peaks.empty() && bw > 0)
      for (std::size_t i = 0; i < 2; ++i) {
        const double x = i == 0 ? lo : hi;
        lines.push_back({{"x", x}, {"y", x * bw / 1e3}, {"roof", prefix + "memory"}, {"order", i}});
      }
  }
  return lines;
}

// One dot per placed thing: kind "measured" / "modelled" / "op (measured)".
void add_point_dots(const Point& p, const json& c, bool multi_run, json& dots, Table& table, double& lo, double& hi) {
  const std::string label = label_of(p, multi_run);
  const auto ai = num(c, "measured_intensity_flop_per_byte"), tf = num(c, "achieved_tflops");
  const auto& counts = p.typed().counts;
  const auto model_ai = counts ? results::arithmetic_intensity(counts->flops, counts->bytes) : std::nullopt;
  const auto model_tf = p.typed().rate_of(&results::Rates::tflops);
  const auto place = [&](double x, double y, const std::string& kind, const std::string& name) {
    if (!(x > 0) || !(y > 0) || !std::isfinite(x) || !std::isfinite(y)) return;
    dots.push_back({{"x", x}, {"y", y}, {"kind", kind}, {"point", name}, {"pair", label}});
    lo = lo == 0 ? x : std::min(lo, x);
    hi = std::max(hi, x);
  };
  if (ai && tf) place(*ai, *tf, "measured", label);
  if (model_ai && model_tf) place(*model_ai, *model_tf, "modelled", label);
  if (const json* ops = at_path(c, "ops"); ops != nullptr && ops->is_array())
    for (const json& op : *ops) {
      const double flops = op.value("flops", 0.0), dram = op.value("dram_bytes", 0.0), s = op.value("duration_s", 0.0);
      if (flops > 0 && dram > 0 && s > 0)
        place(flops / dram, flops / s / 1e12, "op (measured)", label + " " + op.value("name", ""));
    }
  table.rows.push_back({text_cell(label), num_cell(num(c, "dram_bytes")), num_cell(num(c, "modelled_bytes")),
                        num_cell(num(c, "measured_over_modelled_bytes"), 3), num_cell(ai), num_cell(model_ai),
                        num_cell(tf), num_cell(model_tf)});
}

Chart measured_roofline(const std::vector<const Point*>& points, const std::vector<Ceiling>& ceilings, bool multi_run) {
  Chart chart;
  chart.title = "Measured roofline";
  chart.table.caption = "measured against modelled, per point";
  chart.table.columns = {"point",
                         "DRAM bytes (measured)",
                         "bytes (modelled)",
                         "measured / modelled",
                         "FLOP/byte (measured)",
                         "FLOP/byte (modelled)",
                         "TFLOP/s (counters)",
                         "TFLOP/s (timed)"};
  json dots = json::array();
  std::set<std::string> devices;
  double lo = 0, hi = 0;
  for (const Point* p : points) {
    add_point_dots(*p, *counters_of(*p), multi_run, dots, chart.table, lo, hi);
    if (!p->typed().device_name.empty()) devices.insert(p->typed().device_name);
  }
  std::string roof_note;
  const json roofs = dots.empty() ? json::array() : roof_lines(ceilings, devices, lo / 4, hi * 4, roof_note);
  json spec = base_spec("measured roofline");
  const json x = {{"field", "x"},
                  {"type", "quantitative"},
                  {"title", "arithmetic intensity (FLOP/byte, log)"},
                  {"scale", {{"type", "log"}, {"nice", false}}}};
  const json y = {{"field", "y"}, {"type", "quantitative"}, {"title", "TFLOP/s (log)"}, {"scale", {{"type", "log"}}}};
  json layers = json::array();
  if (!roofs.empty())
    layers.push_back(
        {{"data", {{"values", roofs}}},
         {"mark", {{"type", "line"}, {"color", "#5f6368"}, {"strokeWidth", 1.5}}},
         {"encoding", {{"x", x}, {"y", y}, {"detail", {{"field", "roof"}}}, {"order", {{"field", "order"}}}}}});
  // The measured and the modelled point of one record joined by a thin line: how far the model is off.
  layers.push_back({{"data", {{"values", dots}}},
                    {"transform", json::array({{{"filter", "datum.kind !== 'op (measured)'"}}})},
                    {"mark", {{"type", "line"}, {"color", "#9aa0a6"}, {"strokeWidth", 1}}},
                    {"encoding", {{"x", x}, {"y", y}, {"detail", {{"field", "pair"}}}}}});
  layers.push_back(
      {{"data", {{"values", dots}}},
       {"mark", {{"type", "point"}, {"filled", true}}},
       {"encoding",
        {{"x", x},
         {"y", y},
         {"color", {{"field", "kind"}, {"type", "nominal"}, {"title", nullptr}}},
         {"size", {{"condition", {{"test", "datum.kind === 'op (measured)'"}, {"value", 25}}}, {"value", 80}}},
         {"tooltip", json::array({{{"field", "point"}},
                                  {{"field", "kind"}},
                                  {{"field", "x"}, {"title", "FLOP/byte"}, {"format", ".3~g"}},
                                  {{"field", "y"}, {"title", "TFLOP/s"}, {"format", ".4~g"}}})}}}});
  spec["layer"] = layers;
  chart.spec = std::move(spec);
  chart.note =
      "Each point at the intensity its counters measured (counts.flops / DRAM bytes read and written) and "
      "the rate over the counted kernels' duration, beside its modelled point (counts.flops / counts.bytes, "
      "timed TFLOP/s), the two joined; a model's ops as small dots. " +
      (roof_note.empty()
           ? std::string("No ceilings measured on this device: run `accelbench run ceilings` for the roofs.")
           : "Roofs (measured): " + roof_note + ".");
  return chart;
}

Chart suite_character(const std::vector<const Point*>& points, bool multi_run) {
  Chart chart;
  chart.title = "Suite character";
  chart.table.caption = "memory transactions and compute rate, per point";
  chart.table.columns = {"point", "family", "DRAM sectors/s", "DRAM GB/s", "TFLOP/s (counters)"};
  json dots = json::array();
  for (const Point* p : points) {
    const json& c = *counters_of(*p);
    const auto sectors = num(c, "dram_sectors_per_s"), bytes = num(c, "dram_bytes_per_s");
    const double tf = num(c, "achieved_tflops").value_or(0.0);
    const std::string label = label_of(*p, multi_run), fam = family(p->workload());
    chart.table.rows.push_back({text_cell(label), text_cell(fam), num_cell(sectors),
                                num_cell(bytes ? std::optional<double>(*bytes / 1e9) : std::nullopt), num_cell(tf)});
    if (sectors && *sectors > 0) dots.push_back({{"x", *sectors}, {"y", tf}, {"family", fam}, {"point", label}});
  }
  json spec = base_spec("suite character");
  spec["data"] = {{"values", dots}};
  spec["mark"] = {{"type", "point"}, {"filled", true}, {"size", 80}};
  spec["encoding"] = {{"x",
                       {{"field", "x"},
                        {"type", "quantitative"},
                        {"title", "memory transactions/s (32-byte DRAM sectors, log)"},
                        {"scale", {{"type", "log"}}}}},
                      {"y",
                       {{"field", "y"},
                        {"type", "quantitative"},
                        {"title", "compute rate (TFLOP/s, symlog)"},
                        {"scale", {{"type", "symlog"}}}}},
                      {"color", {{"field", "family"}, {"type", "nominal"}, {"title", "suite family"}}},
                      {"tooltip", json::array({{{"field", "point"}},
                                               {{"field", "family"}},
                                               {{"field", "x"}, {"title", "sectors/s"}, {"format", ".3~g"}},
                                               {{"field", "y"}, {"title", "TFLOP/s"}, {"format", ".4~g"}}})}};
  chart.spec = std::move(spec);
  chart.note =
      "Each point's DRAM traffic (sectors of 32 bytes per second over the counted kernels' duration) "
      "against its compute rate (counts.flops over that duration); colour: the suite family its "
      "workload stands for (DeepBench kernels, MLPerf models, STREAM memory, collectives).";
  return chart;
}

}  // namespace

std::vector<Section> counter_sections(const std::vector<Point>& all, const std::vector<Ceiling>& ceilings,
                                      bool multi_run) {
  std::vector<const Point*> points;
  for (const Point& p : all)
    if (p.measured() && counters_of(p) != nullptr) points.push_back(&p);
  if (points.empty()) return {};
  std::vector<Section> out;
  Section roofline{"Measured roofline", 2, {}};
  roofline.blocks.push_back(measured_roofline(points, ceilings, multi_run));
  out.push_back(std::move(roofline));
  Section character{"Suite character", 2, {}};
  character.blocks.push_back(suite_character(points, multi_run));
  out.push_back(std::move(character));
  return out;
}

}  // namespace ab::report::detail
