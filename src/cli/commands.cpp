#include "cli/commands.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "backend/backend.h"
#include "core/error.h"
#include "harness/runner.h"
#include "harness/suggest.h"
#include "harness/suite.h"
#include "report/report.h"
#include "results/fields.h"
#include "results/output.h"
#include "results/results.h"
#include "system/build_info.h"
#include "system/system.h"
#include "system/topology.h"
#include "telemetry/telemetry.h"
#include "workloads/registry.h"

namespace ab::cli {
namespace {

std::atomic<bool> g_cancel{false};

void on_interrupt(int) {
  // Ctrl-C, SIGTERM, SIGHUP (the terminal closed): end the point in flight and stop. A repeated
  // signal does the same rather than kill the process, so the run is always closed as interrupted.
  g_cancel.store(true);
}

void handle_run_signals(void (*handler)(int)) {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, handler);
}

std::string join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Builds the plan: one workload, or each step of a suite, with --axis overrides applied to every
// step whose workload has those axes.
std::vector<harness::PlanEntry> build_plan(const RunOptions& o, const std::string& device_kind,
                                             const std::optional<harness::Suite>& suite) {
  std::vector<harness::AxisOverride> cli;
  for (const auto& a : o.axes) cli.push_back(harness::parse_axis_argument(a));
  harness::refuse_conflicting_overrides(cli);
  harness::OptionValues cli_options;
  for (const auto& a : o.options) {
    auto [name, value] = harness::parse_option_argument(a);
    cli_options.insert_or_assign(std::move(name), std::move(value));
  }
  std::vector<harness::PlanEntry> plan;
  if (!suite) {
    return harness::plan_for(workloads::find_workload(o.target), device_kind, cli, cli_options);
  }
  std::vector<bool> used(cli.size(), false);
  std::set<std::string> used_options;
  for (const auto& step : suite->steps) {
    auto& w = workloads::find_workload(step.workload);
    auto overrides = step.overrides;
    const auto axes = w.axes(device_kind);
    for (std::size_t i = 0; i < cli.size(); ++i) {
      const bool has = std::any_of(axes.begin(), axes.end(), [&](const auto& a) { return a.name == cli[i].names[0]; });
      if (has) {
        overrides.push_back(cli[i]);
        used[i] = true;
      }
    }
    harness::OptionValues options = step.options;  // --option wins over the step's
    for (const auto& spec : w.options())
      if (const auto it = cli_options.find(spec.name); it != cli_options.end()) {
        options[spec.name] = it->second;
        used_options.insert(spec.name);
      }
    auto part = harness::plan_for(w, device_kind, overrides, options);
    plan.insert(plan.end(), part.begin(), part.end());
  }
  for (std::size_t i = 0; i < cli.size(); ++i)
    if (!used[i]) throw UsageError("no workload in suite '" + suite->name + "' has axis '" + cli[i].names[0] + "'");
  for (const auto& [name, value] : cli_options)
    if (!used_options.contains(name)) throw UsageError("no workload in suite '" + suite->name + "' has option '" + name + "'");
  return plan;
}

}  // namespace

