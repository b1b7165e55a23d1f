#include <algorithm>

#include "backend/ref/ref.h"
#include "core/error.h"
#include "workloads/micro/gemm_shapes.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

// The largest edge of the problem checked against the float64 reference before timing.
constexpr std::int64_t kCheckEdge = 96;

std::size_t input_bytes(Precision p) {
  switch (p) {
    case Precision::fp32: case Precision::tf32: return 4;
    case Precision::fp16: case Precision::bf16: return 2;
    case Precision::fp8: case Precision::int8: return 1;
  }
  return 0;
}

std::size_t output_bytes(Precision p) {
  switch (p) {
    case Precision::fp32: case Precision::tf32: case Precision::int8: return 4;
    case Precision::fp16: case Precision::bf16: case Precision::fp8: return 2;  // fp8 writes bf16
  }
  return 0;
}

// "auto" picks the layout of the precision's fast path: cuBLASLt's fp8 and int8 GEMMs need TN.
std::string resolve_trans(const std::string& trans, Precision p) {
  if (trans != "auto") return trans;
  return (p == Precision::fp8 || p == Precision::int8) ? "TN" : "NN";
}

class Gemm final : public Workload {
 public:
  std::string name() const override { return "gemm"; }
  std::string description() const override {
    return "Dense matrix multiply C = op(A) op(B) (column-major BLAS convention): cuBLASLt with "
           "algorithm search on CUDA, OpenBLAS fp32 on CPU. TFLOP/s (TOP/s for int8).";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const bool gpu = device_kind == "cuda";
    const std::vector<std::string> sizes = gpu ? std::vector<std::string>{"1024", "2048", "4096", "8192"}
                                               : std::vector<std::string>{"256", "512", "1024"};
    return {{"precision", AxisKind::text, gpu ? precision_names() : std::vector<std::string>{"fp32"},
             precision_names(), "operand precision"},
            {"m", AxisKind::integer, sizes, {}, "rows of C (zipped with n, k, trans)"},
            {"n", AxisKind::integer, sizes, {}, "columns of C"},
            {"k", AxisKind::integer, sizes, {}, "inner dimension"},
            {"trans", AxisKind::text, std::vector<std::string>(sizes.size(), "auto"),
             {"auto", "NN", "NT", "TN", "TT"}, "transposes of A and B; auto = TN for fp8/int8, else NN"}};
  }
  std::vector<ZipGroup> zip_groups() const override { return {{{"m", "n", "k", "trans"}, gemm_tables()}}; }
  void run(State& state) override {
    backend::GemmDesc d;
    d.precision = parse_precision(state.get_text("precision"));
    d.m = state.get_int("m");
    d.n = state.get_int("n");
    d.k = state.get_int("k");
    if (d.m < 1 || d.n < 1 || d.k < 1) throw UsageError("gemm needs m, n, k >= 1 (got " + state.point().label() + ")");
    const std::string trans = resolve_trans(state.get_text("trans"), d.precision);
    d.trans_a = trans[0] == 'T';
    d.trans_b = trans[1] == 'T';
    state.add_metric("layout", trans);
    run_gemm_point(state, d);
  }
};

}  // namespace

void run_gemm_point(State& state, const backend::GemmDesc& desc) {
  backend::Backend& be = state.backend();
  backend::GemmDesc small = desc;
  small.m = std::min(desc.m, kCheckEdge);
  small.n = std::min(desc.n, kCheckEdge);
  small.k = std::min(desc.k, kCheckEdge);
  {
    auto check_plan = be.make_gemm(small);
    check_plan->run();
    const auto want = backend::ref::gemm(small, check_plan->a_values(), check_plan->b_values());
    state.check(backend::ref::rel_error(check_plan->c_values(), want), backend::ref::gemm_tolerance(desc.precision),
                "C against float64 reference at " + std::to_string(small.m) + "x" + std::to_string(small.n) + "x" +
                    std::to_string(small.k));
  }
  auto plan = be.make_gemm(desc);
  const double m = static_cast<double>(desc.m), n = static_cast<double>(desc.n), k = static_cast<double>(desc.k);
  const double in_bytes = static_cast<double>(input_bytes(desc.precision));
  state.set_counts({1.0, 2.0 * m * n * k, (m * k + k * n) * in_bytes + m * n * static_cast<double>(output_bytes(desc.precision)),
                    is_integer(desc.precision) ? "OP" : "FLOP"});
  state.set_ceiling_key("gemm." + std::string(to_string(desc.precision)));
  state.add_metric("algorithm", plan->algorithm());
  state.exec([&plan] { plan->run(); });
}

std::unique_ptr<Workload> make_gemm() { return std::make_unique<Gemm>(); }

}  // namespace ab::workloads::micro
