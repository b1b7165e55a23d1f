// The machine a run happens on: host facts, devices and the build, as the `context` block of every
// record and the `sysinfo` command print them.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace ab::system {

struct HostInfo {
  std::string hostname, os, kernel, cpu_model;
  int logical_cores = 0;
  std::int64_t memory_bytes = 0;
};

HostInfo host_info();
nlohmann::json to_json(const HostInfo& h);
nlohmann::json to_json(const backend::DeviceInfo& d);
nlohmann::json build_json();

// The environment variables that change results (the CUDA runtime's, NCCL's, OpenMP's,
// OpenBLAS's and cuBLAS/cuDNN's knobs, NVIDIA_TF32_OVERRIDE), by name, from `environ`.
nlohmann::json result_environment(char** environ_block);

// The context block: host, devices, build, the result-changing environment, command line and
// start time.
nlohmann::json make_context(const std::vector<backend::DeviceInfo>& devices, const std::string& command_line,
                            const std::string& started_at);

}  // namespace ab::system
