// The project's own CUDA kernels, callable from plain C++: random fills for operands and the
// STREAM kernels. Each launcher checks the launch and throws ab::Error naming `what`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"

namespace ab::backend::cuda {

// Fills `count` elements of type `t` with the counter RNG of core/rng.h: uniform in [-1, 1) for
// floating types, rounded on the device to the storage type; integers in [-127, 127] for i8.
// Supported: f64, f32, f16, bf16, f8e4m3, i8.
void fill_random(DType t, void* data, std::int64_t count, std::uint64_t seed, int sm_count, cudaStream_t stream,
                 const std::string& what);

// Fills `bytes` bytes with random bits (for copy checks).
void fill_random_bytes(void* data, std::int64_t bytes, std::uint64_t seed, int sm_count, cudaStream_t stream,
                       const std::string& what);

// Launch shape of the STREAM kernels, fixed at plan creation so run() does no queries.
struct StreamLaunch {
  int blocks = 0;
  int threads = 0;
};
StreamLaunch stream_launch_shape(std::int64_t n, int sm_count);

// One STREAM op over arrays of n doubles: copy c=a, scale b=s*c, add c=a+b, triad a=b+s*c.
void launch_stream_op(StreamOp op, double* a, double* b, double* c, double scalar, std::int64_t n,
                      const StreamLaunch& shape, cudaStream_t stream, const std::string& what);

}  // namespace ab::backend::cuda
