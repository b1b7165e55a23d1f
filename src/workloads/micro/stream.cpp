#include "core/checked.h"
#include "core/error.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

class Stream final : public Workload {
 public:
  std::string name() const override { return "stream"; }
  std::string description() const override {
    return "STREAM kernels on double arrays in device memory (host memory with OpenMP threads on cpu): "
           "copy, scale, add, triad. GB/s counts every array read and written once.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const std::string bytes = device_kind == "cuda" ? "1073741824" : "134217728";
    return {{"op", AxisKind::text, {"copy", "scale", "add", "triad"}, {"copy", "scale", "add", "triad"}, "kernel"},
            {"array_bytes", AxisKind::integer, {bytes}, {}, "bytes of each array"}};
  }
  bool has_counter_pass() const override { return true; }
  void run(State& state) override {
    run_stream_point(state, backend::parse_stream_op(state.get_text("op")), state.get_int("array_bytes"));
  }
};

}  // namespace

void run_stream_point(State& state, backend::StreamOp op, std::int64_t array_bytes) {
  if (array_bytes < 8) throw UsageError("stream needs array_bytes >= 8");
  const std::int64_t elements = array_bytes / 8;
  // The plan holds three arrays whatever the op touches.
  const auto& device = state.backend().info();
  check_fits_memory(checked_mul(3, elements * 8, "stream bytes of 3 arrays"), device.memory_bytes,
                    "stream's 3 arrays", device.id);
  const std::int64_t moved = checked_mul(backend::stream_arrays_touched(op), elements * 8, "stream bytes moved");
  auto plan = state.backend().make_stream(op, elements);
  state.check(plan->check(), 1e-12, backend::stream_op_name(op) + " against the same op on the host");
  const double flops = op == backend::StreamOp::copy ? 0.0 : (op == backend::StreamOp::triad ? 2.0 : 1.0);
  state.set_counts({static_cast<double>(elements), flops * static_cast<double>(elements), static_cast<double>(moved), "FLOP"});
  state.set_ceiling_key("memory.bandwidth");
  state.exec([&plan] { plan->run(); });
  state.measure_counters({{backend::stream_op_name(op), [&plan] { plan->run(); }}});
}

std::unique_ptr<Workload> make_stream() { return std::make_unique<Stream>(); }

}  // namespace ab::workloads::micro
