#include "harness/session.h"

#include <sched.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "backend/collectives.h"
#include "core/error.h"
#include "counters/counters.h"
#include "dist/comm.h"
#include "dist/launcher.h"
#include "results/results.h"
#include "system/system.h"
#include "telemetry/telemetry.h"

namespace ab::harness {
namespace {

constexpr const char* kWho = "accelbench run: ";

// CPUs this process may run on (its affinity mask); 0 if unknown.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

// The threads a point keeps busy on the host: OpenMP's on a CPU device, the launching thread's on a GPU.
int run_threads(const backend::DeviceInfo& device) {
  if (device.kind != "cpu") return 1;
  const auto it = device.versions.find("openmp_threads");
  try {
    return it == device.versions.end() ? 1 : std::stoi(it->second);
  } catch (const std::exception&) {
    return 1;
  }
}

// Long enough for /proc/stat's 10 ms ticks to say which cores others keep busy.
constexpr double kHostLoadWindowS = 0.1;

// The suite as run: its path and text, so the record says what was asked even after the file changes.
nlohmann::json suite_file_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return {{"path", std::filesystem::absolute(path).lexically_normal().string()}, {"text", text.str()}};
}

// The device this rank measures: the request's, else the best present; under a launcher of
// several processes, one GPU per process (local rank -> device).
std::string resolve_device(const std::string& requested, const dist::LaunchInfo& launch, int world_size) {
  std::string device = requested.empty() ? backend::best_device() : requested;
  if (requested.empty() && world_size > 1 && device != "cpu")
    device = "cuda:" + std::to_string(dist::device_for_rank(launch, backend::collective_device_count()));
  if (device != "cpu" && device.rfind("cuda:", 0) != 0)
    throw UsageError("unknown device '" + device + "'; valid: cpu, cuda:N");
  return device;
}

// The best ceiling of the newest run that measured it on this device, from the store (none if unreadable).
std::optional<Ceiling> stored_ceiling(const std::filesystem::path& db, const std::string& device_name,
                                      const std::string& key) {
  try {
    const auto p = results::best_stored_ceiling(db, device_name, key);
    if (!p) return std::nullopt;
    const auto& c = (*p)["rates"]["ceiling"];
    return Ceiling{c["value"].get<double>(), c["unit"].get<std::string>(),
                   "run " + (*p)["run_id"].get<std::string>() + " seq " + std::to_string((*p)["seq"].get<int>())};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// GPU counters off on a rank confined to one CPU in a multi-process run (OpenMPI binds 2 ranks to
// a core each by default): there NVML's sampling beside the workload corrupted the heap on the
// H200s (3 of 3 runs; none with --bind-to none, none without GPU sampling; bench/RESULTS.md).
// Cause not found.
const char* const kOneCpuNote =
    "GPU counters off: this rank may use only one CPU (mpirun's default --bind-to core for 2 ranks), where NVML "
    "sampling beside the workload corrupted the heap (bench/RESULTS.md); launch with --bind-to none or "
    "--bind-to socket for power and energy";

// One setting: the request's value over the suite's over `fallback`, each checked where it came
// from, so the message names what to change.
double pick(const std::optional<double>& asked, const std::optional<double>& suited, double fallback,
            const char* option, const char* suite_key, bool zero_allowed, const std::optional<Suite>& suite) {
  const auto check = [zero_allowed](double v, const std::string& name) {
    if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_allowed))
      throw UsageError(name + " must be a finite number " + (zero_allowed ? "of at least 0" : "above 0") + ", not " +
                       std::to_string(v));
    return v;
  };
  if (asked) return check(*asked, option);
  if (suited) {
    const auto at = suite->setting_at.find(suite_key);
    return check(*suited, (at != suite->setting_at.end() ? at->second + ": " : "suite '" + suite->name + "': ") +
                              "setting '" + suite_key + "'");
  }
  return fallback;
}

}  // namespace

