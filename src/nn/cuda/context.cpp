#include "nn/cuda/context.h"

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace ab::nn::cuda {
namespace {

int device_index(const backend::Backend& b) {
  const std::string& id = b.info().id;
  const auto colon = id.find(':');
  if (b.info().kind != "cuda" || colon == std::string::npos)
    throw Error("make_cuda_kernels: backend '" + id + "' is not a CUDA backend");
  return std::stoi(id.substr(colon + 1));
}

}  // namespace

EngineContext::EngineContext(backend::Backend& b, Kernels& k)
    : backend(b),
      kernels(k),
      device(device_index(b)),
      label(b.info().id),
      stream(static_cast<cudaStream_t>(backend::cuda::native_stream(b))),
      alloc(device, label) {
  AB_CUDA(cudaSetDevice(device), label + " engine kernels");
  AB_CUDA(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device), label);
  AB_CUDA(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device), label);
  cudnnHandle_t h = nullptr;
  AB_CUDNN(cudnnCreate(&h), label + " cuDNN handle");
  cudnn.reset(h);
  AB_CUDNN(cudnnSetStream(h, stream), label + " cuDNN stream");  // once: every call runs on the backend's stream
}

bool EngineContext::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

unsigned char* EngineContext::search_operands(std::int64_t operand_bytes, std::int64_t& cap_bytes,
                                              const std::string& what) {
  for (;;) {
    const std::int64_t need = operand_bytes + cap_bytes;
    if (search_scratch_.bytes() >= need) break;
    try {
      search_scratch_ = backend::cuda::DeviceBuffer();
      search_scratch_ = backend::cuda::DeviceBuffer(need, what + ", algorithm search operands");
      break;
    } catch (const OutOfMemory&) {
      if (cap_bytes == 0) throw;
      cap_bytes /= 8;  // less workspace (fewer algorithms) before giving up
      if (cap_bytes < (std::int64_t{1} << 20)) cap_bytes = 0;
    }
  }
  return search_scratch_.as<unsigned char>();
}

void EngineContext::release_search_scratch() noexcept {
  if (search_scratch_.bytes() == 0 || capturing()) return;
  search_scratch_ = backend::cuda::DeviceBuffer();
}

}  // namespace ab::nn::cuda
