// NVML through dlopen: every function resolved with dlsym, so a missing function, or one that
// answers NOT_SUPPORTED, leaves its field out instead of failing the run.
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "telemetry/nvml_api.h"
#include "telemetry/telemetry.h"

namespace ab::telemetry {

using nvml::Device;
using nvml::Return;

struct NvmlLibrary::Api {
  Return (*init)() = nullptr;  // nvmlInit_v2
  Return (*shutdown)() = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Return (*driver_version)(char*, unsigned) = nullptr;        // nvmlSystemGetDriverVersion
  Return (*device_count)(unsigned*) = nullptr;                 // nvmlDeviceGetCount_v2
  Return (*handle_by_index)(unsigned, Device*) = nullptr;      // nvmlDeviceGetHandleByIndex_v2
  Return (*handle_by_pci)(const char*, Device*) = nullptr;     // nvmlDeviceGetHandleByPciBusId_v2
  Return (*name)(Device, char*, unsigned) = nullptr;           // nvmlDeviceGetName
  Return (*pci_info)(Device, nvml::PciInfo*) = nullptr;        // nvmlDeviceGetPciInfo_v3
  Return (*power_usage)(Device, unsigned*) = nullptr;          // mW
  Return (*total_energy)(Device, unsigned long long*) = nullptr;  // mJ
  Return (*power_limit)(Device, unsigned*) = nullptr;          // nvmlDeviceGetEnforcedPowerLimit, mW
  Return (*clock_info)(Device, unsigned, unsigned*) = nullptr;  // MHz
  Return (*temperature)(Device, unsigned, unsigned*) = nullptr;
  Return (*utilization)(Device, nvml::Utilization*) = nullptr;
  Return (*memory_info)(Device, nvml::Memory*) = nullptr;
  Return (*clock_reasons)(Device, unsigned long long*) = nullptr;  // ...ClocksEventReasons or ...ThrottleReasons
  Return (*field_values)(Device, int, nvml::FieldValue*) = nullptr;
  // Topology
  Return (*nvlink_state)(Device, unsigned, int*) = nullptr;                  // nvmlDeviceGetNvLinkState
  Return (*nvlink_version)(Device, unsigned, unsigned*) = nullptr;           // nvmlDeviceGetNvLinkVersion
  Return (*nvlink_remote_pci)(Device, unsigned, nvml::PciInfo*) = nullptr;   // ...GetNvLinkRemotePciInfo_v2
  Return (*nvlink_remote_type)(Device, unsigned, int*) = nullptr;            // ...GetNvLinkRemoteDeviceType
  Return (*common_ancestor)(Device, Device, int*) = nullptr;                 // ...GetTopologyCommonAncestor
  Return (*p2p_status)(Device, Device, int, int*) = nullptr;                 // nvmlDeviceGetP2PStatus
  Return (*pcie_gen)(Device, unsigned*) = nullptr;                           // ...GetCurrPcieLinkGeneration
  Return (*pcie_width)(Device, unsigned*) = nullptr;                         // ...GetCurrPcieLinkWidth
  Return (*pcie_max_gen)(Device, unsigned*) = nullptr;                       // ...GetMaxPcieLinkGeneration
  Return (*pcie_max_width)(Device, unsigned*) = nullptr;                     // ...GetMaxPcieLinkWidth

