// Host readings: per-core busy fractions from /proc/stat, this process's CPU time and resident
// memory, CPU package energy from powercap (intel-rapl; AMD's RAPL driver uses the same name).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string_view>
#include <thread>

#include "telemetry/telemetry.h"

namespace ab::telemetry {
namespace {

// Reads all of `fd` from offset 0 into `buf` (one pread for the small files used here).
bool pread_all(int fd, std::string& buf) {
  if (buf.size() < 4096) buf.resize(4096);
  std::size_t used = 0;
  for (;;) {
    if (used == buf.size()) buf.resize(buf.size() * 2);
    const ssize_t n = ::pread(fd, buf.data() + used, buf.size() - used, static_cast<off_t>(used));
    if (n < 0) return false;
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  buf.resize(used);
  return true;
}

std::optional<std::uint64_t> parse_u64(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc()) return std::nullopt;
  return v;
}

// Splits off the next whitespace-separated unsigned number; false at the end of the line.
bool next_u64(std::string_view& line, std::uint64_t& v) {
  std::size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  const auto [ptr, ec] = std::from_chars(line.data() + i, line.data() + line.size(), v);
  if (ec != std::errc()) return false;
  line.remove_prefix(static_cast<std::size_t>(ptr - line.data()));
  return true;
}

}  // namespace

HostSource::File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

bool HostSource::File::read(std::string& buf) {
  if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return false;
  if (pread_all(fd_, buf)) return true;
  ::close(fd_);  // a stale descriptor: try a fresh one next time
  fd_ = -1;
  return false;
}

HostSource::HostSource(std::filesystem::path proc_root, std::filesystem::path sys_root)
    : stat_(proc_root / "stat"), statm_(proc_root / "self" / "statm"), page_bytes_(sysconf(_SC_PAGESIZE)) {
  // Package zones are intel-rapl:N; their sub-zones (intel-rapl:N:M: core, uncore, dram) are parts of them.
  const auto powercap = sys_root / "class" / "powercap";
  std::error_code ec;
  std::vector<std::filesystem::path> zones;
  for (const auto& e : std::filesystem::directory_iterator(powercap, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("intel-rapl:", 0) == 0 && name.find(':', 11) == std::string::npos) zones.push_back(e.path());
  }
  std::sort(zones.begin(), zones.end());
  if (zones.empty()) {
    rapl_note_ = "no powercap (intel-rapl) interface; typical in VMs";
    return;
  }
  for (const auto& z : zones) {
    RaplZone zone{File(z / "energy_uj"), 0, std::nullopt};
    std::string text;
    if (!zone.energy.read(text) || !parse_u64(text)) continue;
    File range(z / "max_energy_range_uj");
    if (range.read(text)) zone.max_range_uj = static_cast<double>(parse_u64(text).value_or(0));
    rapl_zones_.push_back(std::move(zone));
  }
  if (rapl_zones_.empty())
    rapl_note_ = "powercap intel-rapl present but energy_uj is not readable (root only since Linux 5.10)";
}

bool HostSource::read_core_ticks(std::vector<CoreTicks>& out) {
  if (!stat_.read(buf_)) return false;
  out.clear();
  std::string_view rest(buf_);
  while (!rest.empty()) {
    const std::size_t eol = rest.find('\n');
    std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 1);
    // "cpuN user nice system idle iowait irq softirq steal guest guest_nice"; the aggregate "cpu " is skipped.
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] < '0' || line[3] > '9') {
      if (!out.empty()) break;  // the cpuN lines are contiguous
      continue;
    }
    line.remove_prefix(3);
    std::uint64_t id = 0, v[8] = {};
    if (!next_u64(line, id)) continue;
    for (auto& x : v)
      if (!next_u64(line, x)) break;  // older kernels have fewer columns
    // Busy: user, nice, system, irq, softirq (guest time is already inside user and nice).
    // Not busy: idle, iowait, and steal (time the hypervisor gave to someone else).
    CoreTicks t;
    t.busy = v[0] + v[1] + v[2] + v[5] + v[6];
    t.total = t.busy + v[3] + v[4] + v[7];
    out.push_back(t);
  }
  return !out.empty();
}

