#include "cli/commands.h"

#include <sched.h>

#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "core/error.h"
#include "dist/comm.h"
#include "dist/launcher.h"
#include "harness/runner.h"
#include "harness/suite.h"
#include "report/report.h"
#include "results/results.h"
#include "system/build_info.h"
#include "system/system.h"
#include "system/topology.h"
#include "telemetry/telemetry.h"
#include "workloads/registry.h"

namespace ab::cli {
namespace {

// CPUs this process may run on (its affinity mask); 0 if unknown.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

std::atomic<bool> g_cancel{false};

void on_interrupt(int) {
  // First Ctrl-C: finish the point in flight and stop; a second one kills (default action).
  g_cancel.store(true);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
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
  std::vector<harness::PlanEntry> plan;
  if (!suite) {
    return harness::plan_for(workloads::find_workload(o.target), device_kind, cli);
  }
  std::vector<bool> used(cli.size(), false);
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
    auto part = harness::plan_for(w, device_kind, overrides);
    plan.insert(plan.end(), part.begin(), part.end());
  }
  for (std::size_t i = 0; i < cli.size(); ++i)
    if (!used[i]) throw UsageError("no workload in suite '" + suite->name + "' has axis '" + cli[i].names[0] + "'");
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

int list(bool json) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& w : workloads::registry().all()) {
    nlohmann::json axes = nlohmann::json::array();
    const auto cpu_axes = w->axes("cpu");
    const auto gpu_axes = w->axes("cuda");
    for (std::size_t i = 0; i < cpu_axes.size(); ++i) {
      nlohmann::json a = {{"name", cpu_axes[i].name}, {"kind", harness::kind_name(cpu_axes[i].kind)},
                          {"defaults_cpu", cpu_axes[i].defaults}, {"defaults_cuda", gpu_axes[i].defaults},
                          {"help", cpu_axes[i].help}};
      if (!cpu_axes[i].choices.empty()) a["choices"] = cpu_axes[i].choices;
      axes.push_back(a);
    }
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : w->zip_groups()) {
      nlohmann::json tables = nlohmann::json::array();
      for (const auto& [name, rows] : g.tables) tables.push_back("@" + name + " (" + std::to_string(rows.size()) + " rows)");
      groups.push_back({{"axes", g.names}, {"tables", tables}});
    }
    out.push_back({{"name", w->name()}, {"description", w->description()}, {"axes", axes}, {"zipped", groups}});
  }
  if (json) {
    std::cout << out.dump(2) << '\n';
    return 0;
  }
  for (const auto& w : out) {
    std::cout << w["name"].get<std::string>() << "\n  " << w["description"].get<std::string>() << '\n';
    for (const auto& a : w["axes"]) {
      std::cout << "  --axis " << std::left << std::setw(12) << a["name"].get<std::string>() << " "
                << a["kind"].get<std::string>() << ", " << a["help"].get<std::string>() << '\n';
      const auto dc = a["defaults_cpu"].get<std::vector<std::string>>();
      const auto dg = a["defaults_cuda"].get<std::vector<std::string>>();
      std::cout << "               default " << (dc == dg ? join(dc) : "cuda: " + join(dg) + "; cpu: " + join(dc)) << '\n';
      if (a.contains("choices")) std::cout << "               choices " << join(a["choices"].get<std::vector<std::string>>()) << '\n';
    }
    for (const auto& g : w["zipped"]) {
      std::cout << "  zipped  " << join(g["axes"].get<std::vector<std::string>>()) << " vary together; tables: "
                << join(g["tables"].get<std::vector<std::string>>(), ", ") << '\n';
    }
    std::cout << '\n';
  }
  return 0;
}

// A failed point is a failure (1); a point refused for its values (a bad axis value the plan could
// not see, e.g. out of range) a usage error (2), after every other point has run and been kept.
static int exit_code(const harness::RunTotals& totals) {
  if (totals.by_status.count("error")) return 1;
  return totals.by_status.count("invalid") ? 2 : 0;
}

