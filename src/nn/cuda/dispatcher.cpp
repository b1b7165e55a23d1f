// The CUDA engine's dispatcher (dispatcher.h): the families' construction, memory and host copies,
// the bind-time checks each family sizes its scratch in, and CUDA-graph capture.
#include "nn/cuda/dispatcher.h"

#include <cmath>
#include <limits>
#include <utility>

#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda {
namespace {

class GraphReplay final : public Replayable {
 public:
  GraphReplay(backend::cuda::GraphPtr graph, backend::cuda::GraphExecPtr exec, cudaStream_t stream, std::string label)
      : graph_(std::move(graph)), exec_(std::move(exec)), stream_(stream), label_(std::move(label)) {}
  void replay() override { AB_CUDA_LAZY(cudaGraphLaunch(exec_.get(), stream_), label_ + " graph replay"); }

 private:
  backend::cuda::GraphPtr graph_;
  backend::cuda::GraphExecPtr exec_;  // destroyed before the graph it was made from
  cudaStream_t stream_;
  std::string label_;
};

}  // namespace

CudaKernels::CudaKernels(backend::Backend& backend)
    : ctx_(backend, *this),
      conv_(ctx_),
      norm_pool_(ctx_),
      pointwise_(ctx_),
      linear_(ctx_),
      attention_(ctx_),
      transformer_(ctx_) {
  AB_CUDA(cudaStreamSynchronize(ctx_.stream), ctx_.label + " engine kernels");
}

CudaKernels::~CudaKernels() {
  // Queued work may still use buffers the families free; errors cannot be reported here.
  cudaSetDevice(ctx_.device);
  cudaStreamSynchronize(ctx_.stream);
}

Allocator& CudaKernels::allocator() {
  // A graph asks for the allocator right after preparing its layers: the algorithm search's
  // scratch operands are no longer needed, and the arena may want their memory.
  ctx_.release_search_scratch();
  return ctx_.alloc;
}

void CudaKernels::synchronize() { AB_CUDA_LAZY(cudaStreamSynchronize(ctx_.stream), ctx_.label + " synchronize"); }

void CudaKernels::upload(const Tensor& dst, const void* host) {
  ctx_.written(dst.data);
  if (dst.size_bytes() <= 0) return;
  // From pageable memory the copy is staged before cudaMemcpyAsync returns, so `host` may be
  // reused at once; the device side is ordered on the stream like every kernel.
  AB_CUDA_LAZY(
      cudaMemcpyAsync(dst.data, host, static_cast<std::size_t>(dst.size_bytes()), cudaMemcpyHostToDevice, ctx_.stream),
      ctx_.label + " upload " + dst.to_string());
}

void CudaKernels::download(const Tensor& src, void* host) {
  if (src.size_bytes() <= 0) return;
  AB_CUDA_LAZY(
      cudaMemcpyAsync(host, src.data, static_cast<std::size_t>(src.size_bytes()), cudaMemcpyDeviceToHost, ctx_.stream),
      ctx_.label + " download " + src.to_string());
  AB_CUDA_LAZY(cudaStreamSynchronize(ctx_.stream), ctx_.label + " download " + src.to_string());
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
    throw OutOfMemory(ctx_.label + " allocate_host: cudaHostAlloc of " + std::to_string(bytes) +
                      " bytes failed: " + cudaGetErrorString(err));
  }
  return HostBuffer(p, bytes, [](void* q) noexcept { cudaFreeHost(q); });
}

void CudaKernels::upload_bytes(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) {
  ctx_.written(dst.data);
  check_byte_range("cuda upload_bytes", dst, offset, bytes);
  if (bytes == 0) return;
  AB_CUDA_LAZY(cudaMemcpyAsync(static_cast<unsigned char*>(dst.data) + offset, host, static_cast<std::size_t>(bytes),
                               cudaMemcpyHostToDevice, ctx_.stream),
               ctx_.label + " upload_bytes " + dst.to_string());
}

void CudaKernels::download_bytes(const Tensor& src, std::int64_t offset, void* host, std::int64_t bytes) {
  check_byte_range("cuda download_bytes", src, offset, bytes);
  if (bytes == 0) return;
  AB_CUDA_LAZY(cudaMemcpyAsync(host, static_cast<const unsigned char*>(src.data) + offset,
                               static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost, ctx_.stream),
               ctx_.label + " download_bytes " + src.to_string());
}