std::optional<double> HostSource::read_package_energy_j() {
  if (rapl_zones_.empty()) return std::nullopt;
  for (auto& z : rapl_zones_) {
    if (!z.energy.read(buf_)) return std::nullopt;
    const auto raw = parse_u64(buf_);
    if (!raw) return std::nullopt;
    const double uj = static_cast<double>(*raw);
    if (z.last_uj) {
      double delta = uj - *z.last_uj;
      if (delta < 0) delta += z.max_range_uj;  // the counter wrapped at max_energy_range_uj
      rapl_unwrapped_j_ += std::max(delta, 0.0) / 1e6;
    } else {
      rapl_unwrapped_j_ += uj / 1e6;
    }
    z.last_uj = uj;
  }
  return rapl_unwrapped_j_;
}

HostSample HostSource::read(double t_s) {
  HostSample s;
  s.t_s = t_s;
  try {
    std::vector<CoreTicks> ticks;
    if (read_core_ticks(ticks)) {
      if (ticks.size() == prev_ticks_.size()) {  // a core going offline makes this interval unusable
        s.core_busy_frac.resize(ticks.size());
        for (std::size_t c = 0; c < ticks.size(); ++c) {
          const std::uint64_t busy = ticks[c].busy - std::min(ticks[c].busy, prev_ticks_[c].busy);
          const std::uint64_t total = ticks[c].total - std::min(ticks[c].total, prev_ticks_[c].total);
          s.core_busy_frac[c] = total > 0 ? std::min(1.0, static_cast<double>(busy) / static_cast<double>(total)) : 0.0;
        }
      }
      prev_ticks_ = std::move(ticks);
    } else {
      s.error = "cannot read " + stat_.path().string();
    }
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
      s.process_cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                        static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    }
    // statm: "size resident shared ..." in pages; resident is what status calls VmRSS, cheaper to make.
    if (statm_.read(buf_)) {
      std::string_view line(buf_);
      std::uint64_t size = 0, resident = 0;
      if (next_u64(line, size) && next_u64(line, resident))
        s.rss_bytes = static_cast<std::int64_t>(resident) * page_bytes_;
    }
    s.package_energy_j = read_package_energy_j();
  } catch (const std::exception& e) {  // allocation failure: keep what was read
    s.error = e.what();
  }
  return s;
}

HostLoad measure_host_load(double window_s, const std::filesystem::path& proc_root) {
  HostSource source(proc_root, "/nonexistent");  // no powercap: only the core ticks are wanted
  const HostSample before = source.read(0);
  std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
  const HostSample s = source.read(window_s);
  HostLoad load;
  load.cores = static_cast<int>(s.core_busy_frac.size());
  for (const double f : s.core_busy_frac) load.busy_cores += f;
  // This process's own threads (OpenBLAS's spinning after start-up) are not someone else's load.
  if (window_s > 0)
    load.busy_cores = std::max(0.0, load.busy_cores - (s.process_cpu_s - before.process_cpu_s) / window_s);
  std::ifstream in(proc_root / "loadavg");
  if (double avg = 0; in >> avg) load.load_avg_1m = avg;
  return load;
}

nlohmann::json host_load_json(const HostLoad& load, int usable_cores, int threads) {
  const int cores = usable_cores > 0 && (load.cores == 0 || usable_cores < load.cores) ? usable_cores : load.cores;
  // Others' busy time spreads over every core; the share of it on this run's cores is in proportion.
  const double busy = load.cores > 0 ? load.busy_cores * cores / load.cores : 0.0;
  const double free_cores = std::max(0.0, cores - busy);
  const bool is_busy = cores > 0 && busy >= std::max(1.0, 0.1 * cores);
  const bool oversubscribed = cores > 0 && threads > static_cast<int>(std::lround(free_cores));
  nlohmann::json j = {{"cores", cores},     {"busy_cores", busy}, {"free_cores", free_cores},
                      {"threads", threads}, {"busy", is_busy},    {"oversubscribed", oversubscribed}};
  if (load.load_avg_1m) j["load_avg_1m"] = *load.load_avg_1m;
  if (is_busy || oversubscribed) {
    std::ostringstream note;
    note << std::fixed << std::setprecision(1) << "the host is shared: other processes kept " << busy << " of " << cores
         << " core(s) busy before the run";
    if (load.load_avg_1m) note << " (load average " << *load.load_avg_1m << ")";
    if (oversubscribed)
      note << ", and the run's " << threads << " thread(s) outnumber the " << free_cores << " free core(s)";
    note << "; CPU timings will be slower and may sit on a steady plateau with low noise";
    j["note"] = note.str();
  }
  return j;
}

}  // namespace ab::telemetry