measure::Settings merge_settings(const RunRequest& o, const std::optional<Suite>& suite) {
  const Suite none;
  const Suite& s = suite ? *suite : none;
  measure::Settings settings;
  settings.min_time_s = pick(o.min_time_s, s.min_time_s, settings.min_time_s, "--min-time", "min_time", true, suite);
  settings.max_noise_pct = pick(o.max_noise_pct, s.max_noise_pct, settings.max_noise_pct, "--max-noise", "max_noise", false, suite);
  settings.timeout_s = pick(o.timeout_s, s.timeout_s, settings.timeout_s, "--timeout", "timeout", false, suite);
  settings.warmup_s = pick(o.warmup_s, s.warmup_s, settings.warmup_s, "--warmup", "warmup", true, suite);
  if (s.mode) settings.mode = measure::parse_timing_mode(*s.mode);
  if (!o.mode.empty()) settings.mode = measure::parse_timing_mode(o.mode);
  // A setting that clashes with another names the suite's line when the suite gave it.
  const auto from_suite = [&](const std::optional<double>& asked, const char* key) {
    const auto at = s.setting_at.find(key);
    return !asked && at != s.setting_at.end() ? at->second + ": " : std::string();
  };
  // A point stops at its timeout: a minimum measured time beyond it could never be met.
  if (settings.min_time_s > settings.timeout_s)
    throw UsageError(from_suite(o.min_time_s, "min_time") + from_suite(o.timeout_s, "timeout") + "min-time " +
                     std::to_string(settings.min_time_s) + " s is above the timeout (" +
                     std::to_string(settings.timeout_s) + " s): lower --min-time or raise --timeout");
  // The timeout bounds the whole point: a warm-up of half of it or more would leave little to measure.
  const bool warmup_asked = o.warmup_s || s.warmup_s;
  if (warmup_asked && settings.warmup_s >= settings.timeout_s * measure::kMaxWarmupShare)
    throw UsageError(from_suite(o.warmup_s, "warmup") + from_suite(o.timeout_s, "timeout") + "warm-up " +
                     std::to_string(settings.warmup_s) + " s must be at least 0 and under half the timeout (" +
                     std::to_string(settings.timeout_s) + " s): raise --timeout too");
  return settings;
}

RunSession::RunSession(RunRequest request, std::ostream& err) : request_(std::move(request)), err_(err) {}

RunSession::~RunSession() = default;

std::filesystem::path RunSession::points_path() const { return store_ ? store_->points_path() : std::filesystem::path(); }

// Under mpirun or srun every process runs this same command: they join MPI here, each drives its
// own GPU, every point runs on all of them in lock step, and rank 0 alone writes the results.
int RunSession::join_launch() {
  try {
    launch_ = std::make_unique<dist::Session>(dist::parse_launcher_env(dist::process_environment()));
  } catch (const std::exception& e) {
    err_ << kWho << e.what() << '\n';
    return dynamic_cast<const UsageError*>(&e) || dynamic_cast<const Unsupported*>(&e) ? 2 : 1;
  }
  leader_ = dist::world().rank() == 0;
  quiet_ = request_.quiet || !leader_;
  run_id_ = results::new_run_id();
  started_at_ = results::utc_now_iso8601();
  return 0;
}

// The request's checks, the plan, the backend and the context block; throws on the first problem.
void RunSession::prepare(const Registry& registry, const Planner& planner) {
  if (!std::isfinite(request_.telemetry_period_ms) || request_.telemetry_period_ms <= 0)
    throw UsageError("--telemetry-period must be a finite number of milliseconds above 0, not " +
                     std::to_string(request_.telemetry_period_ms));
  if (looks_like_suite(request_.target)) suite_ = load_suite(request_.target, registry);
  else registry.find(request_.target);
  const std::string device = resolve_device(request_.device, launch_->launch(), dist::world().size());
  settings_ = merge_settings(request_, suite_);
  plan_ = planner(device.rfind("cuda:", 0) == 0 ? "cuda" : "cpu", suite_);
  backend_ = backend::make_backend(device);
  context_ = system::make_context(backend::list_devices(), request_.command_line, started_at_);
  context_["measurement"] = {{"min_time_s", settings_.min_time_s}, {"max_noise_pct", settings_.max_noise_pct},
                             {"timeout_s", settings_.timeout_s},   {"warmup_s", settings_.warmup_s},
                             {"mode", std::string(measure::to_string(settings_.mode))}};
  const std::string counter_set = !request_.counters.empty()   ? request_.counters
                                  : suite_ && suite_->counters ? *suite_->counters
                                                               : "off";
  if (const counters::MetricSet set = counters::parse_metric_set(counter_set); set != counters::MetricSet::off) {
    counters_ = counters::open_session(set, backend_->info().id);
    context_["measurement"]["counters"] = counter_set;
  }
  if (suite_) context_["suite"] = suite_->name;
  if (suite_) context_["suite_file"] = suite_file_json(request_.target);
  context_["host_load"] = telemetry::host_load_json(telemetry::measure_host_load(kHostLoadWindowS), usable_cpus(),
                                                    run_threads(backend_->info()));
  if (!quiet_ && context_["host_load"].contains("note"))
    err_ << "accelbench warning: " << context_["host_load"]["note"].get<std::string>() << '\n';
}