int sysinfo(bool json) {
  try {
    const auto devices = backend::list_devices();
    const auto host = system::host_info();
    if (json) {
      nlohmann::json j = system::make_context(devices, "", results::utc_now_iso8601());
      std::cout << j.dump(2) << '\n';
      return 0;
    }
    std::cout << "host      " << host.hostname << "  (" << host.os << ", " << host.kernel << ")\n"
              << "cpu       " << host.cpu_model << ", " << host.logical_cores << " logical cores\n"
              << "memory    " << std::fixed << std::setprecision(1) << static_cast<double>(host.memory_bytes) / (1 << 30)
              << " GiB\n";
    const auto& b = system::build_info();
    std::cout << "build     accelbench " << b.version << " " << b.git_commit.substr(0, 12) << (b.git_dirty ? "-dirty" : "")
              << ", " << b.build_type << ", " << (b.with_cuda ? "CUDA " + b.cuda_architectures : "CPU only") << '\n';
    for (const auto& d : devices) {
      std::cout << "device    " << d.id << "  " << d.name;
      if (d.kind == "cuda")
        std::cout << ", " << std::setprecision(1) << static_cast<double>(d.memory_bytes) / (1 << 30) << " GiB, "
                  << d.compute_units << " SMs, cc " << d.compute_capability << ", PCI " << d.pci_bus_id;
      std::cout << '\n';
      for (const auto& [k, v] : d.versions) std::cout << "          " << std::left << std::setw(16) << k << v << '\n';
    }
    if (const nlohmann::json topo = system::topology_json(devices); !topo.is_null()) {
      for (const auto& g : topo["gpus"]) {
        std::cout << "gpu link  " << g["id"].get<std::string>() << "  PCIe gen " << g["pcie"].value("gen", -1) << " x"
                  << g["pcie"].value("width", -1) << ", " << g["nvlink"]["links"].get<int>() << " NVLink(s)";
        if (g["nvlink"].contains("version")) std::cout << " " << g["nvlink"]["version"].get<std::string>();
        if (g.contains("numa_node")) std::cout << ", NUMA node " << g["numa_node"].get<int>();
        std::cout << '\n';
      }
      for (const auto& l : topo["links"]) {
        std::cout << "pair      " << l["a"].get<std::string>() << " - " << l["b"].get<std::string>() << "  "
                  << l["via"].get<std::string>();
        if (l.contains("nvlinks")) std::cout << " x" << l["nvlinks"].get<int>();
        std::cout << ", PCIe path " << l["pcie_path"].get<std::string>() << ", P2P read " << l["p2p_read"].get<std::string>()
                  << '\n';
      }
      if (topo.contains("note")) std::cout << "topology  " << topo["note"].get<std::string>() << '\n';
    }
    if (!backend::cuda_built()) std::cout << "note      CPU-only build: configure with --preset cuda for GPUs\n";
    else if (devices.size() == 1) std::cout << "note      CUDA build, but no GPU answered (no driver or no device)\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "accelbench sysinfo: " << e.what() << '\n';
    return 1;
  }
}

namespace {

nlohmann::json workload_json(const harness::Workload& w) {
  nlohmann::json axes = nlohmann::json::array();
  const auto cpu_axes = w.axes("cpu");
  const auto gpu_axes = w.axes("cuda");
  for (std::size_t i = 0; i < cpu_axes.size(); ++i) {
    nlohmann::json a = {{"name", cpu_axes[i].name},
                        {"kind", harness::kind_name(cpu_axes[i].kind)},
                        {"defaults_cpu", cpu_axes[i].defaults},
                        {"defaults_cuda", gpu_axes[i].defaults},
                        {"help", cpu_axes[i].help}};
    if (!cpu_axes[i].choices.empty()) a["choices"] = cpu_axes[i].choices;
    axes.push_back(a);
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : w.zip_groups()) {
    nlohmann::json tables = nlohmann::json::array();
    for (const auto& [name, rows] : g.tables)
      tables.push_back("@" + name + " (" + std::to_string(rows.size()) + " rows)");
    groups.push_back({{"axes", g.names}, {"tables", tables}});
  }
  nlohmann::json options = nlohmann::json::array();
  for (const auto& o : w.options()) {
    nlohmann::json j = {
        {"name", o.name}, {"kind", harness::kind_name(o.kind)}, {"default", o.default_value}, {"help", o.help}};
    if (!o.choices.empty()) j["choices"] = o.choices;
    options.push_back(j);
  }
  return {
      {"name", w.name()}, {"description", w.description()}, {"axes", axes}, {"zipped", groups}, {"options", options}};
}

void print_workload(std::ostream& out, const nlohmann::json& w) {
  out << w["name"].get<std::string>() << "\n  " << w["description"].get<std::string>() << '\n';
  for (const auto& a : w["axes"]) {
    out << "  --axis " << std::left << std::setw(12) << a["name"].get<std::string>() << " "
        << a["kind"].get<std::string>() << ", " << a["help"].get<std::string>() << '\n';
    const auto dc = a["defaults_cpu"].get<std::vector<std::string>>();
    const auto dg = a["defaults_cuda"].get<std::vector<std::string>>();
    out << "               default " << (dc == dg ? join(dc) : "cuda: " + join(dg) + "; cpu: " + join(dc)) << '\n';
    if (a.contains("choices"))
      out << "               choices " << join(a["choices"].get<std::vector<std::string>>()) << '\n';
  }
  for (const auto& o : w["options"]) {
    out << "  --option " << std::left << std::setw(10) << o["name"].get<std::string>() << " "
        << o["kind"].get<std::string>() << ", " << o["help"].get<std::string>() << '\n'
        << "               default " << o["default"].get<std::string>() << '\n';
    if (o.contains("choices"))
      out << "               choices " << join(o["choices"].get<std::vector<std::string>>()) << '\n';
  }
  for (const auto& g : w["zipped"]) {
    const auto tables = g["tables"].get<std::vector<std::string>>();
    out << "  zipped  " << join(g["axes"].get<std::vector<std::string>>()) << " vary together"
        << (tables.empty() ? "" : "; tables: " + join(tables, ", ")) << '\n';
  }
}

// The bundled suites with where each was found; a suite named like a workload runs as NAME.yaml.
int list_suites(bool json) {
  const auto suites = harness::bundled_suites();
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& s : suites)
      out.push_back({{"name", s.name}, {"description", s.description}, {"path", s.path.string()}});
    std::cout << out.dump(2) << '\n';
    return 0;
  }
  if (suites.empty()) {
    std::cout << "no bundled suites found; looked in: ";
    std::cout << "$ACCELBENCH_SUITES, share/accelbench/suites beside the binary, the install prefix, the source tree\n";
    return 0;
  }
  std::size_t width = 0;
  for (const auto& s : suites) width = std::max(width, s.name.size());
  for (const auto& s : suites) {
    const bool shadowed = workloads::registry().all().end() !=
                          std::find_if(workloads::registry().all().begin(), workloads::registry().all().end(),
                                       [&](const auto& w) { return w->name() == s.name; });
    std::cout << std::left << std::setw(static_cast<int>(width) + 2) << s.name << s.description
              << (shadowed ? " (run it as `accelbench run " + s.name + ".yaml`: `" + s.name + "` is a workload)" : "")
              << '\n';
  }
  std::cout << "\nfrom " << suites.front().path.parent_path().string()
            << " (set ACCELBENCH_SUITES for another folder)\n";
  return 0;
}

