#include "dist/launcher.h"

#include <charconv>
#include <optional>
#include <vector>

#include "core/error.h"

extern char** environ;  // POSIX

namespace ab::dist {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<std::string> lookup(const Env& env, const std::string& name) {
  const auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

int to_int(const std::string& name, const std::string& text) {
  int out = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    throw UsageError("launcher environment: " + name + "='" + text + "' is not an integer");
  return out;
}

std::optional<int> optional_int(const Env& env, const std::string& name) {
  if (auto v = lookup(env, name)) return to_int(name, *v);
  return std::nullopt;
}

int required_int(const Env& env, const std::string& name, const std::string& because) {
  auto v = lookup(env, name);
  if (!v) throw UsageError("launcher environment: " + because + " is set but " + name + " is not");
  return to_int(name, *v);
}

// SLURM_(STEP_)TASKS_PER_NODE: "4(x2),3" = 4 tasks on each of two nodes, then 3 on the third.
std::vector<int> expand_tasks_per_node(const std::string& name, const std::string& text) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const std::size_t paren = item.find("(x");
    if (paren == std::string::npos) {
      out.push_back(to_int(name, item));
    } else {
      if (item.back() != ')')
        throw UsageError("launcher environment: " + name + "='" + text + "' is malformed");
      const int tasks = to_int(name, item.substr(0, paren));
      const int nodes = to_int(name, item.substr(paren + 2, item.size() - paren - 3));
      if (nodes < 1) throw UsageError("launcher environment: " + name + "='" + text + "' is malformed");
      out.insert(out.end(), static_cast<std::size_t>(nodes), tasks);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

int slurm_local_size(const Env& env) {
  // The step's own layout first (srun inside a larger allocation), then the job's.
  const char* list_name = env.count("SLURM_STEP_TASKS_PER_NODE") != 0 ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  if (env.count("SLURM_STEP_TASKS_PER_NODE") == 0)
    if (auto v = optional_int(env, "SLURM_NTASKS_PER_NODE")) return *v;
  const auto text = lookup(env, list_name);
  if (!text) return 0;
  const std::vector<int> per_node = expand_tasks_per_node(list_name, *text);
  if (auto node = optional_int(env, "SLURM_NODEID")) {
    if (*node < 0 || *node >= static_cast<int>(per_node.size()))
      throw UsageError("launcher environment: SLURM_NODEID=" + std::to_string(*node) + " but " + list_name + "='" +
                       *text + "' lists " + std::to_string(per_node.size()) + " node(s)");
    return per_node[static_cast<std::size_t>(*node)];
  }
  for (int n : per_node)
    if (n != per_node.front()) return 0;  // uneven nodes and no SLURM_NODEID: unknown
  return per_node.front();
}

void validate(const LaunchInfo& li, const std::string& vars) {
  const std::string where = "launcher environment (" + li.launcher + ": " + vars + "): ";
  if (li.world_size < 1) throw UsageError(where + "world size " + std::to_string(li.world_size) + " is below 1");
  if (li.rank < 0 || li.rank >= li.world_size)
    throw UsageError(where + "rank " + std::to_string(li.rank) + " is outside a world of " +
                     std::to_string(li.world_size));
  if (li.local_size < 0) throw UsageError(where + "local size " + std::to_string(li.local_size) + " is negative");
  if (li.local_size > li.world_size)
    throw UsageError(where + "local size " + std::to_string(li.local_size) + " is larger than the world size " +
                     std::to_string(li.world_size));
  if (li.local_rank < 0 || (li.local_size > 0 && li.local_rank >= li.local_size))
    throw UsageError(where + "local rank " + std::to_string(li.local_rank) + " is outside a node of " +
                     std::to_string(li.local_size));
  if (li.local_rank > li.rank)
    throw UsageError(where + "local rank " + std::to_string(li.local_rank) + " is larger than the rank " +
                     std::to_string(li.rank));
}

}  // namespace

LaunchInfo parse_launcher_env(const Env& env) {
  LaunchInfo li;
  if (env.count("OMPI_COMM_WORLD_RANK") != 0) {
    const std::string why = "OMPI_COMM_WORLD_RANK";
    li.launcher = "openmpi";
    li.rank = to_int(why, env.at(why));
    li.world_size = required_int(env, "OMPI_COMM_WORLD_SIZE", why);
    li.local_rank = required_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", why);
    li.local_size = optional_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(0);
    validate(li, "OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE");
  } else if (env.count("SLURM_PROCID") != 0 && env.count("SLURM_STEP_NUM_TASKS") != 0) {
    // Only a task of an srun step: a batch script itself also sees SLURM_PROCID and SLURM_NTASKS
    // (the whole allocation's), but it is one process.
    const std::string why = "SLURM_PROCID";
    li.launcher = "slurm";
    li.rank = to_int(why, env.at(why));
    li.world_size = required_int(env, "SLURM_STEP_NUM_TASKS", why);
    li.local_rank = required_int(env, "SLURM_LOCALID", why);
    li.local_size = slurm_local_size(env);
    validate(li, "SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE / SLURM_NTASKS_PER_NODE "
                 "/ SLURM_TASKS_PER_NODE");
  } else if (env.count("PMI_RANK") != 0) {
    const std::string why = "PMI_RANK";
    li.launcher = "pmi";
    li.rank = to_int(why, env.at(why));
    li.world_size = required_int(env, "PMI_SIZE", why);
    // Hydra's node-local variables; without them every rank is taken to share one node.
    const auto local_rank = optional_int(env, "MPI_LOCALRANKID");
    li.local_rank = local_rank.value_or(li.rank);
    li.local_size = local_rank ? optional_int(env, "MPI_LOCALNRANKS").value_or(0) : li.world_size;
    validate(li, "PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS");
  } else if (env.count("RANK") != 0) {
    const std::string why = "RANK";
    li.launcher = "torchrun";
    li.rank = to_int(why, env.at(why));
    li.world_size = required_int(env, "WORLD_SIZE", why);
    li.local_rank = required_int(env, "LOCAL_RANK", why);
    li.local_size = optional_int(env, "LOCAL_WORLD_SIZE").value_or(0);
    validate(li, "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE");
  }
  return li;
}

Env process_environment() {
  Env env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::size_t eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

int device_for_rank(const LaunchInfo& info, int visible_devices) {
  if (visible_devices < 1)
    throw Error("rank " + std::to_string(info.rank) + " (local rank " + std::to_string(info.local_rank) +
                ") sees no device");
  return info.local_rank % visible_devices;
}

}  // namespace ab::dist