// Every rank must have built the same sweep; then the context learns where each rank runs.
int RunSession::agree_plan() {
  dist::Comm& world = dist::world();
  std::string plan_text;
  for (const auto& e : plan_) plan_text += e.workload->name() + " " + e.point.label() + "\n";
  if (!dist::same_on_all_ranks(world, plan_text)) {
    if (leader_)
      err_ << kWho << "the ranks built different sweeps; every process needs the same command line and the same "
                      "number of visible GPUs\n";
    return 2;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : dist::gather_places(world, backend_->info().id, backend_->info().pci_bus_id))
    ranks.push_back({{"rank", r.rank}, {"local_rank", r.local_rank}, {"host", r.host}, {"device", r.device},
                     {"pci_bus_id", r.pci_bus_id}});
  context_["dist"] = {{"launcher", launch_->launch().launcher}, {"processes", world.size()}, {"ranks", ranks}};
  // GPU counters: only rank 0's records are kept, so only rank 0 reads them (kOneCpuNote).
  sample_gpu_ = backend_->info().kind == "cuda" && !request_.no_gpu_telemetry;
  one_cpu_rank_ = sample_gpu_ && world.size() > 1 && usable_cpus() == 1;
  if (one_cpu_rank_) context_["telemetry_note"] = kOneCpuNote;
  return 0;
}

constexpr double kHeartbeatGraceS = 1800;

// Rank 0 opens the store before anything is measured; every rank learns whether it could.
int RunSession::open_store() {
  dist::Outcome opened;
  if (leader_) {
    try {
      results::RunInfo info{run_id_, started_at_, request_.command_line, context_};
      info.planned_points = static_cast<std::int64_t>(plan_.size());
      // The heartbeat beats once a point; a point ends by its timeout plus its setup and check,
      // so a run silent for far longer than that has lost its process.
      info.stale_after_s = 4 * settings_.timeout_s + kHeartbeatGraceS;
      store_ = std::make_unique<results::ResultStore>(request_.out_dir, info);
    } catch (const std::exception& e) {
      opened = {2, std::string("cannot write results: ") + e.what()};
    }
  }
  const dist::Outcome all = dist::agree(dist::world(), opened);
  if (all.code != 0 && leader_) err_ << kWho << all.message << '\n';
  return all.code;
}

// NVML for the GPU under test (absent driver -> noted, never fatal), /proc for the host.
void RunSession::start_telemetry() {
  std::string nvml_note;
  std::vector<std::string> bus_ids;
  if (sample_gpu_ && !one_cpu_rank_ && leader_) bus_ids.push_back(backend_->info().pci_bus_id);
  if (one_cpu_rank_ && leader_ && !quiet_) err_ << "telemetry: " << kOneCpuNote << '\n';
  auto gpus = bus_ids.empty() ? std::vector<std::unique_ptr<telemetry::GpuSource>>{}
                              : telemetry::open_nvml_devices(bus_ids, &nvml_note);
  sampler_ = std::make_unique<telemetry::Sampler>(std::move(gpus), std::make_unique<telemetry::HostSource>(),
                                                  request_.telemetry_period_ms / 1000.0);
  sampler_->start();
  if (sampler_->has_power()) settings_.min_window_s = 1.0;  // energy needs a window the power sensor can resolve
  if (!nvml_note.empty() && !quiet_) err_ << "telemetry: GPU counters unavailable: " << nvml_note << '\n';
}

