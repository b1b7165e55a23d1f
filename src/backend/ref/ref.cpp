#include "backend/ref/ref.h"

#include <cmath>
#include <limits>

namespace ab::backend::ref {

std::vector<double> gemm(const GemmDesc& d, const std::vector<double>& a, const std::vector<double>& b) {
  // Column-major: element (i, l) of op(A) is a[i + l*m] if not transposed, a[l + i*k] if transposed.
  std::vector<double> c(static_cast<std::size_t>(d.m * d.n), 0.0);
  for (std::int64_t j = 0; j < d.n; ++j) {
    for (std::int64_t l = 0; l < d.k; ++l) {
      const double b_lj = d.trans_b ? b[static_cast<std::size_t>(j + l * d.n)] : b[static_cast<std::size_t>(l + j * d.k)];
      for (std::int64_t i = 0; i < d.m; ++i) {
        const double a_il = d.trans_a ? a[static_cast<std::size_t>(l + i * d.k)] : a[static_cast<std::size_t>(i + l * d.m)];
        c[static_cast<std::size_t>(i + j * d.m)] += a_il * b_lj;
      }
    }
  }
  return c;
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return std::numeric_limits<double>::infinity();
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  if (norm == 0) return diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

double gemm_tolerance(Precision p) {
  // Output rounding dominates: unit roundoff 2^-24 (fp32), 2^-11 (fp16), 2^-8 (bf16, and fp8 with
  // bf16 output); tf32 truncates inputs to 10 mantissa bits. Margins cover accumulation order.
  switch (p) {
    case Precision::fp32: return 1e-5;
    case Precision::tf32: return 5e-3;
    case Precision::fp16: return 5e-3;
    case Precision::bf16: return 2e-2;
    case Precision::fp8: return 2e-2;
    case Precision::int8: return 0.0;
  }
  return 0.0;
}

}  // namespace ab::backend::ref
