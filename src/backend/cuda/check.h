// The CUDA foundation the backend (backend/cuda) and the engine (nn/cuda) share: error checking
// and RAII owners. Every CUDA and cuBLASLt call is checked where it is made; a failure becomes
// ab::Error (ab::OutOfMemory for allocations) naming the call, what it was for, and the CUDA error
// string. cuBLASLt's plans are lt_plan.h's.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

namespace ab::backend::cuda {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const std::string& what);
[[noreturn]] void throw_cublas(cublasStatus_t status, const char* call, const std::string& what);

inline void check_cuda(cudaError_t err, const char* call, const std::string& what) {
  if (err != cudaSuccess) throw_cuda(err, call, what);
}
inline void check_cublas(cublasStatus_t status, const char* call, const std::string& what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas(status, call, what);
}

// The call's text is kept for the message; `what` names the op and shape it served.
#define AB_CUDA(call, what) ::ab::backend::cuda::check_cuda((call), #call, (what))
#define AB_CUBLAS(call, what) ::ab::backend::cuda::check_cublas((call), #call, (what))
// The same, with the message (`what`) built only on failure: for calls made thousands of times a
// second (a training step's kernels), which must not format strings on the way.
#define AB_CUDA_LAZY(call, what)                                        \
  do {                                                                  \
    if (const cudaError_t ab_error_ = (call); ab_error_ != cudaSuccess) \
      ::ab::backend::cuda::throw_cuda(ab_error_, #call, (what));        \
  } while (0)
#define AB_CUBLAS_LAZY(call, what)                                                     \
  do {                                                                                 \
    if (const cublasStatus_t ab_status_ = (call); ab_status_ != CUBLAS_STATUS_SUCCESS) \
      ::ab::backend::cuda::throw_cublas(ab_status_, #call, (what));                    \
  } while (0)

// Deleters never throw: teardown runs in destructors and during unwinding.
struct StreamDeleter {
  void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
struct GraphDeleter {
  void operator()(cudaGraph_t g) const noexcept { cudaGraphDestroy(g); }
};
struct GraphExecDeleter {
  void operator()(cudaGraphExec_t g) const noexcept { cudaGraphExecDestroy(g); }
};
struct LtHandleDeleter {
  void operator()(cublasLtHandle_t h) const noexcept { cublasLtDestroy(h); }
};
struct DeviceFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const noexcept { cudaFreeHost(p); }
};

using StreamPtr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using EventPtr = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
using GraphPtr = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter>;
using GraphExecPtr = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter>;
using LtHandlePtr = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, LtHandleDeleter>;

// Non-blocking (no implicit sync with stream 0); with highest_priority at the device's top priority.
StreamPtr create_stream(const std::string& what, bool highest_priority = false);
EventPtr create_event(const std::string& what);
LtHandlePtr create_lt_handle(const std::string& what);

// Device memory from cudaMalloc; throws OutOfMemory when the device is full.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::int64_t bytes, const std::string& what);
  void* get() const { return ptr_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }
  std::int64_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<void, DeviceFree> ptr_;
  std::int64_t bytes_ = 0;
};

// Page-locked host memory from cudaMallocHost, so copies run at full link speed and asynchronously.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(std::int64_t bytes, const std::string& what);
  void* get() const { return ptr_.get(); }
  std::int64_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<void, HostFree> ptr_;
  std::int64_t bytes_ = 0;
};

}  // namespace ab::backend::cuda
