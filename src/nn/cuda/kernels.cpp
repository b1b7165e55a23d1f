// The CUDA engine kernels: construction, memory and host copies, the project's own kernels
// (cuda_pointwise) behind the elementwise and loss entry points, and CUDA-graph capture.
// Optimizers and mixed precision (kernels_optim.cpp), convolution, batch norm, pooling and
// linear live in their own files.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cuda/cuda_backend.h"
#include "nn/cuda/kernels_impl.h"
#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda {

// ---- shared helpers (common.h)

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

namespace {

constexpr std::int64_t kLtWorkspaceBytes = std::int64_t{32} << 20;
constexpr std::int64_t kOnesCount = std::int64_t{1} << 16;  // rows reduced per bias-gradient GEMM

int device_index(const backend::Backend& b) {
  const std::string& id = b.info().id;
  const auto colon = id.find(':');
  if (b.info().kind != "cuda" || colon == std::string::npos)
    throw Error("make_cuda_kernels: backend '" + id + "' is not a CUDA backend");
  return std::stoi(id.substr(colon + 1));
}


class GraphReplay final : public Replayable {
 public:
  GraphReplay(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, std::string label)
      : graph_(graph), exec_(exec), stream_(stream), label_(std::move(label)) {}
  ~GraphReplay() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;
  void replay() override { AB_CUDA_LAZY(cudaGraphLaunch(exec_, stream_), label_ + " graph replay"); }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  std::string label_;
};

}  // namespace

// ---- operand checks (kernels_impl.h)

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

// ---- construction and memory

CudaKernels::CudaKernels(backend::Backend& backend)
    : backend_(backend),
      device_(device_index(backend)),
      label_(backend.info().id),
      stream_(static_cast<cudaStream_t>(backend::cuda::native_stream(backend))),
      alloc_(device_, label_) {
  AB_CUDA(cudaSetDevice(device_), label_ + " engine kernels");
  AB_CUDA(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device_), label_);
  AB_CUDA(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, device_), label_);
  cudnnHandle_t h = nullptr;
  AB_CUDNN(cudnnCreate(&h), label_ + " cuDNN handle");
  cudnn_.reset(h);
  AB_CUDNN(cudnnSetStream(h, stream_), label_ + " cuDNN stream");  // once: every call runs on the backend's stream
  lt_ = backend::cuda::create_lt_handle(label_ + " engine cuBLASLt handle");
  lt_workspace_ = backend::cuda::DeviceBuffer(kLtWorkspaceBytes, label_ + " engine cuBLASLt workspace");
  lars_scratch_ = backend::cuda::DeviceBuffer(
      std::max<std::int64_t>(cuda_pointwise::lars_scratch_floats(), 1) * 4, label_ + " LARS scratch");
  xent_scratch_ = backend::cuda::DeviceBuffer(
      std::max<std::int64_t>(cuda_pointwise::softmax_xent_scratch_floats(1024), 1) * 4, label_ + " loss scratch");
  rd_scratch_ = backend::cuda::DeviceBuffer(cuda_pointwise::rate_distortion_scratch_floats() * 4,
                                            label_ + " rate-distortion scratch");
  ones_count_ = kOnesCount;
  ones_ = backend::cuda::DeviceBuffer(ones_count_ * (4 + 2 + 2), label_ + " ones");
  auto* base = ones_.as<unsigned char>();
  cuda_pointwise::fill(stream_, DType::f32, base, ones_count_, 1.0);
  cuda_pointwise::fill(stream_, DType::f16, base + 4 * ones_count_, ones_count_, 1.0);
  cuda_pointwise::fill(stream_, DType::bf16, base + 6 * ones_count_, ones_count_, 1.0);
  AB_CUDA(cudaStreamSynchronize(stream_), label_ + " engine kernels");
}

CudaKernels::~CudaKernels() {
  // Queued work may still use buffers the members below free; errors cannot be reported here.
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
}

