// The CUDA kernels of the generic inference ops (nn/kernels.h's unary_forward ... gather_forward;
// matmul_forward is the linear family's): grid-stride kernels, a vectorised flat path where every
// operand is contiguous alike, else one strided-index kernel (nn/broadcast.h) for the elementwise
// ops and every copy. Math in f32 (f64 for f64), storage f32, f16, bf16 (f64). Each call checks its
// operands (Unsupported with the reason) and enqueues on `stream`: no allocation, no sync, so a
// sequence can be captured into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include "core/tensor.h"
#include "nn/kernels.h"

namespace ab::nn::cuda_generic {

void unary_forward(cudaStream_t stream, const UnaryAttrs& a, const Tensor& x, const Tensor& y);
void binary_forward(cudaStream_t stream, BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& y);
void where_forward(cudaStream_t stream, const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out);
void copy_strided(cudaStream_t stream, const Tensor& x, const Tensor& y);
// generic_reduce.cu
void softmax_forward(cudaStream_t stream, int axis, const Tensor& x, const Tensor& y);
void reduce_mean_forward(cudaStream_t stream, const Tensor& x, const Tensor& y);
void avgpool_forward(cudaStream_t stream, const Pool2dDesc& d, bool count_include_pad, const Tensor& x,
                     const Tensor& y);
void resize_forward(cudaStream_t stream, bool linear, const Tensor& x, const Tensor& y);
// An index outside [-dim, dim) writes 0 (a kernel cannot throw).
void gather_forward(cudaStream_t stream, int axis, const Tensor& table, const Tensor& indices, const Tensor& y);

}  // namespace ab::nn::cuda_generic