std::vector<std::string> workload_names() {
  std::vector<std::string> names;
  for (const auto& w : workloads::registry().all()) names.push_back(w->name());
  return names;
}

}  // namespace

int list(bool json, const std::string& what) {
  if (what == "suites") return list_suites(json);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& w : workloads::registry().all())
    if (what.empty() || what == "workloads" || what == w->name()) out.push_back(workload_json(*w));
  if (out.empty()) {
    auto names = workload_names();
    names.insert(names.begin(), {"suites", "workloads"});
    std::cerr << "accelbench list: unknown workload '" << what << "'; valid: suites, workloads, "
              << join(workload_names(), ", ") << harness::did_you_mean(what, names) << '\n';
    return 2;
  }
  if (json) {
    std::cout << (what.empty() || what == "workloads" ? out : out.front()).dump(2) << '\n';
    return 0;
  }
  for (const auto& w : out) {
    print_workload(std::cout, w);
    std::cout << '\n';
  }
  if (what.empty()) std::cout << "bundled suites: `accelbench list suites`; one workload: `accelbench list NAME`\n";
  return 0;
}

report::AxisOrder axis_order() {
  report::AxisOrder order;
  for (const auto& w : workloads::registry().all())
    for (const auto& a : w->axes("cpu")) order[w->name()].push_back(a.name);
  return order;
}

// A failed point is a failure (1), and so is one stopped by its timeout (what it measured is not
// the answer asked for); a point refused for its values (a bad axis value the plan could not see,
// e.g. out of range) a usage error (2), after every other point has run and been kept. A run that
// measured nothing (every point oom, skipped, ...) has no result to show: 1.
static int exit_code(const harness::RunTotals& totals) {
  if (totals.by_status.count("error") || totals.by_status.count("timeout")) return 1;
  if (totals.by_status.count("invalid")) return 2;
  return totals.by_status.count("ok") ? 0 : 1;
}

// `run quick`: a workload of that name first, then a suite file as given, then a bundled suite
// (harness::suite_dirs) by name or file name.
static std::string resolve_target(const std::string& target) {
  const auto names = workload_names();
  if (std::find(names.begin(), names.end(), target) != names.end()) return target;
  if (harness::looks_like_suite(target) && std::filesystem::exists(target)) return target;
  if (const auto bundled = harness::find_bundled_suite(target)) return bundled->string();
  if (harness::looks_like_suite(target)) return target;  // the suite loader names the missing file
  std::vector<std::string> suites, candidates = names;
  for (const auto& s : harness::bundled_suites()) {
    suites.push_back(s.name);
    candidates.push_back(s.name);
  }
  throw UsageError("unknown workload or suite '" + target + "'; valid: " + join(names, ", ") +
                   (suites.empty() ? "" : ", or a suite: " + join(suites, ", ")) +
                   " (`accelbench list`, `accelbench list suites`)" + harness::did_you_mean(target, candidates));
}