const void* CudaKernels::ones(DType t) const {
  const auto* base = ones_.as<const unsigned char>();
  switch (t) {
    case DType::f32: return base;
    case DType::f16: return base + 4 * ones_count_;
    case DType::bf16: return base + 6 * ones_count_;
    default: throw Unsupported("cuda: no ones vector for " + std::string(to_string(t)));
  }
}

Allocator& CudaKernels::allocator() {
  // A graph asks for the allocator right after preparing its layers: the algorithm search's
  // scratch operands are no longer needed, and the arena may want their memory.
  release_search_scratch();
  return alloc_;
}

void CudaKernels::release_search_scratch() noexcept {
  if (search_scratch_.bytes() == 0 || capturing()) return;
  search_scratch_ = backend::cuda::DeviceBuffer();
}

bool CudaKernels::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

void CudaKernels::synchronize() { AB_CUDA_LAZY(cudaStreamSynchronize(stream_), label_ + " synchronize"); }

void CudaKernels::upload(const Tensor& dst, const void* host) {
  fp8_weights_written(dst.data);
  if (dst.size_bytes() <= 0) return;
  // From pageable memory the copy is staged before cudaMemcpyAsync returns, so `host` may be
  // reused at once; the device side is ordered on the stream like every kernel.
  AB_CUDA_LAZY(
      cudaMemcpyAsync(dst.data, host, static_cast<std::size_t>(dst.size_bytes()), cudaMemcpyHostToDevice, stream_),
      label_ + " upload " + dst.to_string());
}

void CudaKernels::download(const Tensor& src, void* host) {
  if (src.size_bytes() <= 0) return;
  AB_CUDA_LAZY(
      cudaMemcpyAsync(host, src.data, static_cast<std::size_t>(src.size_bytes()), cudaMemcpyDeviceToHost, stream_),
      label_ + " download " + src.to_string());
  AB_CUDA_LAZY(cudaStreamSynchronize(stream_), label_ + " download " + src.to_string());
}

HostBuffer CudaKernels::allocate_host(std::int64_t bytes) {
  if (bytes < 0) throw Error("cuda allocate_host: " + std::to_string(bytes) + " bytes");
  if (bytes == 0) return {};
  void* p = nullptr;
  // Portable: page-locked for every device's context, so another device's kernels copy at full
  // speed too. A failure is the host running out of lockable memory.
  const cudaError_t err = cudaHostAlloc(&p, static_cast<std::size_t>(bytes), cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw OutOfMemory(label_ + " allocate_host: cudaHostAlloc of " + std::to_string(bytes) +
                      " bytes failed: " + cudaGetErrorString(err));
  }
  return HostBuffer(p, bytes, [](void* q) noexcept { cudaFreeHost(q); });
}

void CudaKernels::upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) {
  fp8_weights_written(dst.data);
  check_byte_range("cuda upload_bytes", dst, offset, bytes);
  if (bytes == 0) return;
  AB_CUDA_LAZY(cudaMemcpyAsync(static_cast<unsigned char*>(dst.data) + offset, host, static_cast<std::size_t>(bytes),
                               cudaMemcpyHostToDevice, stream_),
               label_ + " upload_bytes " + dst.to_string());
}

