#include "core/checked.h"
#include "core/error.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

class Copy final : public Workload {
 public:
  std::string name() const override { return "copy"; }
  std::string description() const override {
    return "Copies between host and device (pinned and pageable host memory) and within the device. "
           "GB/s: bytes copied (d2d counts the read and the write, like stream copy).";
  }
  std::vector<AxisSpec> axes(const std::string&) const override {
    return {{"direction", AxisKind::text, {"h2d", "d2h", "d2d"}, {"h2d", "d2h", "d2d"}, "what is copied where"},
            {"host_memory", AxisKind::text, {"pinned", "pageable"}, {"pinned", "pageable"}, "host buffer kind"},
            {"bytes", AxisKind::integer, {"65536", "4194304", "268435456"}, {}, "bytes per copy"}};
  }
  bool has_counter_pass() const override { return true; }
  void run(State& state) override {
    const auto kind = backend::parse_copy_kind(state.get_text("direction"));
    const bool pinned = state.get_text("host_memory") == "pinned";
    const std::int64_t bytes = state.get_int("bytes");
    if (bytes < 1) throw UsageError("copy needs bytes >= 1");
    if (kind == backend::CopyKind::device_to_device && !pinned)
      state.skip("host_memory does not apply to d2d; measured once, under pinned");
    // d2d holds source and destination on the device; h2d and d2h one buffer there, one on the host.
    const bool d2d = kind == backend::CopyKind::device_to_device;
    const auto& device = state.backend().info();
    const std::int64_t moved = checked_mul(d2d ? 2 : 1, bytes, "copy bytes moved");
    check_fits_memory(moved, device.memory_bytes, "copy buffers", device.id);
    auto plan = state.backend().make_copy(kind, pinned ? backend::HostMemory::pinned : backend::HostMemory::pageable,
                                          bytes);
    state.check(static_cast<double>(plan->check()), 0.0, "bytes differing from the source after one copy");
    state.set_counts({1.0, 0.0, static_cast<double>(moved), "FLOP"});
    if (d2d) state.set_ceiling_key("memory.bandwidth");
    state.exec([&plan] { plan->run(); });
    state.measure_counters({{"copy", [&plan] { plan->run(); }}});
  }
};

}  // namespace

std::unique_ptr<Workload> make_copy() { return std::make_unique<Copy>(); }

}  // namespace ab::workloads::micro
