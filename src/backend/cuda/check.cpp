#include "backend/cuda/check.h"

#include <string_view>

#include "core/error.h"

namespace ab::backend::cuda {
namespace {

// "cudaMalloc(&p, bytes)" -> "cudaMalloc": the function is what a reader needs.
std::string call_name(const char* call) {
  const std::string_view text(call);
  return std::string(text.substr(0, text.find('(')));
}

std::string message(const std::string& call, const std::string& what, const std::string& error) {
  std::string msg = call + " failed";
  if (!what.empty()) msg += " (" + what + ")";
  return msg + ": " + error;
}

}  // namespace

void throw_cuda(cudaError_t err, const char* call, const std::string& what) {
  const std::string error = std::string(cudaGetErrorString(err)) + " [" + cudaGetErrorName(err) + "]";
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // an allocation failure is not sticky: clear it so later calls start clean
    throw OutOfMemory(message(call_name(call), what, error));
  }
  throw Error(message(call_name(call), what, error));
}

void throw_cublas(cublasStatus_t status, const char* call, const std::string& what) {
  const std::string error = cublasLtGetStatusString(status);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    cudaGetLastError();
    throw OutOfMemory(message(call_name(call), what, error));
  }
  throw Error(message(call_name(call), what, error));
}

StreamPtr create_stream(const std::string& what, bool highest_priority) {
  int least = 0, greatest = 0;  // default priority 0 is the least
  if (highest_priority) AB_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest), what);
  cudaStream_t s = nullptr;
  AB_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, highest_priority ? greatest : 0), what);
  return StreamPtr(s);
}

EventPtr create_event(const std::string& what) {
  cudaEvent_t e = nullptr;
  AB_CUDA(cudaEventCreate(&e), what);
  return EventPtr(e);
}

LtHandlePtr create_lt_handle(const std::string& what) {
  cublasLtHandle_t h = nullptr;
  AB_CUBLAS(cublasLtCreate(&h), what);
  return LtHandlePtr(h);
}

DeviceBuffer::DeviceBuffer(std::int64_t bytes, const std::string& what) : bytes_(bytes) {
  void* p = nullptr;
  AB_CUDA(cudaMalloc(&p, static_cast<std::size_t>(bytes)), what + ", " + std::to_string(bytes) + " bytes");
  ptr_.reset(p);
}

PinnedBuffer::PinnedBuffer(std::int64_t bytes, const std::string& what) : bytes_(bytes) {
  void* p = nullptr;
  AB_CUDA(cudaMallocHost(&p, static_cast<std::size_t>(bytes)), what + ", " + std::to_string(bytes) + " bytes");
  ptr_.reset(p);
}

}  // namespace ab::backend::cuda
