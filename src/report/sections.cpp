// The report's sections: summary and points needing attention, system context, measured ceilings,
// one section per workload with the charts its axes allow, the studies (studies.cpp), telemetry over time.
#include <algorithm>
#include <map>
#include <set>

#include "report/charts.h"
#include "report/model.h"
#include "results/results.h"

namespace ab::report {
using nlohmann::json;
using namespace detail;

std::size_t Document::chart_count() const {
  std::size_t n = 0;
  for (const auto& s : sections)
    for (const auto& b : s.blocks) n += std::holds_alternative<Chart>(b) ? 1 : 0;
  return n;
}

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Every axis of the point (the tooltip of its shorter label).
std::string all_axes_label(const Point& p) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : p.params().items()) keys.push_back(k);
  return params_label(p.params(), keys);
}

std::string gib(const std::optional<double>& bytes) { return bytes ? human_bytes(*bytes) : "—"; }

std::string device_line(const json& d) {
  std::string s = str(d, "id").value_or("?") + "  " + str(d, "name").value_or("?");
  if (const auto m = num(d, "memory_bytes"); m && *m > 0) s += ", " + human_bytes(*m);
  if (str(d, "kind") == "cuda") {
    if (const auto cu = num(d, "compute_units")) s += ", " + fmt(*cu) + " SMs";
    if (const auto cc = str(d, "compute_capability")) s += ", cc " + *cc;
    if (const auto pci = str(d, "pci_bus_id")) s += ", PCI " + *pci;
  }
  if (d.contains("versions") && d["versions"].is_object()) {
    std::vector<std::string> v;
    for (const auto& [k, val] : d["versions"].items()) v.push_back(k + " " + fmt_param(val));
    if (!v.empty()) s += " (" + join(v, ", ") + ")";
  }
  return s;
}

Section system_section(const std::vector<Run>& runs) {
  Section s{"System context", 2, {}};
  Table t;
  t.caption = "where and how each run was measured";
  t.columns.push_back("");
  for (const auto& r : runs) t.columns.push_back(r.label);
  auto row = [&](const std::string& name, const std::function<std::string(const Run&)>& value) {
    std::vector<Cell> cells{text_cell(name)};
    bool any = false;
    for (const auto& r : runs) {
      std::string v = value(r);
      any = any || !v.empty();
      cells.push_back(text_cell(v.empty() ? "—" : v));
    }
    if (any) t.rows.push_back(std::move(cells));
  };
  row("run id", [](const Run& r) { return r.id; });
  row("source", [](const Run& r) { return r.origin; });
  row("kind", [](const Run& r) { return r.external ? "external: published figures, not measured by accelbench" : "measured"; });
  row("system", [](const Run& r) { return str(r.context, "system").value_or(""); });
  row("run status", [](const Run& r) { return str(r.info, "status").value_or(""); });
  row("started / ended (UTC)", [](const Run& r) {
    const auto a = str(r.info, "started_at"), b = str(r.info, "ended_at");
    return a ? *a + (b ? " → " + *b : "") : "";
  });
  row("points", [](const Run& r) {
    std::map<std::string, int> by;
    for (const auto& p : r.points) ++by[str(p, "status").value_or("?")];
    std::string text = std::to_string(r.points.size());
    for (const auto& [k, n] : by) text += (k == by.begin()->first ? ": " : ", ") + std::to_string(n) + " " + k;
    return text;
  });
  row("command line", [](const Run& r) { return str(r.info, "command_line").value_or(str(r.context, "command_line").value_or("")); });
  row("suite", [](const Run& r) { return str(r.context, "suite").value_or(""); });
  row("host", [](const Run& r) { return str(r.context, "host.hostname").value_or(""); });
  row("OS, kernel", [](const Run& r) {
    const auto os = str(r.context, "host.os"), k = str(r.context, "host.kernel");
    return os || k ? os.value_or("?") + ", " + k.value_or("?") : "";
  });
  row("CPU", [](const Run& r) {
    const auto m = str(r.context, "host.cpu_model");
    const auto c = num(r.context, "host.cpu_cores");
    return m ? *m + (c ? ", " + fmt(*c) + " logical cores" : "") : "";
  });
  row("memory", [](const Run& r) {
    const auto m = num(r.context, "host.memory_bytes");
    return m ? gib(m) : std::string();
  });
  row("devices", [](const Run& r) {
    std::vector<std::string> v;
    if (r.context.contains("devices") && r.context["devices"].is_array())
      for (const auto& d : r.context["devices"]) v.push_back(device_line(d));
    return join(v, "\n");
  });
  row("interconnect", [](const Run& r) {
    if (const auto it = r.context.find("interconnect"); it != r.context.end())
      return it->is_string() ? it->get<std::string>() : it->dump();
    return r.external ? std::string() : std::string("not recorded by this run");
  });
  row("build", [](const Run& r) {
    if (!r.context.contains("build")) return std::string();
    const json& b = r.context["build"];
    std::string text = "accelbench " + str(b, "version").value_or("?") + " " + str(b, "git_commit").value_or("?").substr(0, 12);
    if (b.value("git_dirty", false)) text += "-dirty";
    text += ", " + str(b, "build_type").value_or("?") + ", " + str(b, "compiler").value_or("?");
    if (b.value("cuda", false)) text += ", CUDA " + str(b, "cuda_architectures").value_or("");
    if (const auto san = str(b, "sanitizers"); san && !san->empty()) text += ", sanitizers " + *san;
    return text;
  });
  row("compiler flags", [](const Run& r) { return str(r.context, "build.cxx_flags").value_or(""); });
  row("measurement", [](const Run& r) {
    if (!r.context.contains("measurement")) return std::string();
    const json& m = r.context["measurement"];
    const std::string warmup = m.contains("warmup_s") ? ", warm-up " + fmt_opt(num(m, "warmup_s")) + " s" : "";
    return "min time " + fmt_opt(num(m, "min_time_s")) + " s, noise target " + fmt_opt(num(m, "max_noise_pct")) + "%, timeout " +
           fmt_opt(num(m, "timeout_s")) + " s" + warmup + ", mode " + str(m, "mode").value_or("?");
  });
  s.blocks.push_back(std::move(t));
  for (const auto& r : runs)
    if (auto merged = merged_runs_table(r)) s.blocks.push_back(std::move(*merged));
  for (const auto& r : runs)
    for (const auto& n : r.notes) s.blocks.push_back(Paragraph{r.label + ": " + n, true});
  return s;
}

