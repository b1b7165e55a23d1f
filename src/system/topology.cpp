#include "system/topology.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>

namespace ab::system {
namespace {

std::string first_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string p2p_status_name(int status) {
  switch (status) {
    case -1: return "unknown";
    case 0: return "ok";
    case 1: return "chipset not supported";
    case 2: return "GPU not supported";
    case 3: return "IOH topology not supported";
    case 4: return "disabled by regkey";
    case 5: return "not supported";
    default: return "status " + std::to_string(status);
  }
}

}  // namespace

std::string canonical_bus_id(const std::string& bus_id) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  char tail = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) != 4) return bus_id;
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

std::string nvlink_version_name(int code) {
  static const char* names[] = {"invalid", "1.0", "2.0", "2.2", "3.0", "3.1", "4.0", "5.0", "6.0"};
  if (code >= 0 && code < static_cast<int>(std::size(names))) return names[code];
  return "code " + std::to_string(code);
}

std::string pcie_path_name(int level) {
  switch (level) {
    case 0: return "same board";  // NVML_TOPOLOGY_INTERNAL
    case 10: return "PIX";        // one PCIe switch
    case 20: return "PXB";        // several PCIe switches, no host bridge
    case 30: return "PHB";        // a host bridge
    case 40: return "NODE";       // host bridges within one NUMA node
    case 50: return "SYS";        // across NUMA nodes (SMP interconnect)
    default: return "unknown";
  }
}

PciPlacement pci_placement(const std::string& pci_bus_id, const std::filesystem::path& sys_root) {
  const auto dir = sys_root / "bus" / "pci" / "devices" / canonical_bus_id(pci_bus_id);
  PciPlacement p;
  const std::string node = first_line(dir / "numa_node");
  if (!node.empty()) {
    try {
      p.numa_node = std::stoi(node);
    } catch (const std::exception&) {
      p.numa_node = -1;
    }
  }
  p.local_cpus = first_line(dir / "local_cpulist");
  return p;
}

nlohmann::json describe_topology(const std::vector<std::string>& ids, const telemetry::NvmlTopology& nvml,
                                 const std::vector<PciPlacement>& placement, const std::string& nccl_version) {
  nlohmann::json out = nlohmann::json::object();
  out["source"] = nvml.gpus.empty() ? "none" : "nvml";
  if (!nvml.unavailable.empty()) out["note"] = nvml.unavailable;
  if (!nccl_version.empty()) out["nccl"] = nccl_version;
  nlohmann::json gpus = nlohmann::json::array();
  std::vector<int> switch_links(nvml.gpus.size(), 0);
  for (std::size_t i = 0; i < nvml.gpus.size(); ++i) {
    const auto& g = nvml.gpus[i];
    nlohmann::json j = {{"id", i < ids.size() ? ids[i] : g.pci_bus_id}, {"pci_bus_id", canonical_bus_id(g.pci_bus_id)}};
    if (i < placement.size()) {
      if (placement[i].numa_node >= 0) j["numa_node"] = placement[i].numa_node;
      if (!placement[i].local_cpus.empty()) j["local_cpus"] = placement[i].local_cpus;
    }
    nlohmann::json pcie = nlohmann::json::object();
    if (g.pcie_gen >= 0) pcie["gen"] = g.pcie_gen;
    if (g.pcie_width >= 0) pcie["width"] = g.pcie_width;
    if (g.pcie_max_gen >= 0) pcie["max_gen"] = g.pcie_max_gen;
    if (g.pcie_max_width >= 0) pcie["max_width"] = g.pcie_max_width;
    j["pcie"] = pcie;
    int to_gpu = 0, versions = -1;
    for (const auto& l : g.nvlinks) {
      if (l.remote_type == 2) ++switch_links[i];
      if (l.remote_type == 0) ++to_gpu;
      versions = std::max(versions, l.version_code);
    }
    nlohmann::json nvlink = {{"links", g.nvlinks.size()}, {"to_gpu", to_gpu}, {"to_switch", switch_links[i]}};
    if (versions >= 0) {
      nvlink["version"] = nvlink_version_name(versions);
      nvlink["version_code"] = versions;
    }
    j["nvlink"] = nvlink;
    gpus.push_back(j);
  }
  out["gpus"] = gpus;
  nlohmann::json links = nlohmann::json::array();
  for (const auto& p : nvml.pairs) {
    if (p.a >= nvml.gpus.size() || p.b >= nvml.gpus.size()) continue;
    const auto& a = nvml.gpus[p.a];
    const std::string b_bus = canonical_bus_id(nvml.gpus[p.b].pci_bus_id);
    const auto direct = std::count_if(a.nvlinks.begin(), a.nvlinks.end(), [&](const telemetry::NvlinkFacts& l) {
      return l.remote_type != 2 && canonical_bus_id(l.remote_bus_id) == b_bus;
    });
    nlohmann::json j = {{"a", gpus[p.a]["id"]}, {"b", gpus[p.b]["id"]}};
    if (direct > 0) {
      j["via"] = "nvlink";
      j["nvlinks"] = direct;
    } else if (switch_links[p.a] > 0 && switch_links[p.b] > 0) {
      j["via"] = "nvswitch";
      j["nvlinks"] = std::min(switch_links[p.a], switch_links[p.b]);
    } else {
      j["via"] = "pcie";
    }
    j["pcie_path"] = pcie_path_name(p.common_ancestor);
    j["p2p_read"] = p2p_status_name(p.p2p_read);
    j["p2p_nvlink"] = p2p_status_name(p.p2p_nvlink);
    links.push_back(j);
  }
  out["links"] = links;
  return out;
}

nlohmann::json topology_json(const std::vector<backend::DeviceInfo>& devices) {
  std::vector<std::string> ids, bus_ids;
  std::string nccl;
  for (const auto& d : devices) {
    if (d.kind != "cuda" || d.pci_bus_id.empty()) continue;
    ids.push_back(d.id);
    bus_ids.push_back(d.pci_bus_id);
    if (nccl.empty()) {
      if (auto it = d.versions.find("nccl"); it != d.versions.end()) nccl = it->second;
    }
  }
  if (ids.empty()) return nullptr;
  const telemetry::NvmlTopology nvml = telemetry::read_nvml_topology(bus_ids);
  // NVML skips GPUs it cannot open: keep the names aligned with what it returned.
  std::vector<std::string> named;
  std::vector<PciPlacement> placement;
  for (const auto& g : nvml.gpus) {
    const auto it = std::find_if(bus_ids.begin(), bus_ids.end(),
                                 [&](const std::string& b) { return canonical_bus_id(b) == canonical_bus_id(g.pci_bus_id); });
    named.push_back(it == bus_ids.end() ? g.pci_bus_id : ids[static_cast<std::size_t>(it - bus_ids.begin())]);
    placement.push_back(pci_placement(g.pci_bus_id));
  }
  return describe_topology(named, nvml, placement, nccl);
}

}  // namespace ab::system
