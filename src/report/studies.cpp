// The studies as report sections (suites/precision-study.yaml, batch-study.yaml,
// c2-inference.yaml): the precision study — each precision's rate over fp32's at the same model,
// batch and other axes, for training and inference — and the batch-size study — per model, rate,
// p50/p99 latency and samples/J against batch. A section appears only when the runs hold its points.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "report/charts.h"

namespace ab::report::detail {
using nlohmann::json;

namespace {

// The precision study compares modes of the model workloads; the batch-size study is inference
// only, where one timing sample is one forward, so the percentiles are per-batch latencies.
const std::vector<std::string> kPrecisionWorkloads = {"train", "infer"};
const std::string kBatchWorkload = "infer";
const std::vector<std::string> kPrecisionOrder = {"fp32", "tf32", "bf16", "fp16", "fp8"};
constexpr std::size_t kMinBatches = 3;  // fewer batch sizes is not a sweep

std::vector<Point> points_of(const std::vector<Point>& all, const std::string& workload) {
  std::vector<Point> out;
  std::copy_if(all.begin(), all.end(), std::back_inserter(out), [&workload](const Point& p) { return p.workload() == workload; });
  return out;
}

// Params without `without`, as a key that matches points across precisions or batches of one run.
std::string key_without(const Point& p, const std::vector<std::string>& without) {
  json rest = p.params();
  for (const auto& w : without) rest.erase(w);
  return p.run->id + '\n' + p.run->label + '\n' + rest.dump();
}

// The series axes other than `skip`, as a label ("graph=off layout=nchw"); "" when none vary.
std::string other_axes(const Point& p, const AxisPlan& plan, const std::vector<std::string>& skip) {
  std::vector<std::string> keys;
  for (const auto& s : plan.series)
    if (std::find(skip.begin(), skip.end(), s) == skip.end()) keys.push_back(s);
  for (const auto& a : plan.axes)  // x is never a series; list it too when it is not skipped
    if (plan.x && a.name == *plan.x && std::find(skip.begin(), skip.end(), a.name) == skip.end()) keys.push_back(a.name);
  return params_label(p.params(), keys);
}

double batch_of(const Point& p) {
  const auto b = num(p.params(), "batch");
  return b.value_or(0);
}

// A rate cell: the value with the point's flags, or its status where it has no value.
Cell rate_cell(const Point* p, const std::optional<double>& v, int significant = 4) {
  if (!p) return text_cell("—");
  Cell c = num_cell(v, significant);
  if (p->flagged()) c.badges = p->badges(), c.title = p->explanation();
  return c;
}

// "6.2e-02": a relative error is read by its order of magnitude.
std::string fmt_rel_error(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

// Appends what the point's precision cost, where its record says (infer records carry
// metrics.accuracy, fp8 ones metrics.fp8; a point that failed its check too, to say by how much):
// image 0's logits' relative error against float64, a marker where the top-1 class differs, and
// fp8's layers that fell back to f16 (and how many because fp8 timed slower). Returns false, the
// cell untouched, for records without them (training, older runs).
bool add_precision_cost(Cell& c, const Point& p) {
  std::vector<std::string> notes, why;
  if (const auto err = p.typed().metric("accuracy.logits_rel_error_vs_f64")) {
    notes.push_back("err " + fmt_rel_error(*err));
    why.push_back("image 0's logits vs float64: relative error " + fmt(*err, 3));
  }
  if (flag(p.typed().metrics, "accuracy.top1_agrees_f64") == false) {
    notes.push_back("top-1 ≠ f64");
    why.push_back("its top-1 class differs from float64's");
  }
  const auto fp8_layers = p.typed().metric("fp8.layers"), fallback_layers = p.typed().metric("fp8.fallback_layers");
  if (fp8_layers && fallback_layers && *fallback_layers > 0) {
    notes.push_back(fmt(*fp8_layers) + " fp8 / " + fmt(*fallback_layers) + " fell back");
    std::string reasons;
    if (const json* listed = results::find_path(p.typed().metrics, "fp8.fallback_reasons"); listed != nullptr && listed->is_array())
      for (const auto& reason : *listed)
        if (reason.is_string()) reasons += (reasons.empty() ? ": " : ", ") + reason.get<std::string>();
    const auto slower = p.typed().metric("fp8.fallback_slower_layers");
    const std::string timed =
        slower && *slower > 0 ? " (" + fmt(*slower) + " of them because fp8 timed no faster there)" : std::string();
    why.push_back(fmt(*fp8_layers) + " layers ran fp8, " + fmt(*fallback_layers) + " fell back to f16" + timed +
                  reasons);
  }
  if (notes.empty()) return false;
  for (const auto& n : notes) c.text += (c.text.empty() ? "" : " · ") + n;
  for (const auto& w : why) c.title += (c.title.empty() ? "" : "; ") + w;
  return true;
}

std::optional<Section> precision_study(const std::vector<Point>& all, bool multi_run) {
  struct Row {
    std::size_t mode = 0;
    std::string model, other;
    double batch = 0;
    const Run* run = nullptr;
    std::map<std::string, const Point*> by_precision;
    std::optional<Metric> metric;
  };
  std::vector<Row> rows;
  std::set<std::string> precisions;
  int without_fp32 = 0;
  std::vector<std::vector<Point>> per_mode(kPrecisionWorkloads.size());  // the rows point into these
  for (std::size_t m = 0; m < kPrecisionWorkloads.size(); ++m) {
    const auto& pts = per_mode[m] = points_of(all, kPrecisionWorkloads[m]);
    const AxisPlan plan = plan_axes(pts);
    const auto metric = rate_metric(pts, plan);
    if (!metric || !find_axis(plan, "precision")) continue;
    std::map<std::string, std::size_t> index;
    std::vector<Row> groups;
    for (const auto& p : pts) {
      const auto prec = str(p.params(), "precision");
      if (!prec) continue;
      auto [it, added] = index.emplace(key_without(p, {"precision"}), groups.size());
      if (added) {
        Row r;
        r.mode = m;
        r.model = str(p.params(), "model").value_or("—");
        r.other = other_axes(p, plan, {"precision", "model", "batch"});
        r.batch = batch_of(p);
        r.run = p.run;
        r.metric = metric;
        groups.push_back(std::move(r));
      }
      groups[it->second].by_precision[*prec] = &p;  // records are in seq order: the newest wins
    }
    for (auto& g : groups) {
      if (g.by_precision.size() < 2) continue;
      if (!g.by_precision.count("fp32")) {
        ++without_fp32;
        continue;
      }
      for (const auto& [prec, p] : g.by_precision)
        if (prec != "fp32") precisions.insert(prec);
      rows.push_back(std::move(g));
    }
  }
  if (rows.empty()) return std::nullopt;
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.mode, a.model, a.batch, a.other) < std::tie(b.mode, b.model, b.batch, b.other);
  });
  std::vector<std::string> cols;  // known precisions in order of width, then any other
  for (const auto& p : kPrecisionOrder)
    if (precisions.count(p)) cols.push_back(p);
  for (const auto& p : precisions)
    if (std::find(cols.begin(), cols.end(), p) == cols.end()) cols.push_back(p);
  const bool any_other = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.other.empty(); });

  Table t;
  bool any_cost = false;
  t.caption = "speed-up over fp32 (×) at the same batch";
  if (multi_run) t.columns.push_back("run");
  t.columns.insert(t.columns.end(), {"mode", "model", "batch"});
  if (any_other) t.columns.push_back("other axes");
  const bool one_unit = std::all_of(rows.begin(), rows.end(), [&rows](const Row& r) { return r.metric->label == rows[0].metric->label; });
  t.columns.push_back("fp32 " + (one_unit ? rows[0].metric->label : std::string("rate")));
  for (const auto& c : cols) t.columns.push_back(c + " ×");
  for (const auto& r : rows) {
    std::vector<Cell> cells;
    if (multi_run) cells.push_back(text_cell(r.run->label, r.run->id));
    cells.push_back(text_cell(kPrecisionWorkloads[r.mode]));
    cells.push_back(text_cell(r.model));
    cells.push_back(num_cell(r.batch > 0 ? std::optional<double>(r.batch) : std::nullopt));
    if (any_other) cells.push_back(text_cell(r.other));
    const Point* base = r.by_precision.at("fp32");
    const auto base_rate = base->measured() ? r.metric->of(*base) : std::nullopt;
    Cell bc = rate_cell(base, base_rate);
    if (base_rate && !one_unit) bc.text += " " + r.metric->label;
    any_cost |= add_precision_cost(bc, *base);
    cells.push_back(bc);
    for (const auto& c : cols) {
      const auto it = r.by_precision.find(c);
      if (it == r.by_precision.end()) {
        cells.push_back(text_cell("—"));
        continue;
      }
      const Point* p = it->second;
      const auto rate = p->measured() ? r.metric->of(*p) : std::nullopt;
      Cell x;
      if (rate && base_rate && *base_rate > 0) {
        x = rate_cell(p, *rate / *base_rate, 3);
        if (!p->flagged() && base->flagged()) x.badges = base->badges(), x.title = "fp32: " + base->explanation();
      } else if (!p->measured()) {
        x = text_cell("—", p->explanation());
        x.badges = p->badges();
      } else {
        x = text_cell(base_rate ? "no rate" : "fp32 " + base->status, base->explanation());
      }
      any_cost |= add_precision_cost(x, *p);
      cells.push_back(std::move(x));
    }
    t.rows.push_back(std::move(cells));
  }

  Section s{"Precision study", 2, {}};
  s.blocks.push_back(Paragraph{
      "Speed-up of each precision over fp32 at the same model, batch and other axis values, for training (train) and "
      "inference (infer): the rate of the point divided by the fp32 point's — the tensor-core question of the MLPerf "
      "study. Above 1× the narrower precision is faster. A speed-up whose point or fp32 baseline did not converge "
      "or is noisy carries that badge; one that could not be measured says why." +
          (any_cost ? std::string(" Where a record says what its precision cost (inference), its cell adds the relative "
                                  "error of image 0's logits against the float64 reference (err), \"top-1 ≠ f64\" where "
                                  "the top class differs, and for fp8 how many layers ran fp8 and how many fell "
                                  "back to f16 when any did.")
                    : std::string()) +
          (without_fp32 ? " " + std::to_string(without_fp32) + " group(s) of several precisions have no fp32 point and are "
                              "left out (the workload sections list them)."
                        : std::string()),
      false});
  s.blocks.push_back(std::move(t));
  return s;
}

