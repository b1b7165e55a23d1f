// What every op family's engine on one GPU shares: the backend's device and stream, the pooling
// allocator, the cuDNN handle, the modes nn::Kernels' setters choose, the scratch operands the
// algorithm searches time on, and the write hooks that keep caches keyed by a tensor's address
// honest. CudaKernels (dispatcher.h) owns one; each engine holds a reference to it and owns its
// own plans, caches and scratch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/check.h"
#include "nn/cuda/allocator.h"
#include "nn/cuda/common.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

// The switches nn::Kernels' setters flip; an engine reads them where it builds or looks up a plan.
struct EngineModes {
  bool deterministic = false;
  bool tf32 = false;
  bool cooperative = true;  // cuDNN's persistent (cooperative) batch-norm kernels allowed
  bool fp8_only_where_faster = true;
};

struct EngineContext {
  // `kernels`: the dispatcher that owns this context. Throws Error when `backend` is not a cuda
  // backend or cuDNN cannot start on its device.
  EngineContext(backend::Backend& backend, Kernels& kernels);
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  backend::Backend& backend;
  // The kernels as a whole: a family's fallback runs nn::Kernels' default composition on them
  // (kernels.Kernels::f(...)), which calls back into the families through the dispatcher.
  Kernels& kernels;
  int device = 0;
  std::string label;  // "cuda:0", for messages
  cudaStream_t stream = nullptr;
  int cc_major = 0, cc_minor = 0;
  DeviceAllocator alloc;
  CudnnHandlePtr cudnn;  // bound to `stream`
  EngineModes modes;

  // Whether `stream` is being captured into a CUDA graph (no allocation or search may happen).
  bool capturing() const;

  // The algorithm searches' scratch: grown to hold `operand_bytes` plus a workspace of up to
  // `cap_bytes` (reduced, down to none, where memory is short); returns its base. Shared by the
  // families (convolution, fp8, the fused batch norm's trial) and freed once a graph is bound.
  unsigned char* search_operands(std::int64_t operand_bytes, std::int64_t& cap_bytes, const std::string& what);
  void release_search_scratch() noexcept;

  // A write into device memory starting at `data` (an upload, a fill, a cast, an optimizer's
  // 16-bit copy): every hook hears of it, so a cache keyed by a tensor's address (the fp8 weights'
  // e4m3 images) can mark its entry stale. A family with such a cache registers a hook.
  void add_write_hook(std::function<void(const void*)> hook) { write_hooks_.push_back(std::move(hook)); }
  void written(const void* data) const {
    for (const auto& hook : write_hooks_) hook(data);
  }

 private:
  backend::cuda::DeviceBuffer search_scratch_;
  std::vector<std::function<void(const void*)>> write_hooks_;
};

}  // namespace ab::nn::cuda
