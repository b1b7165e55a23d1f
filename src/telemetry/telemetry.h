// Power, energy, clocks and host CPU on every measured window: NVML (loaded with dlopen, so a
// binary runs where no driver is), /proc and powercap, read by one sampler thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ab::telemetry {

// One reading of one GPU. A field the device does not report stays empty (never zero).
struct GpuSample {
  double t_s = 0;  // monotonic seconds, taken just before the first driver call of this reading
  std::optional<double> power_w;          // driver power reading (a 1 s average on Ampere+ except GA100)
  std::optional<double> power_instant_w;  // instantaneous power where the driver exposes it
  std::optional<double> energy_j;         // total-energy counter since driver load, from mJ
  std::optional<double> power_limit_w, sm_clock_mhz, mem_clock_mhz, temperature_c;
  std::optional<double> gpu_util_pct, mem_util_pct, mem_used_bytes;
  // Rates over the interval since this source's previous reading (from cumulative counters).
  std::optional<double> pcie_tx_bytes_per_s, pcie_rx_bytes_per_s;
  std::optional<double> nvlink_tx_bytes_per_s, nvlink_rx_bytes_per_s;
  std::optional<std::uint64_t> throttle_reasons;  // NVML clock-event reason bit mask
  std::optional<std::string> error;               // a driver call that failed at this point
};

// One reading of the host.
struct HostSample {
  double t_s = 0;
  std::vector<double> core_busy_frac;  // per core, over the interval since the previous reading; empty on the first
  double process_cpu_s = 0;            // user + system CPU time of this process (sampler thread included)
  std::optional<std::int64_t> rss_bytes;
  std::optional<double> package_energy_j;  // CPU packages (powercap intel-rapl), unwrapped, summed
  std::optional<std::string> error;
};

// What a reading includes; each level includes the ones before it. CPU time per GPU on an H200
// with driver 580, after a 20 ms sleep: fast ~35 us (values the driver caches); slow ~110 us
// (nvmlDeviceGetMemoryInfo alone ~70 us); counters ~5 ms (the energy counter spins for 4-5 ms).
enum class ReadLevel {
  fast,      // power (driver and instant), SM clock, throttle reasons
  slow,      // + power limit, memory clock, temperature, utilisation, memory used
  counters,  // + energy counter, PCIe/NVLink byte counters
};

// One device. read() is called from one thread at a time and must not throw: failures go into
// GpuSample::error.
class GpuSource {
 public:
  virtual ~GpuSource() = default;
  virtual std::string name() const = 0;
  virtual std::string pci_bus_id() const { return {}; }
  virtual GpuSample read(double t_s, ReadLevel level) = 0;
};

// libnvidia-ml.so.1 resolved at run time; every function looked up with dlsym, so a driver that
// lacks one leaves that field out. Thread-safe (NVML is).
class NvmlLibrary : public std::enable_shared_from_this<NvmlLibrary> {
 public:
  // Never throws: when the library or driver is missing, available() is false and reason() says why.
  static std::shared_ptr<NvmlLibrary> load(const std::string& soname = "libnvidia-ml.so.1");
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  bool available() const;
  const std::string& reason() const;
  std::string driver_version() const;  // empty if unknown
  int device_count() const;
  // nullptr with *error set when the device cannot be opened.
  std::unique_ptr<GpuSource> open_index(unsigned index, std::string* error);
  std::unique_ptr<GpuSource> open_pci_bus_id(const std::string& bus_id, std::string* error);
  struct NvmlTopology topology(const std::vector<std::string>& pci_bus_ids) const;  // read_nvml_topology

  struct Api;  // function pointers, defined in nvml.cpp

 private:
  NvmlLibrary();
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;
  bool initialised_ = false;
  std::string reason_;
};