// The runner's hooks: stored ceilings and the sink on rank 0 (the other ranks' records are the
// same points: rank 0's carry every rank's times), telemetry windows on every rank.
void RunSession::wire_hooks() {
  if (leader_) {
    hooks_.find_stored_ceiling = [db = store_->db_path(), device_name = backend_->info().name](const std::string& key) {
      return stored_ceiling(db, device_name, key);
    };
    hooks_.sink = [this](const nlohmann::json& record) { store_->append(record); };
    hooks_.artifact_dir = store_->run_dir();
  }
  hooks_.counters = counters_.get();
  hooks_.telemetry = [this](double t0, double t1, double samples) {
    nlohmann::json summary = sampler_->summarize(t0, t1, samples);
    if (!request_.telemetry_trace) sampler_->discard_before(t1);  // bounded memory on long runs unless the trace is wanted
    return summary;
  };
}

int RunSession::open(const Registry& registry, const Planner& planner) {
  if (const int code = join_launch(); code != 0) return code;
  dist::Outcome setup;  // what went wrong here before anything runs; all ranks agree on it below
  try {
    prepare(registry, planner);
  } catch (const UsageError& e) {
    setup = {2, e.what()};
  } catch (const std::exception& e) {
    setup = {1, e.what()};
  }
  // From here on every rank takes the same branch: a failure on one stops all of them.
  if (const dist::Outcome all = dist::agree(dist::world(), setup); all.code != 0) {
    if (leader_ || setup.code != 0) err_ << kWho << all.message << '\n';
    return all.code;
  }
  try {  // what fails from here on fails on one rank: it ends the launch, as a failed run does
    if (const int code = agree_plan(); code != 0) return code;
    if (const int code = open_store(); code != 0) return code;
    start_telemetry();
    wire_hooks();
    return 0;
  } catch (const std::exception& e) {
    fail(e.what());
  }
  dist::abort_launch(1);
  return 1;
}

std::optional<RunTotals> RunSession::run(const std::atomic<bool>& cancel) {
  try {
    const int ranks = dist::world().size();
    if (!quiet_)
      err_ << "accelbench run " << run_id_ << ": " << plan_.size() << " point(s) on " << backend_->info().id << " ("
           << backend_->info().name << (ranks > 1 ? ") and " + std::to_string(ranks - 1) + " more rank(s)" : ")")
           << ", results in " << store_->run_dir().string() << '\n';
    Runner runner(*backend_, settings_, context_, run_id_, hooks_, quiet_ ? nullptr : &err_);
    return runner.run(plan_, cancel);
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("unknown exception");
  }
  dist::abort_launch(1);  // the other ranks would wait for this one at the next point
  return std::nullopt;
}

// The first error is printed before anything else is tried, and a failure while recording it is
// reported beside it, so neither hides the other nor where the measured points are.
void RunSession::fail(const std::string& what) noexcept {
  try {
    err_ << kWho << what << std::endl;
    std::string also;
    try {
      if (sampler_) sampler_->stop();
    } catch (const std::exception& e) {
      also = std::string("stopping the telemetry: ") + e.what();
    }
    try {
      if (store_) store_->finish("failed");
    } catch (const std::exception& e) {
      also += (also.empty() ? "" : "; ") + std::string("marking the run failed: ") + e.what();
    }
    if (!also.empty())
      err_ << kWho << "then " << also << (store_ ? "; the measured points are in " + points_path().string() : "")
           << std::endl;
  } catch (...) {  // out of memory or the error stream itself failed: nothing is left to report to
  }
}

int RunSession::close(const RunTotals& totals) {
  try {
    sampler_->stop();
    if (!leader_) return 0;
    if (request_.telemetry_trace) {
      std::ofstream trace(store_->run_dir() / "telemetry.json");
      trace << sampler_->trace().dump() << '\n';
    }
    store_->finish(totals.interrupted ? "interrupted" : "complete");
    return 0;
  } catch (const std::exception& e) {
    err_ << kWho << "closing the run: " << e.what()
         << (store_ ? "; the measured points are in " + points_path().string() : std::string()) << '\n';
    return 1;
  }
}

}  // namespace ab::harness
