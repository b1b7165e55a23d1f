#include "backend/backend.h"

#include <array>
#include <charconv>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#ifdef ACCELBENCH_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace ab::backend {
namespace {

constexpr std::array<std::pair<StreamOp, const char*>, 4> kStreamOps{
    {{StreamOp::copy, "copy"}, {StreamOp::scale, "scale"}, {StreamOp::add, "add"}, {StreamOp::triad, "triad"}}};
constexpr std::array<std::pair<CopyKind, const char*>, 3> kCopyKinds{
    {{CopyKind::host_to_device, "h2d"}, {CopyKind::device_to_host, "d2h"}, {CopyKind::device_to_device, "d2d"}}};

template <typename Table, typename Value>
std::string name_of(const Table& table, Value v) {
  for (const auto& [value, name] : table)
    if (value == v) return name;
  return "?";
}

template <typename Table>
auto parse_name(const Table& table, const std::string& name, const char* what) {
  std::string valid;
  for (const auto& [value, n] : table) {
    if (n == name) return value;
    valid += valid.empty() ? n : std::string(", ") + n;
  }
  throw UsageError(std::string("unknown ") + what + " '" + name + "'; valid: " + valid);
}

}  // namespace

std::string stream_op_name(StreamOp op) { return name_of(kStreamOps, op); }
StreamOp parse_stream_op(const std::string& name) { return parse_name(kStreamOps, name, "stream op"); }
int stream_arrays_touched(StreamOp op) { return op == StreamOp::copy || op == StreamOp::scale ? 2 : 3; }
std::string copy_kind_name(CopyKind k) { return name_of(kCopyKinds, k); }
CopyKind parse_copy_kind(const std::string& name) { return parse_name(kCopyKinds, name, "copy direction"); }

bool cuda_built() {
#ifdef ACCELBENCH_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device_id) {
  if (device_id == "cpu") return cpu::make_backend();
  if (device_id.rfind("cuda:", 0) == 0) {
    int index = -1;
    const char* first = device_id.data() + 5;
    const char* last = device_id.data() + device_id.size();
    const auto [ptr, ec] = std::from_chars(first, last, index);
    if (ec != std::errc() || ptr != last || index < 0)
      throw UsageError("malformed device '" + device_id + "'; expected cpu or cuda:N");
#ifdef ACCELBENCH_WITH_CUDA
    const int count = cuda::device_count();
    if (index >= count)
      throw Error("device " + device_id + " not present: this machine has " + std::to_string(count) +
                  " CUDA device(s)");
    return cuda::make_backend(index);
#else
    throw Error("device " + device_id + " needs the CUDA build (cmake --preset cuda); this build is CPU-only");
#endif
  }
  throw UsageError("unknown device '" + device_id + "'; valid: cpu, cuda:N");
}

std::string best_device() {
#ifdef ACCELBENCH_WITH_CUDA
  if (cuda::device_count() > 0) return "cuda:0";
#endif
  return "cpu";
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> devices{cpu::device_info()};
#ifdef ACCELBENCH_WITH_CUDA
  for (int i = 0; i < cuda::device_count(); ++i) devices.push_back(cuda::device_info(i));
#endif
  return devices;
}

}  // namespace ab::backend
