#include "core/error.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

// Ceilings are measured, not looked up: the best GEMM per precision at a size that fills the
// device, and the STREAM copy bandwidth on arrays far larger than the caches.
class Ceilings final : public Workload {
 public:
  std::string name() const override { return "ceilings"; }
  std::string description() const override {
    return "Measures this device's peak GEMM rate per precision and its memory bandwidth; every "
           "workload's % of ceiling divides by these.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const bool gpu = device_kind == "cuda";
    std::vector<std::string> all;
    for (const auto& p : precision_names()) all.push_back("gemm." + p);
    all.push_back("memory.bandwidth");
    return {{"target", AxisKind::text, gpu ? all : std::vector<std::string>{"gemm.fp32", "memory.bandwidth"}, all,
             "which ceiling"},
            {"size", AxisKind::integer, {gpu ? "8192" : "1024"}, {}, "GEMM edge (m = n = k)"},
            {"array_bytes", AxisKind::integer, {gpu ? "2147483648" : "134217728"}, {}, "STREAM array bytes"}};
  }
  void run(State& state) override {
    const std::string target = state.get_text("target");
    state.set_publishes_ceiling(target);
    if (target == "memory.bandwidth") {
      run_stream_point(state, backend::StreamOp::copy, state.get_int("array_bytes"));
      return;
    }
    backend::GemmDesc d;
    d.precision = parse_precision(target.substr(5));
    d.m = d.n = d.k = state.get_int("size");
    d.trans_a = d.precision == Precision::fp8 || d.precision == Precision::int8;  // their fast path is TN
    run_gemm_point(state, d);
  }
};

}  // namespace

std::unique_ptr<Workload> make_ceilings() { return std::make_unique<Ceilings>(); }

}  // namespace ab::workloads::micro
