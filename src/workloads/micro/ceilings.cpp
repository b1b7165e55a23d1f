#include "core/error.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

// The STREAM kernel a memory target runs: memory.<op>, and memory.bandwidth (the name of the
// ceiling itself) for copy, as before every kernel was measured.
backend::StreamOp stream_op_of(const std::string& target) {
  const std::string op = target.substr(target.find('.') + 1);
  return backend::parse_stream_op(op == "bandwidth" ? "copy" : op);
}

// Ceilings are measured, not looked up: the best GEMM per precision at a size that fills the
// device, and the best STREAM kernel on arrays far larger than the caches. Every point of one
// ceiling key publishes it; the runner keeps the highest (results/derived.h, measures_ceiling).
class Ceilings final : public Workload {
 public:
  std::string name() const override { return "ceilings"; }
  std::string description() const override {
    return "Measures this device's peak GEMM rate per precision and its memory bandwidth (the best of the four "
           "STREAM kernels); every workload's % of ceiling divides by these.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const bool gpu = device_kind == "cuda";
    const std::vector<std::string> memory{"memory.copy", "memory.scale", "memory.add", "memory.triad"};
    std::vector<std::string> gemm_all;
    for (const auto& p : precision_names()) gemm_all.push_back("gemm." + p);
    std::vector<std::string> defaults = gpu ? gemm_all : std::vector<std::string>{"gemm.fp32"};
    defaults.insert(defaults.end(), memory.begin(), memory.end());
    std::vector<std::string> all = gemm_all;
    all.insert(all.end(), memory.begin(), memory.end());
    all.push_back("memory.bandwidth");
    return {{"target", AxisKind::text, defaults, all,
             "which ceiling: gemm.<precision>, or memory.<STREAM kernel> (each sets memory.bandwidth; "
             "memory.bandwidth alone runs copy)"},
            {"size", AxisKind::integer, {gpu ? "8192" : "1024"}, {}, "GEMM edge (m = n = k)"},
            {"array_bytes", AxisKind::integer, {gpu ? "2147483648" : "134217728"}, {}, "STREAM array bytes"}};
  }
  void run(State& state) override {
    const std::string target = state.get_text("target");
    if (target.rfind("memory.", 0) == 0) {
      state.set_publishes_ceiling("memory.bandwidth");
      run_stream_point(state, stream_op_of(target), state.get_int("array_bytes"));
      return;
    }
    state.set_publishes_ceiling(target);
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