std::vector<Section> batch_study(const std::vector<Point>& all, const std::vector<Ceiling>& ceilings, bool multi_run) {
  const auto pts = points_of(all, kBatchWorkload);
  // Sweeps: points sharing everything but the batch, over at least kMinBatches batch sizes.
  std::map<std::string, std::set<double>> batches;
  for (const auto& p : pts)
    if (batch_of(p) > 0) batches[key_without(p, {"batch"})].insert(batch_of(p));
  std::vector<std::string> models;
  std::map<std::string, std::vector<Point>> by_model;
  for (const auto& p : pts) {
    const auto b = batches.find(key_without(p, {"batch"}));
    if (b == batches.end() || b->second.size() < kMinBatches) continue;
    const std::string model = str(p.params(), "model").value_or("—");
    if (!by_model.count(model)) models.push_back(model);
    by_model[model].push_back(p);
  }
  if (models.empty()) return {};
  std::vector<Section> out;
  out.push_back(Section{"Batch-size study", 2,
                        {Paragraph{"Inference per model against batch: images/s, the p50 and p99 of the per-batch latency "
                                   "(one forward per timing sample) and images per joule of device energy (samples/J = "
                                   "img/s/W; absent where the device reports no energy). Only sweeps of " +
                                       std::to_string(kMinBatches) + " or more batch sizes of the " + kBatchWorkload +
                                       " workload are shown; each point is in its table, flagged or not.",
                                   false}}});
  for (const auto& model : models) {
    const auto& mp = by_model[model];
    const AxisPlan plan = plan_axes(mp);
    Section s{"Batch-size study: " + model, 3, {}};
    Table t;
    t.caption = model + ": rate, latency and energy per batch";
    const bool any_other = std::any_of(mp.begin(), mp.end(), [&](const Point& p) { return !other_axes(p, plan, {"model", "batch"}).empty(); });
    if (multi_run) t.columns.push_back("run");
    if (any_other) t.columns.push_back("other axes");
    t.columns.insert(t.columns.end(), {"batch", "status", "samples/s", "p50 latency", "p99 latency", "samples/J", "mean power (W)"});
    std::vector<const Point*> order;
    for (const auto& p : mp) order.push_back(&p);
    std::stable_sort(order.begin(), order.end(), [&](const Point* a, const Point* b) {
      const auto sa = series_of(*a, plan, multi_run), sb = series_of(*b, plan, multi_run);
      return sa != sb ? sa < sb : batch_of(*a) < batch_of(*b);
    });
    for (const Point* p : order) {
      std::vector<Cell> cells;
      if (multi_run) cells.push_back(text_cell(p->run->label, p->run->id));
      if (any_other) cells.push_back(text_cell(other_axes(*p, plan, {"model", "batch"})));
      cells.push_back(num_cell(batch_of(*p)));
      cells.push_back(status_cell(*p));
      const bool ok = p->measured();
      cells.push_back(num_cell(ok ? p->typed().rate_of(&results::Rates::samples_per_s) : std::nullopt));
      for (const auto path : {&results::TimeStats::median_s, &results::TimeStats::p99_s}) {
        const auto v = ok ? p->typed().time_of(path) : std::nullopt;
        Cell c = text_cell(v ? fmt_time(*v) : "—");
        c.numeric = true;
        cells.push_back(c);
      }
      cells.push_back(num_cell(ok ? p->typed().telemetry_number("samples_per_j") : std::nullopt));
      cells.push_back(num_cell(ok ? p->typed().telemetry_number("mean_power_w") : std::nullopt));
      t.rows.push_back(std::move(cells));
    }
    s.blocks.push_back(std::move(t));
    // The workload section's charts, drawn for this model's sweeps only.
    const ChartInput in{kBatchWorkload + " " + model, mp, plan, multi_run};
    std::vector<std::optional<Chart>> charts;
    if (const auto metric = rate_metric(mp, plan)) charts.push_back(throughput_chart(in, *metric, ceilings));
    charts.push_back(latency_chart(in));
    charts.push_back(energy_chart(in));
    for (auto& c : charts) {
      if (!c) continue;
      c->title = model + ": " + c->title;
      s.blocks.push_back(std::move(*c));
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::vector<Section> study_sections(const std::vector<Point>& all, const std::vector<Ceiling>& ceilings, bool multi_run) {
  std::vector<Section> out;
  if (auto s = precision_study(all, multi_run)) out.push_back(std::move(*s));
  auto b = batch_study(all, ceilings, multi_run);
  std::move(b.begin(), b.end(), std::back_inserter(out));
  return out;
}

}  // namespace ab::report::detail