void CudaKernels::fill(const Tensor& t, double value) {
  ctx_.written(t.data);
  if (!t.is_contiguous()) throw Unsupported("cuda fill: tensor " + t.to_string() + " is not contiguous");
  if (t.numel() == 0) return;
  if (value == 0.0 && !std::signbit(value)) {
    AB_CUDA_LAZY(cudaMemsetAsync(t.data, 0, static_cast<std::size_t>(t.size_bytes()), ctx_.stream),
                 ctx_.label + " fill " + t.to_string());
    return;
  }
  cuda_pointwise::fill(ctx_.stream, t.dtype, t.data, t.numel(), value);
}

void CudaKernels::check_tensor(const Tensor& t) {
  if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::bf16 && t.dtype != DType::i32 &&
      t.dtype != DType::i64 && t.dtype != DType::i8)
    throw Unsupported("the CUDA kernels store f32, f16 or bf16 (and i8, i32, i64 integers), not " +
                      std::string(to_string(t.dtype)) + "; f64 runs on the ref kernels");
  if (!t.is_contiguous())
    throw Unsupported("the CUDA kernels take contiguous tensors (NCHW or NHWC), not " + t.to_string());
  if (t.numel() > std::numeric_limits<int>::max())
    throw Unsupported("tensor " + t.to_string() + " has more elements than cuDNN's 32-bit indexing allows");
  // Each family sizes its scratch for the tensors met at bind, so a step (or a capture) never allocates.
  norm_pool_.reserve_for(t);
  pointwise_.reserve_for(t);
}

Kernels::FusionCounts CudaKernels::fusion_counts() const {
  FusionCounts counts;
  norm_pool_.count_fusions(counts);
  conv_.count_fusions(counts);
  linear_.count_fusions(counts);
  return counts;
}

// ---- capture

std::unique_ptr<Replayable> CudaKernels::capture(const std::function<void()>& body) {
  AB_CUDA(cudaSetDevice(ctx_.device), ctx_.label + " capture");
  // Thread-local mode: an allocation or synchronisation from this thread inside `body` fails
  // loudly instead of being recorded wrongly; other threads are not affected.
  AB_CUDA(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal), ctx_.label + " begin capture");
  try {
    body();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(ctx_.stream, &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t raw_graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(ctx_.stream, &raw_graph);
  backend::cuda::GraphPtr graph(raw_graph);
  AB_CUDA(end, ctx_.label +
                   " end capture: the captured work made a call that cannot be recorded "
                   "(an allocation, a host synchronisation or a copy from pageable memory)");
  cudaGraphExec_t exec = nullptr;
  // Node priorities, copied from their streams' during capture (a high-priority gradient
  // all-reduce), stay in force; otherwise every node would run at the launch stream's.
  AB_CUDA(cudaGraphInstantiateWithFlags(&exec, graph.get(), cudaGraphInstantiateFlagUseNodePriority),
          ctx_.label + " instantiate captured graph");
  return std::make_unique<GraphReplay>(std::move(graph), backend::cuda::GraphExecPtr(exec), ctx_.stream, ctx_.label);
}

}  // namespace ab::nn::cuda

namespace ab::nn {

std::unique_ptr<Kernels> make_cuda_kernels(backend::Backend& backend) {
  return std::make_unique<cuda::CudaKernels>(backend);
}

namespace {

const cuda::CudaKernels& as_cuda(const Kernels& k, const char* caller) {
  const auto* c = dynamic_cast<const cuda::CudaKernels*>(&k);
  if (c == nullptr)
    throw Error(std::string(caller) + ": kernels '" + std::string(k.name()) + "' are not the CUDA kernels");
  return *c;
}

}  // namespace

const CudaKernelStats& cuda_kernel_stats(const Kernels& k) { return as_cuda(k, "cuda_kernel_stats").stats(); }

std::vector<std::string> cuda_conv_choices(const Kernels& k) { return as_cuda(k, "cuda_conv_choices").conv_choices(); }

std::vector<std::string> cuda_linear_choices(const Kernels& k) {
  return as_cuda(k, "cuda_linear_choices").linear_choices();
}

std::vector<std::string> cuda_fp8_notes(const Kernels& k) { return as_cuda(k, "cuda_fp8_notes").fp8_notes(); }

std::vector<std::string> cuda_bn_fusion_notes(const Kernels& k) {
  return as_cuda(k, "cuda_bn_fusion_notes").bn_fusion_notes();
}

}  // namespace ab::nn