  std::string message(const char* fn, Return r) const {
    const char* text = error_string ? error_string(r) : nullptr;
    return std::string(fn) + ": " + (text ? text : "NVML error " + std::to_string(r));
  }
};

namespace {

template <class F>
void resolve(void* handle, const char* symbol, F& fn) {
  void* p = dlsym(handle, symbol);
  static_assert(sizeof(p) == sizeof(fn));
  std::memcpy(&fn, &p, sizeof fn);  // POSIX guarantees data and function pointers convert
}

// Codes that will not change on the next call: the field is left out from then on.
bool is_unsupported(Return r) {
  return r == nvml::kErrorNotSupported || r == nvml::kErrorFunctionNotFound || r == nvml::kErrorNoPermission ||
         r == nvml::kErrorInvalidArgument;
}

std::optional<unsigned long long> field_as_u64(const nvml::FieldValue& f) {
  switch (f.valueType) {
    case nvml::kValueUInt: return f.value.uiVal;
    case nvml::kValueULong: return f.value.ulVal;
    case nvml::kValueULongLong: return f.value.ullVal;
    case nvml::kValueSLongLong: return f.value.sllVal < 0 ? std::nullopt : std::optional<unsigned long long>(f.value.sllVal);
    case nvml::kValueSInt: return f.value.siVal < 0 ? std::nullopt : std::optional<unsigned long long>(f.value.siVal);
    case nvml::kValueUShort: return f.value.usVal;
    case nvml::kValueDouble: return f.value.dVal < 0 ? std::nullopt : std::optional<unsigned long long>(f.value.dVal);
    default: return std::nullopt;
  }
}

class NvmlGpuSource final : public GpuSource {
 public:
  NvmlGpuSource(std::shared_ptr<NvmlLibrary> lib, const NvmlLibrary::Api& api, Device dev)
      : lib_(std::move(lib)), api_(api), dev_(dev) {
    char buf[nvml::kDeviceNameBufferSize] = {};
    if (api_.name && api_.name(dev_, buf, sizeof buf) == nvml::kSuccess) name_ = buf;
    nvml::PciInfo pci{};
    if (api_.pci_info && api_.pci_info(dev_, &pci) == nvml::kSuccess) bus_id_ = pci.busId;
    nvml::FieldValue f{};
    f.fieldId = nvml::kFiPowerInstantMw;
    fast_fields_.push_back(f);
    for (unsigned id : {nvml::kFiPcieTxBytes, nvml::kFiPcieRxBytes, nvml::kFiNvlinkDataTxKib, nvml::kFiNvlinkDataRxKib}) {
      f.fieldId = id;
      f.scopeId = (id == nvml::kFiNvlinkDataTxKib || id == nvml::kFiNvlinkDataRxKib) ? nvml::kScopeAllLinks : 0;
      counter_fields_.push_back(f);
    }
  }

  std::string name() const override { return name_.empty() ? "NVIDIA GPU" : name_; }
  std::string pci_bus_id() const override { return bus_id_; }

