// The gradient averagers' kernels: casts between f32 and a 16-bit wire type (bf16, f16) for
// all-reduces that communicate f32 gradients in 16 bits (StreamAverager::set_wire_dtype; PyTorch
// DDP's compress hooks), and the pairwise mean of the copy-engine averager.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ab::backend::cuda {

// out[i] = in[i] rounded to nearest even in `wire` (bf16 or f16; Unsupported otherwise). `sm_count`
// sizes the grid (no device query per call: a cast may be captured into a graph).
void cast_f32_to_wire(DType wire, const float* in, void* out, std::int64_t count, int sm_count, cudaStream_t stream);
// out[i] = in[i] widened from `wire` to f32 (exact).
void cast_wire_to_f32(DType wire, const void* in, float* out, std::int64_t count, int sm_count, cudaStream_t stream);

// data[i] = (data[i] + other[i]) / 2, summed in f32 and rounded once to the dtype (f32, bf16, f16;
// Unsupported otherwise). Addition commutes, so two ranks that each add the other's copy agree bit for bit.
void average_in_place(DType dtype, void* data, const void* other, std::int64_t count, int sm_count, cudaStream_t stream);

}  // namespace ab::backend::cuda