Section ceilings_section(const std::vector<Ceiling>& ceilings) {
  Section s{"Measured ceilings", 2, {}};
  if (ceilings.empty()) {
    s.blocks.push_back(Paragraph{"No ceilings were measured for the devices of these runs, so no point has a % of ceiling "
                                 "and the rooflines have no roofs. `accelbench run ceilings` measures them on a device "
                                 "(GEMM per precision and memory bandwidth); later runs on a device of the same name use them.",
                                 false});
    return s;
  }
  s.blocks.push_back(Paragraph{"Peak rates measured by accelbench on the same device (docs/METHODOLOGY.md, Ceilings); every "
                               "% of ceiling and every roof in this report divides by these, never by a vendor table.",
                               false});
  Table t;
  t.caption = "ceilings";
  t.columns = {"device", "ceiling", "value", "unit", "measured in", "status"};
  for (const auto& c : ceilings)
    t.rows.push_back({text_cell(c.device_name), text_cell(c.key), num_cell(c.status == "ok" ? std::optional<double>(c.value) : std::nullopt),
                      text_cell(c.unit), text_cell(c.source), Cell{c.reason, {c.status}, {}, false}});
  s.blocks.push_back(std::move(t));
  return s;
}

// Every flagged point with its reason, named by the axes that vary within its workload. Skipped
// points did not apply (no such device, an unsupported precision): one line per workload and run
// with the count and the reasons, so they never crowd out the points that went wrong.
Table attention_table(const std::vector<Point>& all, bool multi_run) {
  std::map<std::string, std::vector<Point>> by_workload;  // each workload's plan names its points by the axes that vary
  for (const auto& p : all) by_workload[p.workload()].push_back(p);
  std::map<std::string, AxisPlan> plans;
  for (const auto& [w, pts] : by_workload) plans[w] = plan_axes(pts);
  Table t;
  t.caption = "points that need attention";
  t.columns = {"workload", "point", "status", "median time", "±95% CI"};
  if (multi_run) t.columns.insert(t.columns.begin(), "run");
  std::map<std::pair<std::string, const Run*>, std::pair<int, std::set<std::string>>> skipped;
  std::vector<std::pair<std::string, const Run*>> skipped_order;
  for (const auto& p : all) {
    if (!p.flagged()) continue;
    if (p.status == "skipped") {
      auto& [n, reasons] = skipped[{p.workload(), p.run}];
      if (n++ == 0) skipped_order.emplace_back(p.workload(), p.run);
      reasons.insert(p.reason.empty() ? "no reason given" : p.reason);
      continue;
    }
    const auto med = p.typed().time_of(&results::TimeStats::median_s);
    const auto spread = p.typed().time_of(&results::TimeStats::rel_spread);
    Cell mc = text_cell(med ? fmt_time(*med) : "—"), sc = text_cell(spread ? "±" + fmt(*spread * 100, 3) + "%" : "—");
    mc.numeric = sc.numeric = true;
    const std::string label = params_label(p.params(), varying_axes(plans[p.workload()]));
    t.rows.push_back({text_cell(p.workload()), text_cell(label.empty() ? "its only point" : label, all_axes_label(p)),
                      status_cell(p), mc, sc});
    if (multi_run) t.rows.back().insert(t.rows.back().begin(), text_cell(p.run->label, p.run->id));
  }
  for (const auto& key : skipped_order) {
    const auto& [n, reasons] = skipped.at(key);
    std::vector<std::string> why(reasons.begin(), reasons.end());
    if (why.size() > 3) why = {why[0], why[1], why[2], "… (" + std::to_string(reasons.size()) + " reasons)"};
    std::vector<Cell> row{text_cell(key.first),
                          text_cell(std::to_string(n) + (n == 1 ? " point" : " points") + " skipped"),
                          Cell{join(why, "; "), {"skipped"}, {}, false}, text_cell("—"), text_cell("—")};
    if (multi_run) row.insert(row.begin(), text_cell(key.second->label, key.second->id));
    t.rows.push_back(std::move(row));
  }
  return t;
}

