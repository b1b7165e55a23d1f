#include <algorithm>
#include <vector>

#include "backend/ref/ref.h"
#include "core/checked.h"
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

// The int64 sizes of one point, each checked: a product that overflows, or operands larger than
// the device's memory, refuse the point (UsageError: `invalid`) before anything is allocated.
struct GemmFootprint {
  std::int64_t bytes = 0;  // A, B and C as stored
  std::int64_t flops = 0;  // 2mnk
};

GemmFootprint gemm_footprint(const backend::GemmDesc& d, const backend::DeviceInfo& device) {
  if (d.m < 1 || d.n < 1 || d.k < 1) throw UsageError("gemm needs m, n, k >= 1");
  const auto in = static_cast<std::int64_t>(input_bytes(d.precision));
  const auto out = static_cast<std::int64_t>(output_bytes(d.precision));
  const std::int64_t a = checked_mul(checked_mul(d.m, d.k, "gemm elements of A"), in, "gemm bytes of A");
  const std::int64_t b = checked_mul(checked_mul(d.k, d.n, "gemm elements of B"), in, "gemm bytes of B");
  const std::int64_t c = checked_mul(checked_mul(d.m, d.n, "gemm elements of C"), out, "gemm bytes of C");
  GemmFootprint f;
  f.bytes = checked_add(checked_add(a, b, "gemm bytes of A and B"), c, "gemm bytes of A, B and C");
  check_fits_memory(f.bytes, device.memory_bytes, "gemm operands A, B and C", device.id);
  f.flops = checked_mul(2, checked_mul(checked_mul(d.m, d.n, "gemm m x n"), d.k, "gemm m x n x k"), "gemm FLOPs");
  return f;
}

// Recomputes sampled entries of the timed C from the timed A and B in float64: rows {0, m/2, m-1}
// by columns {0, n/2, n-1}. A point whose kernel did not run, or wrote the wrong result at its real
// size, fails here (the small full check above never touches the timed operands).
void check_timed_sample(State& state, backend::GemmPlan& plan, const backend::GemmDesc& d) {
  auto spread = [](std::int64_t size) {
    std::vector<std::int64_t> at{0, size / 2, size - 1};
    at.erase(std::unique(at.begin(), at.end()), at.end());
    return at;
  };
  const std::vector<std::int64_t> rows = spread(d.m), cols = spread(d.n);
  std::vector<std::int64_t> a_at, b_at, c_at;
  for (const std::int64_t i : rows)  // row i of op(A)
    for (std::int64_t l = 0; l < d.k; ++l) a_at.push_back(d.trans_a ? l + i * d.k : i + l * d.m);
  for (const std::int64_t j : cols)  // column j of op(B)
    for (std::int64_t l = 0; l < d.k; ++l) b_at.push_back(d.trans_b ? j + l * d.n : l + j * d.k);
  for (const std::int64_t j : cols)
    for (const std::int64_t i : rows) c_at.push_back(i + j * d.m);
  const std::vector<double> a = plan.values_at(backend::GemmOperand::a, a_at);
  const std::vector<double> b = plan.values_at(backend::GemmOperand::b, b_at);
  const std::vector<double> got = plan.values_at(backend::GemmOperand::c, c_at);
  const auto k = static_cast<std::size_t>(d.k);
  std::vector<double> want;
  for (std::size_t jc = 0; jc < cols.size(); ++jc)
    for (std::size_t ir = 0; ir < rows.size(); ++ir) {
      double sum = 0;
      for (std::size_t l = 0; l < k; ++l) sum += a[ir * k + l] * b[jc * k + l];
      want.push_back(sum);
    }
  state.check(backend::ref::rel_error(got, want), backend::ref::gemm_tolerance(d.precision),
              std::to_string(got.size()) + " sampled entries of the timed C against float64 from the timed A and B");
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
  bool has_counter_pass() const override { return true; }
  void run(State& state) override {
    backend::GemmDesc d;
    d.precision = parse_precision(state.get_text("precision"));
    d.m = state.get_int("m");
    d.n = state.get_int("n");
    d.k = state.get_int("k");
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
  const GemmFootprint size = gemm_footprint(desc, be.info());
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
  state.set_counts({1.0, static_cast<double>(size.flops), static_cast<double>(size.bytes),
                    is_integer(desc.precision) ? "OP" : "FLOP"});
  state.set_ceiling_key("gemm." + std::string(to_string(desc.precision)));
  state.add_metric("algorithm", plan->algorithm());
  state.exec([&plan] { plan->run(); });
  check_timed_sample(state, *plan, desc);
  state.measure_counters({{"gemm", [&plan] { plan->run(); }}});
}

std::unique_ptr<Workload> make_gemm() { return std::make_unique<Gemm>(); }

}  // namespace ab::workloads::micro
