#include "backend/collectives.h"

#include <array>
#include <utility>

#include "backend/collective_traits.h"
#include "core/error.h"
#ifdef ACCELBENCH_WITH_CUDA
#include "backend/cuda/collectives.h"
#include "backend/cuda/cuda_backend.h"
#endif

namespace ab::backend {
namespace {

constexpr std::array<std::pair<AveragerEngine, const char*>, 2> kEngines{
    {{AveragerEngine::nccl, "nccl"}, {AveragerEngine::copy_engines, "copy"}}};

// The value named `name` in `table`; UsageError naming `kind` and listing the valid names otherwise.
template <typename E, std::size_t N>
E parse_by_name(const std::array<std::pair<E, const char*>, N>& table, const std::string& name, const char* kind) {
  std::string valid;
  for (const auto& [value, n] : table) {
    if (n == name) return value;
    valid += valid.empty() ? n : std::string(", ") + n;
  }
  throw UsageError("unknown " + std::string(kind) + " '" + name + "'; valid: " + valid);
}

template <typename E, std::size_t N>
std::vector<std::string> names_of(const std::array<std::pair<E, const char*>, N>& table) {
  std::vector<std::string> v;
  for (const auto& [value, name] : table) v.emplace_back(name);
  return v;
}

}  // namespace

std::string collective_op_name(CollectiveOp op) { return collective_traits(op).name; }

CollectiveOp parse_collective_op(const std::string& name) {
  std::string valid;
  for (const CollectiveTraits& t : all_collective_traits()) {
    if (t.name == name) return t.op;
    valid += valid.empty() ? t.name : std::string(", ") + t.name;
  }
  throw UsageError("unknown collective '" + name + "'; valid: " + valid);
}

const std::vector<std::string>& collective_op_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const CollectiveTraits& t : all_collective_traits()) v.emplace_back(t.name);
    return v;
  }();
  return names;
}

const std::vector<std::string>& averager_engine_names() {
  static const std::vector<std::string> names = names_of(kEngines);
  return names;
}

AveragerEngine parse_averager_engine(const std::string& name) {
  return parse_by_name(kEngines, name, "gradient averaging engine");
}

bool collective_has_in_place(CollectiveOp op) { return collective_traits(op).in_place; }

const std::vector<std::string>& collective_dtype_names() {
  static const std::vector<std::string> names{"f32", "f16", "bf16", "i32"};
  return names;
}

int collective_device_count() {
#ifdef ACCELBENCH_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

#ifndef ACCELBENCH_WITH_CUDA
namespace {
[[noreturn]] void cpu_only(const std::string& what) {
  throw Unsupported(what + " need the CUDA build and NCCL (cmake --preset cuda); this build is CPU-only");
}
}  // namespace
#endif

std::unique_ptr<CollectiveGroup> make_collective_group(Backend& backend, int gpus) {
#ifdef ACCELBENCH_WITH_CUDA
  return cuda::make_collective_group(backend, gpus);
#else
  (void)backend;
  (void)gpus;
  cpu_only("collectives");
#endif
}

std::vector<std::uint8_t> collective_unique_id() {
#ifdef ACCELBENCH_WITH_CUDA
  return cuda::collective_unique_id();
#else
  cpu_only("collectives");
#endif
}

std::unique_ptr<CollectiveGroup> make_collective_rank(Backend& backend, int rank, int ranks,
                                                      const std::vector<std::uint8_t>& unique_id,
                                                      const CommOptions& options) {
#ifdef ACCELBENCH_WITH_CUDA
  return cuda::make_collective_rank(backend, rank, ranks, unique_id, options);
#else
  (void)backend, (void)rank, (void)ranks, (void)unique_id, (void)options;
  cpu_only("collectives");
#endif
}

std::unique_ptr<PeerCopyPlan> make_peer_copy(const PeerCopyDesc& desc) {
#ifdef ACCELBENCH_WITH_CUDA
  return cuda::make_peer_copy(desc);
#else
  (void)desc;
  cpu_only("GPU-to-GPU copies");
#endif
}

}  // namespace ab::backend