Section summary_section(const std::vector<Run>& runs, const std::vector<Point>& all) {
  Section s{"Summary", 2, {}};
  std::map<std::string, int> by_status;
  int unconverged = 0, noisy = 0, external = 0;
  for (const auto& p : all) {
    ++by_status[p.status];
    unconverged += p.measured() && p.unconverged;
    noisy += p.measured() && p.noisy;
    external += p.external;
  }
  std::vector<std::string> parts;
  for (const auto& [k, n] : by_status) parts.push_back(std::to_string(n) + " " + k);
  std::string text = std::to_string(runs.size()) + (runs.size() == 1 ? " run, " : " runs, ") + std::to_string(all.size()) +
                     " points: " + join(parts, ", ") + ".";
  if (unconverged || noisy)
    text += " Of the measured points, " + std::to_string(unconverged) + " did not converge and " + std::to_string(noisy) +
            " are noisier than their target: their numbers are shown, marked, and deserve a re-run before anyone acts on them.";
  if (external) text += " " + std::to_string(external) + " points are published figures (external), not measurements.";
  int incomplete = 0;
  for (const auto& run : runs) {  // a run that ended short of its plan says so before anything else is read
    const std::string status = run.info.is_object() ? run.info.value("status", std::string()) : std::string();
    if (status.rfind("incomplete", 0) != 0) continue;
    ++incomplete;
    text += " Run " + run.id + " is " + status + ": its sweep did not finish.";
  }
  s.blocks.push_back(Paragraph{text, false});

  const Table t = attention_table(all, runs.size() > 1);
  std::size_t unreadable = 0;
  for (const auto& r : runs) unreadable += r.unreadable_lines;
  if (unreadable > 0)
    s.blocks.push_back(Paragraph{std::to_string(unreadable) +
                                     " line(s) of the points files could not be read and are in no table or chart: "
                                     "the runs section names them.",
                                 true});
  // "Nothing needs attention" only where nothing is missing: unread lines and unmeasured points are.
  if (t.rows.empty() && incomplete > 0)
    s.blocks.push_back(Paragraph{"Of the points recorded, none needs attention; the points the unfinished sweep " +
                                     std::string(incomplete == 1 ? "never reached are" : "s never reached are") +
                                     " in no table or chart.",
                                 true});
  else if (t.rows.empty() && unreadable > 0)
    s.blocks.push_back(Paragraph{"Of the points that could be read, none needs attention.", false});
  else if (t.rows.empty())
    s.blocks.push_back(Paragraph{"No point needs attention: every point is ok, and every measured one converged and met its "
                                 "noise target.",
                                 false});
  else s.blocks.push_back(t);
  return s;
}