void CudaKernels::download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) {
  check_byte_range("cuda download_bytes", src, offset, bytes);
  if (bytes == 0) return;
  AB_CUDA_LAZY(cudaMemcpyAsync(host, static_cast<const unsigned char*>(src.data) + offset,
                               static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
               label_ + " download_bytes " + src.to_string());
}

void CudaKernels::fill(const Tensor& t, double value) {
  fp8_weights_written(t.data);
  if (!t.is_contiguous()) throw Unsupported("cuda fill: tensor " + t.to_string() + " is not contiguous");
  if (t.numel() == 0) return;
  if (value == 0.0 && !std::signbit(value)) {
    AB_CUDA_LAZY(cudaMemsetAsync(t.data, 0, static_cast<std::size_t>(t.size_bytes()), stream_),
                 label_ + " fill " + t.to_string());
    return;
  }
  cuda_pointwise::fill(stream_, t.dtype, t.data, t.numel(), value);
}

void CudaKernels::check_tensor(const Tensor& t) {
  if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::bf16 && t.dtype != DType::i32)
    throw Unsupported("the CUDA kernels store f32, f16 or bf16 (and i32 labels), not " +
                      std::string(to_string(t.dtype)) + "; f64 runs on the ref kernels");
  if (!t.is_contiguous())
    throw Unsupported("the CUDA kernels take contiguous tensors (NCHW or NHWC), not " + t.to_string());
  if (t.numel() > std::numeric_limits<int>::max())
    throw Unsupported("tensor " + t.to_string() + " has more elements than cuDNN's 32-bit indexing allows");
  if (t.shape.rank() == 4 && t.dtype != DType::i32) {
    // Every activation-shaped tensor may meet a batch norm: size its *Ex workspace now, at bind,
    // so a step (or a capture) never allocates.
    const std::int64_t need = bn_ex_workspace_bytes(t);
    if (need > bn_workspace_.bytes())
      bn_workspace_ = backend::cuda::DeviceBuffer(need, label_ + " batch-norm workspace");
    const std::int64_t scratch = bn_scratch_bytes(t);
    if (scratch > bn_scratch_.bytes()) bn_scratch_ = backend::cuda::DeviceBuffer(scratch, label_ + " batch-norm scratch");
  }
  if (t.shape.rank() == 2) {
    // A [N, K] tensor may be a loss's logits: grow the loss scratch to N rows.
    const std::int64_t need = cuda_pointwise::softmax_xent_scratch_floats(t.shape[0]) * 4;
    if (need > xent_scratch_.bytes()) xent_scratch_ = backend::cuda::DeviceBuffer(need, label_ + " loss scratch");
  }
}

// ---- the project's own kernels

void CudaKernels::relu_forward(const Tensor& x, const Tensor& y) {
  require_flat("relu_forward", x, y);
  cuda_pointwise::relu_forward(stream_, x.dtype, x.data, y.data, x.numel());
}

void CudaKernels::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_flat("relu_backward", y, dy);
  require_flat("relu_backward", y, dx);
  cuda_pointwise::relu_backward(stream_, y.dtype, y.data, dy.data, dx.data, y.numel(), accumulate);
}

void CudaKernels::add_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  require_flat("add_forward", a, b);
  require_flat("add_forward", a, y);
  cuda_pointwise::add_forward(stream_, a.dtype, a.data, b.data, y.data, a.numel());
}

void CudaKernels::copy_gradient(const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_flat("copy_gradient", dy, dx);
  cuda_pointwise::copy_gradient(stream_, dy.dtype, dy.data, dx.data, dy.numel(), accumulate);
}

void CudaKernels::bias_activation_forward(const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& y,
                                          bool relu) {
  require_flat("bias_activation_forward", x, y);
  if (residual.defined()) require_flat("bias_activation_forward", x, residual);
  // The bias is stored as batch-norm parameters are (f32 beside f32/f16/bf16 data, f64 beside
  // f64) or in x's own type (a fused convolution's bias, when its epilogue runs here).
  const DType bias_t = x.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (x.shape.rank() != 4 || (bias.dtype != bias_t && bias.dtype != x.dtype) || bias.shape.rank() != 1 ||
      bias.shape[0] != x.shape[1] || !bias.is_contiguous())
    throw Unsupported("cuda bias_activation_forward: needs x [N, C, H, W] and a contiguous " +
                      std::string(to_string(bias_t)) + " or " + std::string(to_string(x.dtype)) +
                      " bias [C], got x " + x.to_string() + ", bias " + bias.to_string());
  cuda_pointwise::bias_activation_forward(stream_, x.dtype, x.layout, x.data, bias.data, bias.dtype == x.dtype,
                                          residual.defined() ? residual.data : nullptr, y.data, x.shape[0],
                                          x.shape[1], x.shape[2] * x.shape[3], relu);
}

