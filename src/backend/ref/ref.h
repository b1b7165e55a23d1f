// The reference backend: plain C++ in float64 accumulation, the oracle every other backend is
// checked against. Slow on purpose; used on small problems only.
#pragma once

#include <vector>

#include "backend/backend.h"

namespace ab::backend::ref {

// C = op(A) op(B) in the column-major convention of GemmDesc (A stored m x k, or k x m if trans_a).
std::vector<double> gemm(const GemmDesc& desc, const std::vector<double>& a, const std::vector<double>& b);

// Relative Frobenius error |got - want| / |want|; +inf if sizes differ or any value is not finite.
double rel_error(const std::vector<double>& got, const std::vector<double>& want);

// The tolerance on rel_error that a correct GEMM in this precision meets on random inputs in [-1, 1]
// (fp32 accumulation; output rounded to the operand type; exact for int8 with int32 output).
double gemm_tolerance(Precision p);

}  // namespace ab::backend::ref