Section workload_section(const std::string& workload, const std::vector<Point>& points, const std::vector<Ceiling>& ceilings,
                         bool multi_run) {
  Section s{"Workload: " + workload, 2, {}};
  const AxisPlan plan = plan_axes(points);
  const ChartInput in{workload, points, plan, multi_run};
  std::map<std::string, int> by_status;
  for (const auto& p : points) ++by_status[p.status];
  std::vector<std::string> parts, axes;
  for (const auto& [k, n] : by_status) parts.push_back(std::to_string(n) + " " + k);
  for (const auto& a : plan.axes) {
    if (a.constant) continue;
    std::vector<std::string> vals;
    for (const auto& v : a.values) vals.push_back(fmt_param(v));
    if (vals.size() > 8) vals = {vals.front(), "…", vals.back()};
    axes.push_back(a.name + " (" + join(vals, ", ") + ")");
  }
  const std::string constant = constant_axes_label(plan);
  s.blocks.push_back(
      Paragraph{std::to_string(points.size()) + " points (" + join(parts, ", ") + ")" +
                    (axes.empty() ? "." : "; axes that vary: " + join(axes, "; ") + ".") +
                    (constant.empty() ? "" : " Every point has " + constant + " (not repeated in the tables)."),
                false});
  if (auto t = loadgen_table(points, plan, multi_run)) s.blocks.push_back(std::move(*t));

  std::vector<Chart> charts;
  auto add = [&charts](std::optional<Chart> c) {
    if (c) charts.push_back(std::move(*c));
  };
  const auto metric = rate_metric(points, plan);
  if (metric) {
    auto line = throughput_chart(in, *metric, ceilings);
    if (line) add(std::move(line));
    else add(per_point_chart(in, *metric));
  }
  add(latency_chart(in));
  add(energy_chart(in));
  if (metric) {
    const std::size_t before = charts.size();
    add(precision_chart(in, *metric));
    const AxisInfo* precision = find_axis(plan, "precision");
    if (charts.size() == before && precision && precision->values.size() > 1 &&
        std::find(precision->values.begin(), precision->values.end(), json("fp32")) != precision->values.end())
      s.blocks.push_back(
          Paragraph{"No precision speed-up chart: no precision besides fp32 has a measured point with a "
                    "measured fp32 baseline (the tables below give each point's status).",
                    false});
  }
  add(roofline_chart(in, ceilings));
  if (metric) add(scaling_chart(in, *metric));
  if (charts.empty()) {
    Table t;
    t.caption = "every point";
    t.columns = point_columns(plan, multi_run);
    t.columns.push_back("median time");
    for (const auto& p : points) {
      auto cells = point_cells(p, plan, multi_run);
      const auto med = p.typed().time_of(&results::TimeStats::median_s);
      cells.push_back(text_cell(med ? fmt_time(*med) : "—"));
      t.rows.push_back(std::move(cells));
    }
    s.blocks.push_back(Paragraph{"No chart: no measured point of this workload has a rate to plot.", false});
    s.blocks.push_back(std::move(t));
  }
  for (auto& c : charts) s.blocks.push_back(std::move(c));
  return s;
}

}  // namespace

Document build_report(const std::vector<Run>& runs) {
  Document doc;
  doc.title = "accelbench report";
  std::vector<std::string> labels;
  for (const auto& r : runs) labels.push_back(r.label);
  doc.subtitle = (runs.size() == 1 ? "Run " : "Runs ") + join(labels, ", ") + " · generated " + results::utc_now_iso8601();

  std::vector<std::vector<Point>> per_run;
  std::vector<Point> all;
  for (const auto& r : runs) {
    per_run.push_back(make_points(r));
    all.insert(all.end(), per_run.back().begin(), per_run.back().end());
  }
  const bool multi_run = runs.size() > 1;
  const auto ceilings = collect_ceilings(runs);

  doc.sections.push_back(summary_section(runs, all));
  doc.sections.push_back(system_section(runs));
  doc.sections.push_back(ceilings_section(ceilings));

  std::vector<std::string> workloads;
  for (const auto& p : all)
    if (p.workload() != "ceilings" && std::find(workloads.begin(), workloads.end(), p.workload()) == workloads.end())
      workloads.push_back(p.workload());
  for (const auto& w : workloads) {
    std::vector<Point> pts;
    std::copy_if(all.begin(), all.end(), std::back_inserter(pts), [&w](const Point& p) { return p.workload() == w; });
    doc.sections.push_back(workload_section(w, pts, ceilings, multi_run));
  }
  for (auto& s : study_sections(all, ceilings, multi_run)) doc.sections.push_back(std::move(s));
  for (auto& s : feed_sections(all, multi_run)) doc.sections.push_back(std::move(s));
  for (auto& s : counter_sections(all, ceilings, multi_run)) doc.sections.push_back(std::move(s));
  for (const auto& r : runs) {
    auto blocks = telemetry_blocks(r);
    if (blocks.empty()) continue;
    Section s{"Telemetry over time: " + r.label, 2, std::move(blocks)};
    doc.sections.push_back(std::move(s));
  }
  return doc;
}

}  // namespace ab::report
