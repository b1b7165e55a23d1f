// The interconnect in the context block (`context.topology`, docs/RESULTS.md): per GPU its PCIe
// link, NVLinks, NUMA node and local CPUs; per pair of GPUs how they connect (NVLink, NVSwitch or
// PCIe and through what) and whether peer access works; the NCCL version. Two systems' scaling
// compares only with these beside it.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "telemetry/telemetry.h"

namespace ab::system {

// NVML for the links, sysfs for NUMA; null when no device is a CUDA GPU.
nlohmann::json topology_json(const std::vector<backend::DeviceInfo>& devices);

// The pure parts, for tests.
struct PciPlacement {
  int numa_node = -1;      // -1: unknown, or a machine with one node
  std::string local_cpus;  // "0-55,112-167"
};
// /sys/bus/pci/devices/<bus id>/{numa_node,local_cpulist}; `sys_root` is "/sys" but for tests.
PciPlacement pci_placement(const std::string& pci_bus_id, const std::filesystem::path& sys_root = "/sys");
// "00000000:1B:00.0" (NVML) and "0000:1b:00.0" (CUDA, sysfs) -> "0000:1b:00.0"; unparsable text unchanged.
std::string canonical_bus_id(const std::string& bus_id);
// nvmlNvlinkVersion_t code -> "4.0"...; nvmlGpuTopologyLevel_t -> nvidia-smi topo's PIX, PXB, PHB, NODE, SYS.
std::string nvlink_version_name(int code);
std::string pcie_path_name(int level);
// `ids[i]` names `nvml.gpus[i]`; `placement[i]` its host placement.
nlohmann::json describe_topology(const std::vector<std::string>& ids, const telemetry::NvmlTopology& nvml,
                                 const std::vector<PciPlacement>& placement, const std::string& nccl_version);

}  // namespace ab::system
