// The engine's shared cuDNN helpers and operand checks (common.h).
#include "nn/cuda/common.h"

#include <cstdlib>
#include <limits>

namespace ab::nn::cuda {

bool env_flag(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' && *env != '0';
}

std::string cudnn_status_text(cudnnStatus_t status) {
  char last[1024] = {};
  cudnnGetLastErrorString(last, sizeof last);
  return std::string(cudnnGetErrorString(status)) + " (" + std::to_string(static_cast<int>(status)) + ")" +
         (last[0] != '\0' ? std::string("; cuDNN: ") + last : std::string());
}

void throw_cudnn(cudnnStatus_t status, const char* call, const std::string& what) {
  std::string name(call);
  name = name.substr(0, name.find('('));
  const std::string msg = name + " failed (" + what + "): " + cudnn_status_text(status);
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    cudaGetLastError();
    throw OutOfMemory(msg);
  }
  if (cudnn_not_supported(status)) throw Unsupported(msg);
  throw Error(msg);
}

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::i32: return CUDNN_DATA_INT32;
    default: break;
  }
  throw Unsupported("cuDNN stores f32, f16, bf16, f64 or i32 tensors, not " + std::string(to_string(t)));
}

namespace {

int to_int(std::int64_t v, const Tensor& t) {
  if (v > std::numeric_limits<int>::max())
    throw Unsupported("tensor " + t.to_string() + " has a dimension or stride beyond cuDNN's 32-bit range");
  return static_cast<int>(v);
}

}  // namespace

TensorDescPtr make_tensor_desc(const Tensor& t) {
  if (t.shape.rank() != 4) throw Error("internal: cuDNN tensor descriptor of rank " + std::to_string(t.shape.rank()));
  cudnnTensorDescriptor_t d = nullptr;
  AB_CUDNN(cudnnCreateTensorDescriptor(&d), t.to_string());
  TensorDescPtr owned(d);
  AB_CUDNN(cudnnSetTensor4dDescriptorEx(d, cudnn_dtype(t.dtype), to_int(t.shape[0], t), to_int(t.shape[1], t),
                                        to_int(t.shape[2], t), to_int(t.shape[3], t), to_int(t.strides[0], t),
                                        to_int(t.strides[1], t), to_int(t.strides[2], t), to_int(t.strides[3], t)),
           t.to_string());
  return owned;
}

// ---- operand checks

void require_flat(const char* kernel, const Tensor& a, const Tensor& b) {
  if (!(a.shape == b.shape) || !(a.strides == b.strides) || !a.is_contiguous() || a.dtype != b.dtype)
    throw Unsupported(std::string("cuda ") + kernel +
                      ": operands must be contiguous with one shape, layout and dtype (" + a.to_string() + " vs " +
                      b.to_string() + ")");
}

void require_scalar(const char* kernel, const char* what, const Tensor& t, DType dtype) {
  if (t.dtype != dtype || t.numel() != 1 || !t.defined())
    throw Error(std::string("cuda ") + kernel + ": " + what + " must be " + std::string(to_string(dtype)) +
                "[1], got " + t.to_string());
}

const std::int32_t* skip_flag(const Tensor& skip_if) {
  if (!skip_if.defined()) return nullptr;
  require_scalar("optimizer step", "skip_if", skip_if, DType::i32);
  return skip_if.as<const std::int32_t>();
}

}  // namespace ab::nn::cuda
