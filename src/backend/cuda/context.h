// What a CUDA backend owns and its plans share: the device, one non-blocking stream, the cuBLASLt
// handle and workspace. Plans hold a shared_ptr to it, so a plan outliving its backend stays valid.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/check.h"

namespace ab::backend::cuda {

struct Context {
  int device = 0;
  std::string label;  // "cuda:0", for messages
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  std::int64_t l2_bytes = 0;
  StreamPtr stream;
  LtHandlePtr lt;
  DeviceBuffer workspace;

  cudaStream_t s() const { return stream.get(); }
  // Makes this context's device current on the calling thread (plans may be used from any thread).
  void activate() const;
  void sync(const std::string& what) const;
};

using ContextPtr = std::shared_ptr<const Context>;

std::unique_ptr<GemmPlan> make_gemm_plan(ContextPtr ctx, const GemmDesc& desc);
std::unique_ptr<StreamPlan> make_stream_plan(ContextPtr ctx, StreamOp op, std::int64_t elements);
std::unique_ptr<CopyPlan> make_copy_plan(ContextPtr ctx, CopyKind kind, HostMemory host, std::int64_t bytes);

}  // namespace ab::backend::cuda