int run(const RunOptions& options) {
  RunOptions o = options;
  try {
    o.target = resolve_target(o.target);
  } catch (const UsageError& e) {
    std::cerr << "accelbench run: " << e.what() << '\n';
    return 2;
  }
  harness::RunSession session(o, std::cerr);
  const auto planner = [&o](const std::string& device_kind, const std::optional<harness::Suite>& suite) {
    return build_plan(o, device_kind, suite);
  };
  if (const int code = session.open(workloads::registry(), planner); code != 0) return code;
  handle_run_signals(on_interrupt);  // from here a Ctrl-C ends the run after the point in flight
  const std::optional<harness::RunTotals> ran = session.run(g_cancel);
  if (!ran) return 1;
  const harness::RunTotals& totals = *ran;
  if (const int code = session.close(totals); code != 0) return code;
  if (!session.leader()) return totals.interrupted ? 130 : exit_code(totals);
  handle_run_signals(SIG_DFL);

  const std::string& run_id = session.run_id();
  std::cout << '\n';
  report::print_summary(std::cout, totals.records, axis_order());
  std::cout << "\nrun " << run_id << ":";
  for (const auto& [status, n] : totals.by_status) std::cout << " " << n << " " << status;
  std::cout << "\nrecords: " << session.points_path().string() << "\n";
  if (totals.interrupted) {
    std::cerr << "accelbench run: interrupted; every point measured before it was kept\n";
    return 130;
  }
  return exit_code(totals);
}

// The listing of every run, one line each; stored text is escaped for the terminal.
static void write_run_list(std::ostream& out, const std::vector<results::RunRow>& runs) {
  out << std::left << std::setw(26) << "run_id" << std::setw(26) << "started" << std::setw(13) << "status" << std::setw(8)
      << "points" << std::setw(6) << "ok" << "command\n";
  for (const auto& r : runs)
    out << std::setw(26) << results::terminal_safe(r.run_id) << std::setw(26) << results::terminal_safe(r.started_at)
        << std::setw(13) << results::terminal_safe(r.shown_status) << ' ' << std::setw(8) << r.points << std::setw(6)
        << r.ok_points << results::terminal_safe(r.command_line) << '\n';
}

int results(const std::string& out_dir, const std::string& run_id, bool csv, const std::string& output_file,
            const std::string& fields, bool json) {
  try {
    const auto field_paths = fields.empty() ? std::vector<std::string>{} : results::split_field_list(fields);
    const std::filesystem::path db = std::filesystem::path(out_dir) / "runs" / "accelbench.db";
    if (!output_file.empty()) results::check_output_path(output_file, out_dir);  // before any work
    if (!std::filesystem::exists(db)) throw UsageError("no results store at " + db.string() + " (run something first, or pass --out)");
    // Everything is composed first and written at the end, so an error leaves no partial output.
    std::ostringstream out;
    const auto runs = results::list_runs(db);
    if (run_id.empty() && !csv && field_paths.empty()) {
      if (json) results::write_json(out, runs);
      else write_run_list(out, runs);
    } else {
      if (runs.empty()) throw UsageError("the store has no runs");
      const std::string id =
          run_id.empty() ? runs.front().run_id : results::resolve_run_id(runs, run_id).value_or(run_id);
      auto points = results::load_points(db, id);
      if (!field_paths.empty()) {
        results::write_fields(out, points, field_paths, csv);
      } else if (csv) {
        results::write_csv(out, points);
      } else if (json) {
        // load_points refused an unknown id, so its row is in the list.
        const auto row =
            std::find_if(runs.begin(), runs.end(), [&id](const results::RunRow& r) { return r.run_id == id; });
        results::write_json(out, *row, points);
      } else {
        for (auto& p : points)
          if (p.contains("time")) p["time"].erase("samples_s");
        report::print_summary(out, points, axis_order());
      }
    }
    if (output_file.empty()) results::write_stdout(out.str());
    else results::write_output_file(output_file, out_dir, out.str());
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "accelbench results: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "accelbench results: " << e.what() << '\n';
    return 1;
  }
}

int monitor(double interval_ms, double duration_s) {
  const auto refuse = [](const std::string& why) {
    std::cerr << "accelbench monitor: " << why << '\n';
    return 2;
  };
  if (!std::isfinite(interval_ms) || interval_ms <= 0)
    return refuse("--interval must be a finite number of milliseconds above 0, not " + std::to_string(interval_ms));
  if (!std::isfinite(duration_s) || duration_s < 0)
    return refuse("--duration must be a finite number of seconds of at least 0 (0: until Ctrl-C), not " +
                  std::to_string(duration_s));
  std::signal(SIGINT, on_interrupt);
  try {
    return telemetry::run_monitor(interval_ms / 1000.0, duration_s, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "accelbench monitor: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace ab::cli