  GpuSample read(double t_s, ReadLevel level) override {
    GpuSample s;
    s.t_s = t_s;
    std::string errors;
    bool lost = false;
    // Calls `fn` if still supported; true on success. Unsupported codes switch the call off.
    auto call = [&](auto& fn, const char* fn_name, auto&&... args) -> bool {
      if (!fn || lost) return false;
      const Return r = fn(dev_, args...);
      if (r == nvml::kSuccess) return true;
      if (is_unsupported(r)) {
        fn = nullptr;
      } else {
        errors += (errors.empty() ? "" : "; ") + api_.message(fn_name, r);
        lost = lost || r == nvml::kErrorGpuIsLost;  // the remaining calls would fail the same way
      }
      return false;
    };
    const bool slow = level != ReadLevel::fast, counters = level == ReadLevel::counters;
    // The energy counter first: it is the reading the timestamp matters most for.
    unsigned long long mj = 0;
    if (counters && call(fns_.total_energy, "nvmlDeviceGetTotalEnergyConsumption", &mj))
      s.energy_j = static_cast<double>(mj) / 1e3;
    unsigned mw = 0, mhz = 0;
    if (call(fns_.power_usage, "nvmlDeviceGetPowerUsage", &mw)) s.power_w = mw / 1e3;
    if (!lost) read_fields(fast_fields_, s, t_s, errors);
    if (call(fns_.sm_clock, "nvmlDeviceGetClockInfo(SM)", nvml::kClockSm, &mhz)) s.sm_clock_mhz = mhz;
    unsigned long long reasons = 0;
    if (call(fns_.clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons", &reasons)) s.throttle_reasons = reasons;
    if (slow) {
      if (call(fns_.power_limit, "nvmlDeviceGetEnforcedPowerLimit", &mw)) s.power_limit_w = mw / 1e3;
      if (call(fns_.mem_clock, "nvmlDeviceGetClockInfo(MEM)", nvml::kClockMem, &mhz)) s.mem_clock_mhz = mhz;
      unsigned temp = 0;
      if (call(fns_.temperature, "nvmlDeviceGetTemperature", nvml::kTemperatureGpu, &temp)) s.temperature_c = temp;
      nvml::Utilization util{};
      if (call(fns_.utilization, "nvmlDeviceGetUtilizationRates", &util)) {
        s.gpu_util_pct = util.gpu;
        s.mem_util_pct = util.memory;
      }
      nvml::Memory mem{};
      if (call(fns_.memory_info, "nvmlDeviceGetMemoryInfo", &mem)) s.mem_used_bytes = static_cast<double>(mem.used);
    }
    if (!lost && counters) read_fields(counter_fields_, s, t_s, errors);
    if (!errors.empty()) s.error = errors;
    return s;
  }

 private:
  struct Counter {
    std::optional<unsigned long long> last;
    double last_t_s = 0;
  };

  // One nvmlDeviceGetFieldValues call for a list of fields; unsupported ones are dropped from it.
  void read_fields(std::vector<nvml::FieldValue>& fields, GpuSample& s, double t_s, std::string& errors) {
    if (fields.empty() || !api_.field_values) return;
    for (auto& f : fields) f.nvmlReturn = nvml::kSuccess;
    const Return r = api_.field_values(dev_, static_cast<int>(fields.size()), fields.data());
    if (r != nvml::kSuccess) {
      if (is_unsupported(r)) fields.clear();
      else errors += (errors.empty() ? "" : "; ") + api_.message("nvmlDeviceGetFieldValues", r);
      return;
    }
    std::vector<nvml::FieldValue> kept;
    for (const auto& f : fields) {
      if (f.nvmlReturn != nvml::kSuccess) {
        if (!is_unsupported(f.nvmlReturn)) {
          errors += (errors.empty() ? "" : "; ") +
                    api_.message(("nvmlDeviceGetFieldValues(" + std::to_string(f.fieldId) + ")").c_str(), f.nvmlReturn);
          kept.push_back(f);
        }
        continue;
      }
      kept.push_back(f);
      const auto v = field_as_u64(f);
      if (!v) continue;
      switch (f.fieldId) {
        case nvml::kFiPowerInstantMw: s.power_instant_w = static_cast<double>(*v) / 1e3; break;
        case nvml::kFiPcieTxBytes: s.pcie_tx_bytes_per_s = rate(pcie_tx_, f, *v, t_s, 1.0); break;
        case nvml::kFiPcieRxBytes: s.pcie_rx_bytes_per_s = rate(pcie_rx_, f, *v, t_s, 1.0); break;
        case nvml::kFiNvlinkDataTxKib: s.nvlink_tx_bytes_per_s = rate(nvl_tx_, f, *v, t_s, 1024.0); break;
        case nvml::kFiNvlinkDataRxKib: s.nvlink_rx_bytes_per_s = rate(nvl_rx_, f, *v, t_s, 1024.0); break;
        default: break;
      }
    }
    fields = std::move(kept);
  }

  // Bytes/s since the previous reading of a cumulative counter. A 32-bit counter wraps (mod 2^32);
  // a 64-bit one that goes backwards was reset, and that interval has no rate.
  static std::optional<double> rate(Counter& c, const nvml::FieldValue& f, unsigned long long v, double t_s,
                                    double unit_bytes) {
    const std::optional<unsigned long long> last = c.last;
    const double last_t = c.last_t_s;
    c.last = v;
    c.last_t_s = t_s;
    if (!last || t_s <= last_t) return std::nullopt;
    unsigned long long delta = v - *last;
    if (f.valueType == nvml::kValueUInt) delta &= 0xFFFFFFFFull;
    else if (v < *last) return std::nullopt;
    return static_cast<double>(delta) * unit_bytes / (t_s - last_t);
  }

  // Per-device copies of the function pointers, so one device's NOT_SUPPORTED leaves another's alone.
  struct Fns {
    decltype(NvmlLibrary::Api::total_energy) total_energy;
    decltype(NvmlLibrary::Api::power_usage) power_usage;
    decltype(NvmlLibrary::Api::power_limit) power_limit;
    decltype(NvmlLibrary::Api::clock_info) sm_clock, mem_clock;
    decltype(NvmlLibrary::Api::temperature) temperature;
    decltype(NvmlLibrary::Api::utilization) utilization;
    decltype(NvmlLibrary::Api::memory_info) memory_info;
    decltype(NvmlLibrary::Api::clock_reasons) clock_reasons;
  };

  std::shared_ptr<NvmlLibrary> lib_;  // keeps NVML initialised while this device is in use
  const NvmlLibrary::Api& api_;
  Device dev_;
  std::string name_, bus_id_;
  Fns fns_{api_.total_energy, api_.power_usage, api_.power_limit, api_.clock_info, api_.clock_info,
           api_.temperature, api_.utilization,  api_.memory_info, api_.clock_reasons};
  std::vector<nvml::FieldValue> fast_fields_, counter_fields_;
  Counter pcie_tx_, pcie_rx_, nvl_tx_, nvl_rx_;
};

}  // namespace

NvmlLibrary::NvmlLibrary() : api_(std::make_unique<Api>()) {}

NvmlLibrary::~NvmlLibrary() {
  if (initialised_ && api_->shutdown) api_->shutdown();
  // The library stays mapped: NVML registers exit-time handlers, and unmapping it under them crashes.
}

std::shared_ptr<NvmlLibrary> NvmlLibrary::load(const std::string& soname) {
  std::shared_ptr<NvmlLibrary> lib(new NvmlLibrary());
  lib->handle_ = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle_) {
    const char* err = dlerror();
    lib->reason_ = "NVML unavailable: cannot load " + soname + " (no NVIDIA driver?)" + (err ? std::string(": ") + err : "");
    return lib;
  }
  Api& a = *lib->api_;
  void* h = lib->handle_;
  resolve(h, "nvmlInit_v2", a.init);
  resolve(h, "nvmlShutdown", a.shutdown);
  resolve(h, "nvmlErrorString", a.error_string);
  resolve(h, "nvmlSystemGetDriverVersion", a.driver_version);
  resolve(h, "nvmlDeviceGetCount_v2", a.device_count);
  resolve(h, "nvmlDeviceGetHandleByIndex_v2", a.handle_by_index);
  resolve(h, "nvmlDeviceGetHandleByPciBusId_v2", a.handle_by_pci);
  resolve(h, "nvmlDeviceGetName", a.name);
  resolve(h, "nvmlDeviceGetPciInfo_v3", a.pci_info);
  resolve(h, "nvmlDeviceGetPowerUsage", a.power_usage);
  resolve(h, "nvmlDeviceGetTotalEnergyConsumption", a.total_energy);
  resolve(h, "nvmlDeviceGetEnforcedPowerLimit", a.power_limit);
  resolve(h, "nvmlDeviceGetClockInfo", a.clock_info);
  resolve(h, "nvmlDeviceGetTemperature", a.temperature);
  resolve(h, "nvmlDeviceGetUtilizationRates", a.utilization);
  resolve(h, "nvmlDeviceGetMemoryInfo", a.memory_info);
  resolve(h, "nvmlDeviceGetCurrentClocksEventReasons", a.clock_reasons);  // r535+
  if (!a.clock_reasons) resolve(h, "nvmlDeviceGetCurrentClocksThrottleReasons", a.clock_reasons);
  resolve(h, "nvmlDeviceGetFieldValues", a.field_values);
  resolve(h, "nvmlDeviceGetNvLinkState", a.nvlink_state);
  resolve(h, "nvmlDeviceGetNvLinkVersion", a.nvlink_version);
  resolve(h, "nvmlDeviceGetNvLinkRemotePciInfo_v2", a.nvlink_remote_pci);
  resolve(h, "nvmlDeviceGetNvLinkRemoteDeviceType", a.nvlink_remote_type);
  resolve(h, "nvmlDeviceGetTopologyCommonAncestor", a.common_ancestor);
  resolve(h, "nvmlDeviceGetP2PStatus", a.p2p_status);
  resolve(h, "nvmlDeviceGetCurrPcieLinkGeneration", a.pcie_gen);
  resolve(h, "nvmlDeviceGetCurrPcieLinkWidth", a.pcie_width);
  resolve(h, "nvmlDeviceGetMaxPcieLinkGeneration", a.pcie_max_gen);
  resolve(h, "nvmlDeviceGetMaxPcieLinkWidth", a.pcie_max_width);
  if (!a.init || !a.shutdown || !a.device_count || !a.handle_by_index) {
    lib->reason_ = "NVML unavailable: " + soname + " lacks nvmlInit_v2/nvmlDeviceGetCount_v2 (driver too old)";
    return lib;
  }
  if (const Return r = a.init(); r != nvml::kSuccess) {
    lib->reason_ = "NVML unavailable: " + a.message("nvmlInit_v2", r);
    return lib;
  }
  lib->initialised_ = true;
  return lib;
}

bool NvmlLibrary::available() const { return initialised_; }
const std::string& NvmlLibrary::reason() const { return reason_; }

std::string NvmlLibrary::driver_version() const {
  char buf[nvml::kSystemDriverVersionBufferSize] = {};
  if (!initialised_ || !api_->driver_version || api_->driver_version(buf, sizeof buf) != nvml::kSuccess) return {};
  return buf;
}

int NvmlLibrary::device_count() const {
  unsigned n = 0;
  if (!initialised_ || api_->device_count(&n) != nvml::kSuccess) return 0;
  return static_cast<int>(n);
}

std::unique_ptr<GpuSource> NvmlLibrary::open_index(unsigned index, std::string* error) {
  Device dev = nullptr;
  const Return r = initialised_ ? api_->handle_by_index(index, &dev) : nvml::kErrorNotFound;
  if (r != nvml::kSuccess) {
    if (error) *error = initialised_ ? api_->message("nvmlDeviceGetHandleByIndex_v2", r) : reason_;
    return nullptr;
  }
  return std::make_unique<NvmlGpuSource>(shared_from_this(), *api_, dev);
}

std::unique_ptr<GpuSource> NvmlLibrary::open_pci_bus_id(const std::string& bus_id, std::string* error) {
  Device dev = nullptr;
  const Return r = initialised_ && api_->handle_by_pci ? api_->handle_by_pci(bus_id.c_str(), &dev) : nvml::kErrorNotFound;
  if (r != nvml::kSuccess) {
    if (error) *error = initialised_ ? api_->message(("nvmlDeviceGetHandleByPciBusId_v2(" + bus_id + ")").c_str(), r) : reason_;
    return nullptr;
  }
  return std::make_unique<NvmlGpuSource>(shared_from_this(), *api_, dev);
}

NvmlTopology NvmlLibrary::topology(const std::vector<std::string>& pci_bus_ids) const {
  NvmlTopology t;
  if (!initialised_) {
    t.unavailable = reason_;
    return t;
  }
  const Api& a = *api_;
  auto value = [](auto fn, auto&&... args) -> int {  // -1 where the call is missing or fails
    unsigned v = 0;
    return fn != nullptr && fn(args..., &v) == nvml::kSuccess ? static_cast<int>(v) : -1;
  };
  std::vector<Device> devices;
  for (const auto& id : pci_bus_ids) {
    Device dev = nullptr;
    if (!a.handle_by_pci || a.handle_by_pci(id.c_str(), &dev) != nvml::kSuccess) {
      t.unavailable += (t.unavailable.empty() ? "" : "; ") + std::string("NVML does not know ") + id;
      continue;
    }
    GpuLinkFacts g;
    g.pci_bus_id = id;
    g.pcie_gen = value(a.pcie_gen, dev);
    g.pcie_width = value(a.pcie_width, dev);
    g.pcie_max_gen = value(a.pcie_max_gen, dev);
    g.pcie_max_width = value(a.pcie_max_width, dev);
    for (unsigned link = 0; a.nvlink_state != nullptr && link < nvml::kNvlinkMaxLinks; ++link) {
      int active = 0;
      if (a.nvlink_state(dev, link, &active) != nvml::kSuccess || active != nvml::kFeatureEnabled) continue;
      NvlinkFacts f;
      f.link = link;
      f.version_code = value(a.nvlink_version, dev, link);
      nvml::PciInfo remote{};
      if (a.nvlink_remote_pci && a.nvlink_remote_pci(dev, link, &remote) == nvml::kSuccess) f.remote_bus_id = remote.busId;
      int type = -1;
      if (a.nvlink_remote_type && a.nvlink_remote_type(dev, link, &type) == nvml::kSuccess) f.remote_type = type;
      g.nvlinks.push_back(f);
    }
    t.gpus.push_back(g);
    devices.push_back(dev);
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = i + 1; j < devices.size(); ++j) {
      GpuPairFacts p;
      p.a = i;
      p.b = j;
      int v = -1;
      if (a.common_ancestor && a.common_ancestor(devices[i], devices[j], &v) == nvml::kSuccess) p.common_ancestor = v;
      if (a.p2p_status && a.p2p_status(devices[i], devices[j], nvml::kP2pCapsRead, &v) == nvml::kSuccess) p.p2p_read = v;
      if (a.p2p_status && a.p2p_status(devices[i], devices[j], nvml::kP2pCapsNvlink, &v) == nvml::kSuccess) p.p2p_nvlink = v;
      t.pairs.push_back(p);
    }
  }
  return t;
}

NvmlTopology read_nvml_topology(const std::vector<std::string>& pci_bus_ids) {
  return NvmlLibrary::load()->topology(pci_bus_ids);
}

std::vector<std::unique_ptr<GpuSource>> open_nvml_devices(const std::vector<std::string>& pci_bus_ids,
                                                          std::string* unavailable_reason) {
  std::vector<std::unique_ptr<GpuSource>> out;
  std::string reasons;
  auto note = [&](const std::string& r) { reasons += (reasons.empty() ? "" : "; ") + r; };
  const auto lib = NvmlLibrary::load();
  if (!lib->available()) {
    note(lib->reason());
  } else if (pci_bus_ids.empty()) {
    const int n = lib->device_count();
    for (int i = 0; i < n; ++i) {
      std::string err;
      if (auto d = lib->open_index(static_cast<unsigned>(i), &err)) out.push_back(std::move(d));
      else note(err);
    }
    if (n == 0) note("NVML found no GPUs");
  } else {
    for (const auto& id : pci_bus_ids) {
      std::string err;
      if (auto d = lib->open_pci_bus_id(id, &err)) out.push_back(std::move(d));
      else note(err);
    }
  }
  if (unavailable_reason) *unavailable_reason = reasons;
  return out;
}

}  // namespace ab::telemetry