// The interconnect as NVML reports it, raw, for system/'s context block (system::topology_json
// names and classifies it). Codes are NVML's; -1 where NVML did not answer.
struct NvlinkFacts {
  unsigned link = 0;
  int version_code = -1;     // nvmlNvlinkVersion_t
  std::string remote_bus_id;  // NVML's form, "00000000:19:00.0"
  int remote_type = -1;       // nvmlIntNvLinkDeviceType_t: 0 GPU, 1 IBM NPU, 2 NVSwitch
};
struct GpuLinkFacts {
  std::string pci_bus_id;
  std::vector<NvlinkFacts> nvlinks;  // active links only
  int pcie_gen = -1, pcie_width = -1, pcie_max_gen = -1, pcie_max_width = -1;
};
struct GpuPairFacts {
  std::size_t a = 0, b = 0;  // indexes into NvmlTopology::gpus
  int common_ancestor = -1;  // nvmlGpuTopologyLevel_t
  int p2p_read = -1, p2p_nvlink = -1;  // nvmlGpuP2PStatus_t (0 = OK)
};
struct NvmlTopology {
  std::vector<GpuLinkFacts> gpus;
  std::vector<GpuPairFacts> pairs;  // a < b
  std::string unavailable;  // why NVML answered nothing (no driver...)
};
// The listed GPUs (by PCI bus id) and every pair of them. Never throws.
NvmlTopology read_nvml_topology(const std::vector<std::string>& pci_bus_ids);

// Opens the listed devices (all devices when the list is empty). *unavailable_reason is set when
// NVML is missing or some device could not be opened; the devices that did open are returned.
std::vector<std::unique_ptr<GpuSource>> open_nvml_devices(const std::vector<std::string>& pci_bus_ids,
                                                          std::string* unavailable_reason);

// /proc and /sys readers; the roots are parameters so tests can point them at a fake tree. The
// files stay open and are re-read with pread: reopening them costs more than reading them.
class HostSource {
 public:
  explicit HostSource(std::filesystem::path proc_root = "/proc", std::filesystem::path sys_root = "/sys");
  HostSample read(double t_s);  // never throws
  bool has_package_energy() const { return !rapl_zones_.empty(); }
  std::string package_energy_note() const { return rapl_note_; }

 private:
  class File {  // an open file re-read from offset 0; reopened on failure
   public:
    explicit File(std::filesystem::path p = {}) : path_(std::move(p)) {}
    ~File();
    File(File&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}
    File& operator=(File&&) = delete;
    bool read(std::string& buf);
    const std::filesystem::path& path() const { return path_; }

   private:
    std::filesystem::path path_;
    int fd_ = -1;
  };
  struct CoreTicks {
    std::uint64_t busy = 0, total = 0;
  };
  struct RaplZone {
    File energy;
    double max_range_uj = 0;
    std::optional<double> last_uj;
  };
  bool read_core_ticks(std::vector<CoreTicks>& out);
  std::optional<double> read_package_energy_j();

  File stat_, statm_;
  std::vector<CoreTicks> prev_ticks_;
  std::vector<RaplZone> rapl_zones_;
  std::string rapl_note_;
  double rapl_unwrapped_j_ = 0;
  std::string buf_;
  std::int64_t page_bytes_;
};

// How busy the host is before a run starts: two readings of /proc/stat `window_s` apart (the run
// itself idle between them, so what is busy is other processes) and the load average.
struct HostLoad {
  double busy_cores = 0;  // sum over cores of the busy fraction in the window
  int cores = 0;          // cores /proc/stat lists
  std::optional<double> load_avg_1m;
};
HostLoad measure_host_load(double window_s, const std::filesystem::path& proc_root = "/proc");

// The verdict for a run of `threads` threads (OpenMP's for a CPU device) on `usable_cores`
// (the affinity mask; 0 = all): busy when other processes keep at least one core and a tenth
// of them busy; oversubscribed when the threads outnumber the free cores. The record's
// `context.host_load` (docs/RESULTS.md); `note` is set where either holds, the warning to print.
nlohmann::json host_load_json(const HostLoad& load, int usable_cores, int threads);

// Names of the bits set in an NVML clock-event (throttle) mask, e.g. "sw_power_cap".
std::vector<std::string> decode_throttle_reasons(std::uint64_t mask);

// Trace form of a sample: only the fields that are present.
nlohmann::json to_json(const GpuSample& s);
nlohmann::json to_json(const HostSample& s);