namespace {

void require_pool_operands(const char* kernel, const Tensor& x4, const Tensor& y2) {
  if (x4.shape.rank() != 4 || y2.shape.rank() != 2 || y2.shape[0] != x4.shape[0] || y2.shape[1] != x4.shape[1] ||
      !x4.is_contiguous() || !y2.is_contiguous() || x4.dtype != y2.dtype)
    throw Unsupported(std::string("cuda ") + kernel + ": needs contiguous [N, C, H, W] and [N, C] of one dtype, got " +
                      x4.to_string() + " and " + y2.to_string());
}

}  // namespace

void CudaKernels::global_avgpool_forward(const Tensor& x, const Tensor& y) {
  require_pool_operands("global_avgpool_forward", x, y);
  cuda_pointwise::global_avgpool_forward(stream_, x.dtype, x.layout, x.data, y.data, x.shape[0], x.shape[1],
                                         x.shape[2] * x.shape[3]);
}

void CudaKernels::global_avgpool_backward(const Tensor& dy, const Tensor& dx, bool accumulate) {
  require_pool_operands("global_avgpool_backward", dx, dy);
  cuda_pointwise::global_avgpool_backward(stream_, dx.dtype, dx.layout, dy.data, dx.data, dx.shape[0], dx.shape[1],
                                          dx.shape[2] * dx.shape[3], accumulate);
}

void CudaKernels::softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs,
                                                const Tensor& loss) {
  if (logits.shape.rank() != 2 || !(probs.shape == logits.shape) || !logits.is_contiguous() || !probs.is_contiguous() ||
      labels.dtype != DType::i32 || labels.numel() != logits.shape[0] || !labels.is_contiguous() || loss.numel() != 1)
    throw Unsupported("cuda softmax_cross_entropy_forward: needs contiguous logits and probs [N, K], i32 labels [N] "
                      "and a loss [1]; got " + logits.to_string() + ", " + labels.to_string() + ", " +
                      probs.to_string() + ", " + loss.to_string());
  const std::int64_t n = logits.shape[0];
  const std::int64_t need = cuda_pointwise::softmax_xent_scratch_floats(n) * 4;
  if (need > xent_scratch_.bytes()) {
    if (capturing())
      throw Error("cuda softmax_cross_entropy_forward: loss scratch too small for " + std::to_string(n) +
                  " rows during capture (bind the graph first: check_tensor sizes it)");
    xent_scratch_ = backend::cuda::DeviceBuffer(need, label_ + " loss scratch");
  }
  cuda_pointwise::softmax_xent_forward(stream_, logits.dtype, logits.data, labels.as<const std::int32_t>(), probs.dtype,
                                       probs.data, loss.dtype, loss.data, n, logits.shape[1],
                                       xent_scratch_.as<float>());
}

void CudaKernels::softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                                 const Tensor& dlogits, bool accumulate) {
  if (probs.shape.rank() != 2 || !(probs.shape == dlogits.shape) || !probs.is_contiguous() ||
      !dlogits.is_contiguous() || labels.dtype != DType::i32 || labels.numel() != probs.shape[0] || dloss.numel() != 1)
    throw Unsupported("cuda softmax_cross_entropy_backward: needs contiguous probs and dlogits [N, K], i32 labels [N] "
                      "and dloss [1]; got " + probs.to_string() + ", " + labels.to_string() + ", " +
                      dloss.to_string() + ", " + dlogits.to_string());
  cuda_pointwise::softmax_xent_backward(stream_, probs.dtype, probs.data, labels.as<const std::int32_t>(), dloss.dtype,
                                        dloss.data, dlogits.dtype, dlogits.data, probs.shape[0], probs.shape[1],
                                        accumulate);
}

// ---- learned compression

void CudaKernels::round_forward(const Tensor& x, const Tensor& y, double step) {
  require_flat("round_forward", x, y);
  if (!(step > 0) || !std::isfinite(step)) throw Error("cuda round_forward: step must be positive and finite");
  cuda_pointwise::round_forward(stream_, x.dtype, x.data, y.data, x.numel(), step);
}

