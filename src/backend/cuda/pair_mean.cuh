// The pairwise mean of data parallelism's two-rank averaging, in f32: (a + b) / 2 with each step
// rounded to f32 (the _rn intrinsics are never contracted into an FMA with what follows them, which
// a plain (a + b) * 0.5f beside a weight-decay term was). One definition for the copy-engine mean
// kernel (wire_cast.cu) and SGD's update with a partner gradient (nn/cuda/optim.cu), so both
// give the same bits, on both ranks (a + b is b + a). Device code only.
#pragma once

#include <cuda_runtime.h>

namespace ab::backend::cuda {

__device__ __forceinline__ float pair_mean(float a, float b) { return __fmul_rn(__fadd_rn(a, b), 0.5f); }

}  // namespace ab::backend::cuda
