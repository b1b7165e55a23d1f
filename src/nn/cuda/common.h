// Internal to the CUDA engine: cuDNN error checking, RAII owners for cuDNN descriptors, dtype
// mapping, the hashable keys the per-shape caches use, and the operand checks every family's entry
// points share. Not part of any public header. (CUDA and cuBLASLt checks and handles are the CUDA
// foundation's, backend/cuda/check.h.)
#pragma once

#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "backend/cuda/check.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ab::nn::cuda {

using backend::cuda::check_cuda;

// cuDNN 9 reports "not supported" as a family (CUDNN_STATUS_NOT_SUPPORTED and its sub-codes).
inline bool cudnn_not_supported(cudnnStatus_t status) {
  return CUDNN_STATUS_CATEGORY(status) == CUDNN_STATUS_NOT_SUPPORTED;
}
// cuDNN's status name and code, then the last message cuDNN left for this thread, if any.
std::string cudnn_status_text(cudnnStatus_t status);
// Whether the environment variable `name` is set to something other than empty or "0": the
// families' switches for printing their timed choices (AB_CONV_CHOICES, AB_ATTENTION_CHOICES).
bool env_flag(const char* name);
// "<call> failed (<what>): <status text>": Unsupported for cuDNN 9's not-supported family (its
// sub-codes included), OutOfMemory for its allocation failures, Error otherwise.
[[noreturn]] void throw_cudnn(cudnnStatus_t status, const char* call, const std::string& what);
inline void check_cudnn(cudnnStatus_t status, const char* call, const std::string& what) {
  if (status != CUDNN_STATUS_SUCCESS) throw_cudnn(status, call, what);
}
// Checked calls whose message (`what`) is built only on failure: the per-step kernels run these
// thousands of times a second and must not format strings on the way (AB_CUDA_LAZY and
// AB_CUBLAS_LAZY are the foundation's, backend/cuda/check.h).
#define AB_CUDNN(call, what)                                                         \
  do {                                                                               \
    if (const cudnnStatus_t ab_status_ = (call); ab_status_ != CUDNN_STATUS_SUCCESS) \
      ::ab::nn::cuda::throw_cudnn(ab_status_, #call, (what));                        \
  } while (0)

struct CudnnHandleDeleter {
  void operator()(cudnnHandle_t h) const noexcept { cudnnDestroy(h); }
};
struct TensorDescDeleter {
  void operator()(cudnnTensorDescriptor_t d) const noexcept { cudnnDestroyTensorDescriptor(d); }
};
struct FilterDescDeleter {
  void operator()(cudnnFilterDescriptor_t d) const noexcept { cudnnDestroyFilterDescriptor(d); }
};
struct ConvDescDeleter {
  void operator()(cudnnConvolutionDescriptor_t d) const noexcept { cudnnDestroyConvolutionDescriptor(d); }
};
struct PoolDescDeleter {
  void operator()(cudnnPoolingDescriptor_t d) const noexcept { cudnnDestroyPoolingDescriptor(d); }
};
struct ActivationDescDeleter {
  void operator()(cudnnActivationDescriptor_t d) const noexcept { cudnnDestroyActivationDescriptor(d); }
};
using CudnnHandlePtr = std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, CudnnHandleDeleter>;
using TensorDescPtr = std::unique_ptr<std::remove_pointer_t<cudnnTensorDescriptor_t>, TensorDescDeleter>;
using FilterDescPtr = std::unique_ptr<std::remove_pointer_t<cudnnFilterDescriptor_t>, FilterDescDeleter>;
using ConvDescPtr = std::unique_ptr<std::remove_pointer_t<cudnnConvolutionDescriptor_t>, ConvDescDeleter>;
using PoolDescPtr = std::unique_ptr<std::remove_pointer_t<cudnnPoolingDescriptor_t>, PoolDescDeleter>;
using ActivationDescPtr = std::unique_ptr<std::remove_pointer_t<cudnnActivationDescriptor_t>, ActivationDescDeleter>;

// cuDNN's storage type for a tensor dtype; throws Unsupported for what cuDNN cannot hold.
cudnnDataType_t cudnn_dtype(DType t);
// A 4-d tensor descriptor from the tensor's own strides (NCHW or NHWC alike).
TensorDescPtr make_tensor_desc(const Tensor& t);

// Operand checks of the entry points, naming the kernel. require_flat: one shape, strides and
// dtype, contiguous (the kernels walk flat arrays; else Unsupported); require_scalar: `dtype` [1]
// (else Error); skip_flag: an optimizer's skip_if as the device pointer its kernels read, or null.
void require_flat(const char* kernel, const Tensor& a, const Tensor& b);
void require_scalar(const char* kernel, const char* what, const Tensor& t, DType dtype);
const std::int32_t* skip_flag(const Tensor& skip_if);

// A fixed-size, hashable fingerprint of the descriptor fields a cached plan depends on.
struct Key {
  static constexpr std::size_t kWords = 48;
  std::array<std::int64_t, kWords> w{};
  std::size_t n = 0;

  void add(std::int64_t v) {
    if (n == kWords) throw Error("internal: cache key overflow");
    w[n++] = v;
  }
  void add(const Tensor& t) {
    add(static_cast<std::int64_t>(t.dtype));
    add(t.shape.rank());
    for (int i = 0; i < t.shape.rank(); ++i) {
      add(t.shape[i]);
      add(t.strides[i]);
    }
  }
  friend bool operator==(const Key& a, const Key& b) { return a.n == b.n && a.w == b.w; }
};

struct KeyHash {
  std::size_t operator()(const Key& k) const noexcept {
    std::uint64_t h = 1469598103934665603ULL;
    for (std::size_t i = 0; i < k.n; ++i) h = (h ^ static_cast<std::uint64_t>(k.w[i])) * 1099511628211ULL;
    return static_cast<std::size_t>(h);
  }
};

}  // namespace ab::nn::cuda
