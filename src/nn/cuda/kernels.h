// The engine's kernels on an NVIDIA GPU: cuDNN (convolution, batch norm, max pooling), cuBLASLt
// (linear) and the project's own kernels (nn/cuda/pointwise), all on the cuda backend's
// stream, so the backend's event timer measures them. Built only with ACCELBENCH_CUDA.
//
// Differences from the reference a caller must know:
// - capture() records `body` into a CUDA graph without executing it (stream capture only records
//   launches), as the contract says; replay() launches the graph on the stream.
// - conv2d_prepare runs cuDNN's algorithm search (timed runs on scratch operands) once per distinct
//   (shape, strides, dtype, attributes, deterministic, tf32) and pass: forward always, a backward
//   pass only where ConvPasses asks for it (a later layer of the same configuration that asks for
//   more extends the cached choice). Binding a graph is where it happens. A backward pass called
//   for a configuration prepared without it throws Error naming the shape and the pass.
//   With AB_CONV_CHOICES=1 in the environment each choice is printed to stderr as it is made
//   (the lines of cuda_conv_choices).
// - Storage: f32, f16, bf16 and i32 (labels); f64 is refused (it runs on the reference kernels).
//   Batch-norm parameters and statistics are f32 whatever the activations' dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/kernels.h"

namespace ab::nn {

// Kernels on `backend`'s device and stream; `backend` must be a cuda backend and outlive them.
// Throws Error when it is not, or when cuDNN/cuBLASLt cannot start on the device.
std::unique_ptr<Kernels> make_cuda_kernels(backend::Backend& backend);

// Counters for tests and reports: how often the algorithm search ran and how often a prepared
// plan was found in the cache.
struct CudaKernelStats {
  std::int64_t conv_searches = 0;       // distinct convolution configurations searched
  std::int64_t conv_pass_searches = 0;  // passes searched (forward, backward-data, backward-filter)
  std::int64_t conv_cache_hits = 0;     // conv2d_prepare calls answered from the cache alone
};
// Throws Error when `k` is not the CUDA kernels.
const CudaKernelStats& cuda_kernel_stats(const Kernels& k);

// The convolution algorithms chosen so far, one line per configuration and pass, sorted: the
// configuration, the chosen algorithm with its timed GPU time and workspace, and every timed
// candidate as algo/math:time (cudnnFind's own time in brackets). For reports and for finding
// why a layer is slow. Throws Error when `k` is not the CUDA kernels.
std::vector<std::string> cuda_conv_choices(const Kernels& k);

// The linear GEMMs' plans made so far, one sorted line each: the GEMM (shape, leading dimensions,
// epilogue) and its cuBLASLt algorithm with how it was chosen (timed candidates, or the
// heuristic's first and why), or that cuBLASLt had none for a fused epilogue (the call then ran
// the separate kernels). Throws Error when `k` is not the CUDA kernels.
std::vector<std::string> cuda_linear_choices(const Kernels& k);

// Per batch-norm shape met in training with its ReLU (bn_act ops), whether cuDNN's fused NHWC
// kernels run it and why not where they do not, one sorted line each. Throws Error when `k` is
// not the CUDA kernels.
std::vector<std::string> cuda_bn_fusion_notes(const Kernels& k);

// Per fp8 convolution configuration met so far (conv2d_fp8_*), one sorted line each: the shape,
// cuDNN's engine, or why it was refused (the op then ran in 16 bits), and whether the epilogue ran
// outside cuDNN's graph. Throws Error when `k` is not the CUDA kernels.
std::vector<std::string> cuda_fp8_notes(const Kernels& k);

}  // namespace ab::nn