void CudaKernels::rate_distortion_forward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                          const Tensor& latent, const Tensor& loss, const Tensor& mse) {
  require_flat("rate_distortion_forward", x_hat, x);
  if (!latent.is_contiguous() || latent.dtype != x.dtype || loss.numel() != 1 || mse.numel() != 1 ||
      loss.dtype != mse.dtype)
    throw Unsupported("cuda rate_distortion_forward: needs a contiguous latent of the images' dtype and loss, mse [1] "
                      "of one dtype; got " + latent.to_string() + ", " + loss.to_string() + ", " + mse.to_string());
  cuda_pointwise::rate_distortion_forward(stream_, x.dtype, x_hat.data, x.data, x.numel(), latent.data,
                                          latent.numel(), d.lambda, loss.dtype, loss.data, mse.data,
                                          rd_scratch_.as<float>());
}

void CudaKernels::rate_distortion_backward(const RateDistortionDesc& d, const Tensor& x_hat, const Tensor& x,
                                           const Tensor& latent, const Tensor& dloss, const Tensor& dx_hat,
                                           bool accumulate_x_hat, const Tensor& dlatent, bool accumulate_latent) {
  require_flat("rate_distortion_backward", x_hat, x);
  if (dx_hat.defined()) require_flat("rate_distortion_backward", x_hat, dx_hat);
  if (dlatent.defined()) require_flat("rate_distortion_backward", latent, dlatent);
  if (dloss.numel() != 1)
    throw Unsupported("cuda rate_distortion_backward: dloss must be [1], got " + dloss.to_string());
  cuda_pointwise::rate_distortion_backward(stream_, x.dtype, x_hat.data, x.data, x.numel(), latent.data,
                                           latent.numel(), d.lambda, dloss.dtype, dloss.data, dx_hat.data,
                                           accumulate_x_hat, dlatent.data, accumulate_latent);
}

// ---- capture

std::unique_ptr<Replayable> CudaKernels::capture(const std::function<void()>& body) {
  AB_CUDA(cudaSetDevice(device_), label_ + " capture");
  // Thread-local mode: an allocation or synchronisation from this thread inside `body` fails
  // loudly instead of being recorded wrongly; other threads are not affected.
  AB_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), label_ + " begin capture");
  try {
    body();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream_, &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    AB_CUDA(end, label_ + " end capture: the captured work made a call that cannot be recorded "
                          "(an allocation, a host synchronisation or a copy from pageable memory)");
  }
  cudaGraphExec_t exec = nullptr;
  // Node priorities, copied from their streams' during capture (a high-priority gradient
  // all-reduce), stay in force; otherwise every node would run at the launch stream's.
  const cudaError_t inst = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  if (inst != cudaSuccess) {
    cudaGraphDestroy(graph);
    AB_CUDA(inst, label_ + " instantiate captured graph");
  }
  return std::make_unique<GraphReplay>(graph, exec, stream_, label_);
}

}  // namespace ab::nn::cuda

namespace ab::nn {

std::unique_ptr<Kernels> make_cuda_kernels(backend::Backend& backend) {
  return std::make_unique<cuda::CudaKernels>(backend);
}

namespace {

const cuda::CudaKernels& as_cuda(const Kernels& k, const char* caller) {
  const auto* c = dynamic_cast<const cuda::CudaKernels*>(&k);
  if (c == nullptr) throw Error(std::string(caller) + ": kernels '" + std::string(k.name()) + "' are not the CUDA kernels");
  return *c;
}

}  // namespace

const CudaKernelStats& cuda_kernel_stats(const Kernels& k) { return as_cuda(k, "cuda_kernel_stats").stats(); }

std::vector<std::string> cuda_conv_choices(const Kernels& k) { return as_cuda(k, "cuda_conv_choices").conv_choices(); }

std::vector<std::string> cuda_fp8_notes(const Kernels& k) { return as_cuda(k, "cuda_fp8_notes").fp8_notes(); }

std::vector<std::string> cuda_bn_fusion_notes(const Kernels& k) {
  return as_cuda(k, "cuda_bn_fusion_notes").bn_fusion_notes();
}

}  // namespace ab::nn