int run(const RunOptions& o) {
  // Under mpirun or srun every process runs this same command: they join MPI here, each drives its
  // own GPU, every point runs on all of them in lock step, and rank 0 alone writes the results.
  std::unique_ptr<dist::Session> session;
  try {
    session = std::make_unique<dist::Session>(dist::parse_launcher_env(dist::process_environment()));
  } catch (const std::exception& e) {
    std::cerr << "accelbench run: " << e.what() << '\n';
    return dynamic_cast<const UsageError*>(&e) || dynamic_cast<const Unsupported*>(&e) ? 2 : 1;
  }
  dist::Comm& world = dist::world();
  const bool leader = world.rank() == 0;
  const bool quiet = o.quiet || !leader;
  dist::Outcome setup;  // what went wrong here before anything runs; all ranks agree on it below
  std::unique_ptr<backend::Backend> be;
  std::optional<harness::Suite> suite;
  std::vector<harness::PlanEntry> plan;
  measure::Settings settings;
  std::unique_ptr<results::ResultStore> store;
  const std::string run_id = results::new_run_id();
  const std::string started_at = results::utc_now_iso8601();
  nlohmann::json context;
  // Everything that can be wrong with the request is found before anything runs.
  try {
    if (harness::looks_like_suite(o.target)) suite = harness::load_suite(o.target, workloads::registry());
    else workloads::find_workload(o.target);
    std::string device = o.device.empty() ? backend::best_device() : o.device;
    if (o.device.empty() && world.size() > 1 && device != "cpu")  // one GPU per process: local rank -> device
      device = "cuda:" + std::to_string(dist::device_for_rank(session->launch(), backend::collective_device_count()));
    if (device != "cpu" && device.rfind("cuda:", 0) != 0)
      throw UsageError("unknown device '" + device + "'; valid: cpu, cuda:N");
    if (suite) {
      if (suite->min_time_s) settings.min_time_s = *suite->min_time_s;
      if (suite->max_noise_pct) settings.max_noise_pct = *suite->max_noise_pct;
      if (suite->timeout_s) settings.timeout_s = *suite->timeout_s;
      if (suite->warmup_s) settings.warmup_s = *suite->warmup_s;
      if (suite->mode) settings.mode = measure::parse_timing_mode(*suite->mode);
    }
    if (o.min_time_s >= 0) settings.min_time_s = o.min_time_s;
    if (o.max_noise_pct >= 0) settings.max_noise_pct = o.max_noise_pct;
    if (o.timeout_s >= 0) settings.timeout_s = o.timeout_s;
    const bool warmup_asked = o.warmup_s >= 0 || (suite && suite->warmup_s);
    if (o.warmup_s >= 0) settings.warmup_s = o.warmup_s;
    if (!o.mode.empty()) settings.mode = measure::parse_timing_mode(o.mode);
    if (settings.max_noise_pct <= 0 || settings.timeout_s <= 0)
      throw UsageError("--max-noise and --timeout must be positive");
    // The timeout bounds the whole point: a warm-up of half of it or more would leave little to measure.
    if (warmup_asked && (settings.warmup_s < 0 || settings.warmup_s >= settings.timeout_s * measure::kMaxWarmupShare))
      throw UsageError("warm-up " + std::to_string(settings.warmup_s) + " s must be at least 0 and under half the timeout (" +
                       std::to_string(settings.timeout_s) + " s): raise --timeout too");
    plan = build_plan(o, device.rfind("cuda:", 0) == 0 ? "cuda" : "cpu", suite);
    be = backend::make_backend(device);
    context = system::make_context(backend::list_devices(), o.command_line, started_at);
    context["measurement"] = {{"min_time_s", settings.min_time_s}, {"max_noise_pct", settings.max_noise_pct},
                              {"timeout_s", settings.timeout_s}, {"warmup_s", settings.warmup_s}, {"mode", std::string(measure::to_string(settings.mode))}};
    if (suite) context["suite"] = suite->name;
  } catch (const UsageError& e) {
    setup = {2, e.what()};
  } catch (const std::exception& e) {
    setup = {1, e.what()};
  }
  // From here on every rank takes the same branch: a failure on one stops all of them.
  if (const dist::Outcome all = dist::agree(world, setup); all.code != 0) {
    if (leader || setup.code != 0) std::cerr << "accelbench run: " << all.message << '\n';
    return all.code;
  }
  std::string plan_text;
  for (const auto& e : plan) plan_text += e.workload->name() + " " + e.point.label() + "\n";
  if (!dist::same_on_all_ranks(world, plan_text)) {
    if (leader)
      std::cerr << "accelbench run: the ranks built different sweeps; every process needs the same command line and "
                   "the same number of visible GPUs\n";
    return 2;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : dist::gather_places(world, be->info().id, be->info().pci_bus_id))
    ranks.push_back({{"rank", r.rank}, {"local_rank", r.local_rank}, {"host", r.host}, {"device", r.device},
                     {"pci_bus_id", r.pci_bus_id}});
  context["dist"] = {{"launcher", session->launch().launcher}, {"processes", world.size()}, {"ranks", ranks}};
  // GPU counters: only rank 0's records are kept, so only rank 0 reads them. Not on a rank confined to
  // one CPU in a multi-process run (OpenMPI binds 2 ranks to a core each by default): there NVML's
  // sampling beside the workload corrupted the heap on the H200s (3 of 3 runs; none with
  // --bind-to none, none without GPU sampling; bench/RESULTS.md, issue 8). Cause not found.
  const bool sample_gpu = be->info().kind == "cuda" && !o.no_gpu_telemetry;
  const bool one_cpu_rank = sample_gpu && world.size() > 1 && usable_cpus() == 1;
  const std::string one_cpu_note =
      "GPU counters off: this rank may use only one CPU (mpirun's default --bind-to core for 2 ranks), where NVML "
      "sampling beside the workload corrupted the heap (bench/RESULTS.md); launch with --bind-to none or "
      "--bind-to socket for power and energy";
  if (one_cpu_rank) context["telemetry_note"] = one_cpu_note;
  if (leader) {
    try {
      store = std::make_unique<results::ResultStore>(o.out_dir, results::RunInfo{run_id, started_at, o.command_line, context});
    } catch (const std::exception& e) {
      setup = {2, std::string("cannot write results: ") + e.what()};
    }
  }
  if (const dist::Outcome all = dist::agree(world, setup); all.code != 0) {
    if (leader) std::cerr << "accelbench run: " << all.message << '\n';
    return all.code;
  }

  // Telemetry: NVML for the GPU under test (absent driver -> noted, never fatal), /proc for the host.
  std::string nvml_note;
  std::vector<std::string> bus_ids;
  if (sample_gpu && !one_cpu_rank && leader) bus_ids.push_back(be->info().pci_bus_id);
  if (one_cpu_rank && leader && !quiet) std::cerr << "telemetry: " << one_cpu_note << '\n';
  auto gpus = bus_ids.empty() ? std::vector<std::unique_ptr<telemetry::GpuSource>>{}
                              : telemetry::open_nvml_devices(bus_ids, &nvml_note);
  telemetry::Sampler sampler(std::move(gpus), std::make_unique<telemetry::HostSource>(),
                             o.telemetry_period_ms / 1000.0);
  sampler.start();
  if (sampler.has_power()) settings.min_window_s = 1.0;  // energy needs a window the power sensor can resolve
  if (!nvml_note.empty() && !quiet) std::cerr << "telemetry: GPU counters unavailable: " << nvml_note << '\n';

  harness::RunnerHooks hooks;
  const std::string device_name = be->info().name;
  const auto db = leader ? store->db_path() : std::filesystem::path();
  if (leader) hooks.find_stored_ceiling = [db, device_name](const std::string& key) -> std::optional<harness::Ceiling> {
    try {
      const auto p = results::latest_point(db, "ceilings", device_name, {{"target", key}});
      if (!p || !(*p)["rates"].contains("ceiling")) return std::nullopt;
      const auto& c = (*p)["rates"]["ceiling"];
      return harness::Ceiling{c["value"].get<double>(), c["unit"].get<std::string>(),
                                "run " + (*p)["run_id"].get<std::string>() + " seq " + std::to_string((*p)["seq"].get<int>())};
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  hooks.telemetry = [&sampler, keep = o.telemetry_trace](double t0, double t1, double samples) {
    nlohmann::json summary = sampler.summarize(t0, t1, samples);
    if (!keep) sampler.discard_before(t1);  // bounded memory on long runs unless the trace is wanted
    return summary;
  };
  if (leader) {  // the other ranks' records are the same points: rank 0's carry every rank's times
    hooks.sink = [&store](const nlohmann::json& record) { store->append(record); };
    hooks.artifact_dir = store->run_dir();
  }

  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  if (!quiet)
    std::cerr << "accelbench run " << run_id << ": " << plan.size() << " point(s) on " << be->info().id << " ("
              << be->info().name << (world.size() > 1 ? ") and " + std::to_string(world.size() - 1) + " more rank(s)" : ")")
              << ", results in " << store->run_dir().string() << '\n';
  harness::Runner runner(*be, settings, context, run_id, hooks, quiet ? nullptr : &std::cerr);
  harness::RunTotals totals;
  try {
    totals = runner.run(plan, g_cancel);
  } catch (const std::exception& e) {
    sampler.stop();
    if (store) store->finish("failed");
    std::cerr << "accelbench run: " << e.what() << '\n';
    dist::abort_launch(1);  // the other ranks would wait for this one at the next point
    return 1;
  }
  sampler.stop();
  if (!leader) return totals.interrupted ? 130 : exit_code(totals);
  if (o.telemetry_trace) {
    std::ofstream trace(store->run_dir() / "telemetry.json");
    trace << sampler.trace().dump() << '\n';
  }
  store->finish(totals.interrupted ? "interrupted" : "complete");
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);

  std::cout << '\n';
  report::print_summary(std::cout, totals.records);
  std::cout << "\nrun " << run_id << ":";
  for (const auto& [status, n] : totals.by_status) std::cout << " " << n << " " << status;
  std::cout << "\nrecords: " << store->points_path().string() << "\n";
  if (totals.interrupted) {
    std::cerr << "accelbench run: interrupted; every point measured before it was kept\n";
    return 130;
  }
  return exit_code(totals);
}

int results(const std::string& out_dir, const std::string& run_id, bool csv, const std::string& output_file) {
  try {
    const std::filesystem::path db = std::filesystem::path(out_dir) / "runs" / "accelbench.db";
    if (!std::filesystem::exists(db)) throw UsageError("no results store at " + db.string() + " (run something first, or pass --out)");
    std::ofstream file;
    if (!output_file.empty()) {
      file.open(output_file);
      if (!file) throw UsageError("cannot write " + output_file);
    }
    std::ostream& out = output_file.empty() ? std::cout : file;
    const auto runs = results::list_runs(db);
    if (run_id.empty() && !csv) {
      out << std::left << std::setw(26) << "run_id" << std::setw(26) << "started" << std::setw(13) << "status"
          << std::setw(8) << "points" << std::setw(6) << "ok" << "command\n";
      for (const auto& r : runs)
        out << std::setw(26) << r.run_id << std::setw(26) << r.started_at << std::setw(13) << r.status << std::setw(8)
            << r.points << std::setw(6) << r.ok_points << r.command_line << '\n';
      return 0;
    }
    if (runs.empty()) throw UsageError("the store has no runs");
    const std::string id = run_id.empty() ? runs.front().run_id : run_id;
    auto points = results::load_points(db, id);
    if (csv) {
      results::write_csv(out, points);
      return 0;
    }
    for (auto& p : points) {
      if (p.contains("time")) p["time"].erase("samples_s");
    }
    report::print_summary(out, points);
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
  std::signal(SIGINT, on_interrupt);
  try {
    return telemetry::run_monitor(interval_ms / 1000.0, duration_s, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "accelbench monitor: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace ab::cli
