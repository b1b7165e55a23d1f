#include "system/system.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <fstream>
#include <string_view>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "system/build_info.h"
#include "system/topology.h"

namespace ab::system {
namespace {

std::string os_release() {
  std::ifstream in("/etc/os-release");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      std::string v = line.substr(12);
      if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
      return v;
    }
  }
  return "unknown";
}

constexpr std::string_view kResultPrefixes[] = {"CUDA_",     "NCCL_",   "OMP_",      "GOMP_",  "KMP_",
                                                "OPENBLAS_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "NVIDIA_TF32_OVERRIDE"};

}  // namespace

nlohmann::json result_environment(char** environ_block) {
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ_block; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    const std::string_view name = entry.substr(0, eq);
    for (const std::string_view prefix : kResultPrefixes)
      if (name.starts_with(prefix)) {
        env[std::string(name)] = std::string(entry.substr(eq + 1));
        break;
      }
  }
  return env;
}

HostInfo host_info() {
  HostInfo h;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) h.hostname = name;
  utsname u{};
  if (uname(&u) == 0) h.kernel = std::string(u.sysname) + " " + u.release + " " + u.machine;
  h.os = os_release();
  const backend::DeviceInfo cpu = backend::cpu::device_info();  // no need to wake the GPUs for host facts
  h.cpu_model = cpu.name;
  h.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
  h.memory_bytes = cpu.memory_bytes;
  return h;
}

nlohmann::json to_json(const HostInfo& h) {
  return {{"hostname", h.hostname}, {"os", h.os},           {"kernel", h.kernel},
          {"cpu_model", h.cpu_model}, {"cpu_cores", h.logical_cores}, {"memory_bytes", h.memory_bytes}};
}

nlohmann::json to_json(const backend::DeviceInfo& d) {
  nlohmann::json j{{"id", d.id}, {"kind", d.kind}, {"name", d.name}, {"memory_bytes", d.memory_bytes},
                   {"compute_units", d.compute_units}, {"versions", d.versions}};
  if (d.l2_bytes > 0) j["cache_bytes"] = d.l2_bytes;
  if (!d.compute_capability.empty()) j["compute_capability"] = d.compute_capability;
  if (!d.pci_bus_id.empty()) j["pci_bus_id"] = d.pci_bus_id;
  return j;
}

nlohmann::json build_json() {
  const BuildInfo& b = build_info();
  return {{"version", b.version},       {"git_commit", b.git_commit}, {"git_dirty", b.git_dirty},
          {"build_type", b.build_type}, {"compiler", b.compiler},     {"cxx_flags", b.cxx_flags},
          {"cuda", b.with_cuda},        {"cuda_architectures", b.cuda_architectures},
          {"sanitizers", b.sanitizers}};
}

nlohmann::json make_context(const std::vector<backend::DeviceInfo>& devices, const std::string& command_line,
                            const std::string& started_at) {
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& d : devices) devs.push_back(to_json(d));
  nlohmann::json context = {{"host", to_json(host_info())}, {"devices", devs},
                            {"build", build_json()},        {"environment", result_environment(environ)},
                            {"command_line", command_line}, {"started_at", started_at}};
  if (nlohmann::json topology = topology_json(devices); !topology.is_null()) context["topology"] = topology;
  return context;
}

}  // namespace ab::system
