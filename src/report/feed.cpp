// The "Input pipeline against training" section: the `pipeline` workload's images/s by thread count
// (a line per decoder) beside each training model's images/s per GPU (a horizontal rule each), so a
// reader sees how many cores feed one GPU. Only where a run holds both (docs/REPORTS.md).
#include <algorithm>
#include <map>
#include <set>

#include "report/charts.h"

namespace ab::report::detail {
namespace {

using nlohmann::json;

std::string text_param(const Point& p, const std::string& name, const std::string& absent) {
  const json& params = p.params();
  const auto it = params.find(name);
  return it == params.end() ? absent : fmt_param(*it);
}

// A pipeline line: its label and its measured (threads, images/s).
struct FeedLine {
  std::string label;
  std::map<double, double> rate_by_threads;
};

// One rule per training model: its fastest ok point, in images/s per GPU.
struct TrainRule {
  std::string label;  // "train resnet50 images/s"
  std::string point;  // "batch=256 precision=bf16"
  double per_gpu = 0;
};

std::vector<FeedLine> pipeline_lines(const std::vector<Point>& all, bool multi_run) {
  std::set<std::string> sizes;
  for (const auto& p : all)
    if (p.workload() == "pipeline" && p.measured()) sizes.insert(text_param(p, "image_px", "?"));
  std::map<std::string, FeedLine> lines;
  for (const auto& p : all) {
    const auto threads = num(p.params(), "threads");
    const auto rate = num(*p.rec, "rates.samples_per_s");
    if (p.workload() != "pipeline" || !p.measured() || !threads || !rate) continue;
    std::string label = "pipeline " + text_param(p, "decoder", "cpu");
    if (sizes.size() > 1) label += " " + text_param(p, "image_px", "?") + " px";
    if (multi_run) label = p.run->label + ": " + label;
    auto& line = lines[label];
    line.label = label;
    line.rate_by_threads[*threads] = std::max(line.rate_by_threads[*threads], *rate);
  }
  std::vector<FeedLine> out;
  for (auto& [label, line] : lines) out.push_back(std::move(line));
  return out;
}

std::vector<TrainRule> train_rules(const std::vector<Point>& all, bool multi_run) {
  std::map<std::string, TrainRule> best;
  for (const auto& p : all) {
    const auto rate = num(*p.rec, "rates.samples_per_s");
    if (p.workload() != "train" || !p.measured() || !rate) continue;
    const double gpus = std::max(1.0, num(p.params(), "gpus").value_or(1.0));
    std::string label = "train " + text_param(p, "model", "model") + " images/s";
    if (multi_run) label = p.run->label + ": " + label;
    auto& rule = best[label];
    if (*rate / gpus <= rule.per_gpu) continue;
    std::vector<std::string> keys;  // what tells one training point of a model from another
    for (const char* k : {"batch", "precision", "gpus", "dataset"})
      if (p.params().contains(k)) keys.emplace_back(k);
    rule = {label, params_label(p.params(), keys), *rate / gpus};
  }
  std::vector<TrainRule> out;
  for (auto& [label, rule] : best) out.push_back(std::move(rule));
  return out;
}

// The fewest measured threads of `line` that reach `rate`, or why none does.
std::string threads_that_keep_up(const FeedLine& line, double rate) {
  for (const auto& [threads, r] : line.rate_by_threads)
    if (r >= rate) return fmt(threads) + (threads == 1 ? " thread" : " threads");
  const auto best = std::max_element(line.rate_by_threads.begin(), line.rate_by_threads.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  return "none measured (at most " + fmt(best->second) + " images/s, " + fmt(best->first) + " threads)";
}

// Lines for pipelines measured at several thread counts; a dotted rule for one measured at a single
// count (nvjpeg: one feeding thread), a dashed rule per training model, each rule labelled.
json feed_spec(const std::vector<FeedLine>& lines, const std::vector<TrainRule>& rules) {
  json dots = json::array(), marks = json::array();
  std::set<double> ticks;
  for (const auto& line : lines) {
    for (const auto& [threads, rate] : line.rate_by_threads) ticks.insert(threads);
    if (line.rate_by_threads.size() == 1) {
      const auto& [threads, rate] = *line.rate_by_threads.begin();
      marks.push_back(
          {{"y", rate}, {"series", line.label}, {"point", "threads=" + fmt(threads)}, {"dash", "pipeline"}});
      continue;
    }
    for (const auto& [threads, rate] : line.rate_by_threads)
      dots.push_back({{"x", threads}, {"y", rate}, {"series", line.label}});
  }
  for (const auto& r : rules)
    marks.push_back({{"y", r.per_gpu}, {"series", r.label}, {"point", r.point}, {"dash", "train"}});
  json spec = base_spec("input pipeline images/s by threads beside training images/s per GPU");
  const json x = log2_scale_axis("x", "decoding threads (log2)", false, {ticks.begin(), ticks.end()});
  const json y = {{"field", "y"}, {"type", "quantitative"}, {"title", "images/s"}};
  const json color = {{"field", "series"}, {"type", "nominal"}, {"title", nullptr}};
  const json tooltip = json::array({{{"field", "series"}},
                                    {{"field", "x"}, {"title", "threads"}},
                                    {{"field", "y"}, {"title", "images/s"}, {"format", ",.0f"}}});
  json layers = json::array();
  layers.push_back({{"data", {{"values", dots}}},
                    {"mark", {{"type", "line"}, {"strokeWidth", 2}}},
                    {"encoding", {{"x", x}, {"y", y}, {"color", color}}}});
  layers.push_back({{"data", {{"values", dots}}},
                    {"mark", {{"type", "point"}, {"filled", true}, {"size", 70}}},
                    {"encoding", {{"x", x}, {"y", y}, {"color", color}, {"tooltip", tooltip}}}});
  const json dash = {{"field", "dash"},
                     {"type", "nominal"},
                     {"title", nullptr},
                     {"scale", {{"domain", {"pipeline", "train"}}, {"range", {{2, 2}, {6, 4}}}}},
                     {"legend", nullptr}};
  const json rule_tooltip = json::array(
      {{{"field", "series"}}, {{"field", "point"}}, {{"field", "y"}, {"title", "images/s"}, {"format", ",.0f"}}});
  layers.push_back({{"data", {{"values", marks}}},
                    {"mark", {{"type", "rule"}, {"strokeWidth", 2}}},
                    {"encoding", {{"y", y}, {"color", color}, {"strokeDash", dash}, {"tooltip", rule_tooltip}}}});
  layers.push_back(
      {{"data", {{"values", marks}}},
       {"mark", {{"type", "text"}, {"align", "left"}, {"dx", 4}, {"dy", -6}, {"fontSize", 11}}},
       {"encoding", {{"x", {{"value", 0}}}, {"y", y}, {"text", {{"field", "series"}}}, {"color", color}}}});
  spec["layer"] = layers;
  return spec;
}

}  // namespace

std::vector<Section> feed_sections(const std::vector<Point>& all, bool multi_run) {
  const auto lines = pipeline_lines(all, multi_run);
  const auto rules = train_rules(all, multi_run);
  if (lines.empty() || rules.empty()) return {};
  Chart c;
  c.title = "Input pipeline images/s by threads, beside training images/s per GPU";
  c.note =
      "Lines: the pipeline workload's measured images/s (decoded and augmented) at each thread count, one per "
      "decoder; a dotted rule for one measured at a single thread count (nvjpeg decodes on the GPU, fed by one "
      "thread). Dashed rules: each training model's fastest measured point in images/s per GPU. Where a line crosses a "
      "rule, that many threads feed one GPU of that "
      "model; points that are not ok are left out (the workload sections list them).";
  c.spec = feed_spec(lines, rules);
  c.table.caption = "threads that keep up with each training model";
  c.table.columns = {"training", "point", "images/s per GPU"};
  for (const auto& line : lines) c.table.columns.push_back(line.label + ": threads that keep up");
  for (const auto& r : rules) {
    std::vector<Cell> row{text_cell(r.label), text_cell(r.point), num_cell(r.per_gpu)};
    for (const auto& line : lines) row.push_back(text_cell(threads_that_keep_up(line, r.per_gpu)));
    c.table.rows.push_back(std::move(row));
  }
  Section s{"Input pipeline against training", 2, {}};
  s.blocks.emplace_back(std::move(c));
  return {s};
}

}  // namespace ab::report::detail