// How often each level of reading is taken; costs in docs/TELEMETRY.md.
struct SamplerOptions {
  double period_s = 0.020;       // ReadLevel::fast of every GPU
  double slow_period_s = 0.100;  // ReadLevel::slow and the host (/proc/stat counts in 10 ms ticks anyway)
  // ReadLevel::counters, per device, staggered across devices; 0 = 1 s per device, so one
  // expensive counter read happens per second whatever the GPU count. start(), stop() and the
  // reading summarize() asks for always read everything.
  double counter_period_s = 0;
};

// One thread samples every source. RAII: the destructor stops and joins, never throws.
class Sampler {
 public:
  // `clock` stamps the samples; it must be the clock of the measured windows and safe to call
  // from two threads. Sleeping between samples always uses steady_clock. This form takes the slow
  // level every max(period_s, 100 ms) and the counters at their default.
  Sampler(std::vector<std::unique_ptr<GpuSource>> gpus, std::unique_ptr<HostSource> host,
          double period_s = 0.020, std::function<double()> clock = {});
  Sampler(std::vector<std::unique_ptr<GpuSource>> gpus, std::unique_ptr<HostSource> host, SamplerOptions options,
          std::function<double()> clock = {});
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // start() reads every source once before it returns (so has_power() is known and a window
  // opened afterwards is bracketed); stop() reads once more after the thread has joined.
  void start();
  void stop();
  bool running() const;

  // Summary of [t0_s, t1_s]; see docs/TELEMETRY.md for every key. If the sampler is running and
  // has no full reading at or after t1_s yet, it asks the thread for one and waits (bounded).
  nlohmann::json summarize(double t0_s, double t1_s, double samples_processed) const;
  nlohmann::json trace() const;  // raw time series for --telemetry-trace
  // Drops readings older than t_s (keeping the last one before it, to bracket later windows).
  void discard_before(double t_s);
  bool has_power() const;         // any GPU reported power or energy
  double overhead_cpu_s() const;  // sampler CPU: the thread (wake-ups included) + start/stop reads
  std::size_t gpu_count() const { return gpus_.size(); }

 private:
  void loop();
  // Reads the sources due at this tick (all of them, with counters, when `full`), appends the
  // samples, returns the first timestamp.
  double tick(bool full);
  void account_cpu(double t_s, double cpu_s);
  void wait_for_reading_at_or_after(double t_s) const;

  std::vector<std::unique_ptr<GpuSource>> gpus_;
  std::unique_ptr<HostSource> host_;
  double period_s_;
  long slow_every_ = 1, counter_every_ = 1;  // in periods
  long tick_index_ = 0;                       // periodic ticks so far (sampler thread only)
  std::function<double()> clock_;

  mutable std::mutex data_m_;  // guards everything below up to the thread control
  mutable std::condition_variable data_cv_;
  std::vector<std::vector<GpuSample>> gpu_series_;
  std::vector<HostSample> host_series_;
  std::vector<std::pair<double, double>> overhead_series_;  // (t_s, cumulative sampler CPU s)
  double last_full_t_ = -1e300;  // time of the last reading of every source with its counters
  double overhead_cpu_s_ = 0;
  std::string thread_error_;

  mutable std::mutex ctl_m_;  // thread control
  mutable std::condition_variable ctl_cv_;
  bool stop_requested_ = false;
  mutable bool sample_requested_ = false;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<bool> has_power_{false};
  std::mutex lifecycle_m_;  // serialises start/stop
};

// `accelbench monitor`: a header, then every interval one line per GPU and one host line, like
// `nvidia-smi dmon`. Host columns only (with a note) when NVML is unavailable. duration_s 0 =
// until SIGINT (handled here and restored on return). Returns the exit code.
int run_monitor(double interval_s, double duration_s, std::ostream& out);
// The same loop over given sources, for tests; stops when should_stop() returns true.
int run_monitor(std::vector<std::unique_ptr<GpuSource>> gpus, std::unique_ptr<HostSource> host,
                const std::string& note, double interval_s, double duration_s, std::ostream& out,
                const std::function<bool()>& should_stop = {});

}  // namespace ab::telemetry
