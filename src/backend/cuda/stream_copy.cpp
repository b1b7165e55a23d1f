// STREAM kernels on device double arrays, and cudaMemcpyAsync copies between host and device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/context.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "core/rng.h"

namespace ab::backend::cuda {
namespace {

constexpr double kStreamScalar = 3.0;

template <typename T>
std::vector<T> host_vector(std::int64_t count, const std::string& what) {
  try {
    return std::vector<T>(static_cast<std::size_t>(count));
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("host memory exhausted allocating " + what + " (" +
                      std::to_string(count * static_cast<std::int64_t>(sizeof(T))) + " bytes)");
  }
}

class CudaStream final : public StreamPlan {
 public:
  CudaStream(ContextPtr ctx, StreamOp op, std::int64_t n) : ctx_(std::move(ctx)), op_(op), n_(n) {
    label_ = "stream " + stream_op_name(op) + " n=" + std::to_string(n) + " on " + ctx_->label;
    if (n <= 0) throw Error(label_ + ": the array length must be positive");
    ctx_->activate();
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(double));
    a_ = DeviceBuffer(bytes, label_ + ", a");
    b_ = DeviceBuffer(bytes, label_ + ", b");
    c_ = DeviceBuffer(bytes, label_ + ", c");
    shape_ = stream_launch_shape(n, ctx_->sm_count);
    fill(fresh_seed());
  }

  void run() override {
    launch_stream_op(op_, a_.as<double>(), b_.as<double>(), c_.as<double>(), kStreamScalar, n_, shape_, ctx_->s(),
                     label_);
  }

  double check() override {
    ctx_->activate();
    fill(fresh_seed());
    const std::vector<double> a = download(a_, "a"), b = download(b_, "b"), c = download(c_, "c");
    run();
    // Same order of operations as the kernel (no FMA there), so a correct kernel matches exactly.
    std::vector<double> want;
    const DeviceBuffer* out = nullptr;
    switch (op_) {
      case StreamOp::copy: want = a; out = &c_; break;
      case StreamOp::scale:
        want = host_vector<double>(n_, label_ + ", expected");
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = kStreamScalar * c[i];
        out = &b_;
        break;
      case StreamOp::add:
        want = host_vector<double>(n_, label_ + ", expected");
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = a[i] + b[i];
        out = &c_;
        break;
      case StreamOp::triad:
        want = host_vector<double>(n_, label_ + ", expected");
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = b[i] + kStreamScalar * c[i];
        out = &a_;
        break;
    }
    const std::vector<double> got = download(*out, "result");
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double diff = std::fabs(got[i] - want[i]);
      const double rel = want[i] != 0 ? diff / std::fabs(want[i]) : diff;
      if (!(rel <= worst)) worst = rel;  // a NaN result sticks
    }
    return worst;
  }

 private:
  void fill(std::uint64_t seed) {
    fill_random(DType::f64, a_.get(), n_, seed, ctx_->sm_count, ctx_->s(), label_ + ", a");
    fill_random(DType::f64, b_.get(), n_, mix64(seed, 1), ctx_->sm_count, ctx_->s(), label_ + ", b");
    fill_random(DType::f64, c_.get(), n_, mix64(seed, 2), ctx_->sm_count, ctx_->s(), label_ + ", c");
  }

  std::vector<double> download(const DeviceBuffer& buf, const char* what) {
    auto host = host_vector<double>(n_, label_ + ", host copy of " + what);
    AB_CUDA(cudaMemcpyAsync(host.data(), buf.get(), static_cast<std::size_t>(buf.bytes()), cudaMemcpyDeviceToHost,
                            ctx_->s()),
            label_ + ", copy " + what + " to host");
    ctx_->sync(label_ + ", copy " + what + " to host");
    return host;
  }

  ContextPtr ctx_;
  StreamOp op_;
  std::int64_t n_;
  std::string label_;
  DeviceBuffer a_, b_, c_;
  StreamLaunch shape_;
};

// Host memory for copies: pinned from cudaMallocHost, or pageable from the heap (touched once so
// the first timed copy does not pay for page faults).
class HostBuffer {
 public:
  HostBuffer(HostMemory kind, std::int64_t bytes, const std::string& what) {
    if (kind == HostMemory::pinned) {
      pinned_ = PinnedBuffer(bytes, what);
      ptr_ = static_cast<unsigned char*>(pinned_.get());
    } else {
      pageable_ = host_vector<unsigned char>(bytes, what);
      ptr_ = pageable_.data();
    }
  }
  unsigned char* get() const { return ptr_; }

 private:
  PinnedBuffer pinned_;
  std::vector<unsigned char> pageable_;  // value-initialised: every page already touched
  unsigned char* ptr_ = nullptr;
};

void fill_host_bytes(unsigned char* p, std::int64_t bytes, std::uint64_t seed) {
  const std::int64_t words = bytes / 8;
  for (std::int64_t i = 0; i < words; ++i) {
    const std::uint64_t v = mix64(seed, static_cast<std::uint64_t>(i));
    std::memcpy(p + i * 8, &v, 8);
  }
  for (std::int64_t i = words * 8; i < bytes; ++i)
    p[i] = static_cast<unsigned char>(mix64(seed, static_cast<std::uint64_t>(words + i)) & 0xffu);
}

class CudaCopy final : public CopyPlan {
 public:
  CudaCopy(ContextPtr ctx, CopyKind kind, HostMemory host, std::int64_t bytes)
      : ctx_(std::move(ctx)), kind_(kind), bytes_(bytes) {
    label_ = "copy " + copy_kind_name(kind) + " " + std::to_string(bytes) + " bytes" +
             (kind == CopyKind::device_to_device ? "" : host == HostMemory::pinned ? " pinned" : " pageable") +
             " on " + ctx_->label;
    if (bytes <= 0) throw Error(label_ + ": the byte count must be positive");
    ctx_->activate();
    switch (kind) {
      case CopyKind::host_to_device:
        host_.emplace(host, bytes, label_ + ", source");
        dst_dev_ = DeviceBuffer(bytes, label_ + ", destination");
        src_ = host_->get();
        dst_ = dst_dev_.get();
        direction_ = cudaMemcpyHostToDevice;
        break;
      case CopyKind::device_to_host:
        src_dev_ = DeviceBuffer(bytes, label_ + ", source");
        host_.emplace(host, bytes, label_ + ", destination");
        src_ = src_dev_.get();
        dst_ = host_->get();
        direction_ = cudaMemcpyDeviceToHost;
        break;
      case CopyKind::device_to_device:
        src_dev_ = DeviceBuffer(bytes, label_ + ", source");
        dst_dev_ = DeviceBuffer(bytes, label_ + ", destination");
        src_ = src_dev_.get();
        dst_ = dst_dev_.get();
        direction_ = cudaMemcpyDeviceToDevice;
        break;
    }
    fill_source(fresh_seed());
  }

  void run() override {
    AB_CUDA(cudaMemcpyAsync(dst_, src_, static_cast<std::size_t>(bytes_), direction_, ctx_->s()), label_);
  }

  std::int64_t check() override {
    ctx_->activate();
    fill_source(fresh_seed());
    run();
    const std::vector<unsigned char> src = to_host(src_, kind_ == CopyKind::host_to_device, "source");
    const std::vector<unsigned char> dst = to_host(dst_, kind_ == CopyKind::device_to_host, "destination");
    std::int64_t differing = 0;
    for (std::size_t i = 0; i < src.size(); ++i) differing += src[i] != dst[i] ? 1 : 0;
    return differing;
  }

 private:
  void fill_source(std::uint64_t seed) {
    if (kind_ == CopyKind::host_to_device) {
      ctx_->sync(label_ + ", before refilling the source");  // a copy in flight may still read it
      fill_host_bytes(static_cast<unsigned char*>(src_), bytes_, seed);
    } else {
      fill_random_bytes(src_, bytes_, seed, ctx_->sm_count, ctx_->s(), label_ + ", source");
    }
    ctx_->sync(label_ + ", filling the source");
  }

  std::vector<unsigned char> to_host(const void* p, bool on_host, const char* what) {
    auto out = host_vector<unsigned char>(bytes_, label_ + ", host copy of " + what);
    AB_CUDA(cudaMemcpyAsync(out.data(), p, out.size(), on_host ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost,
                            ctx_->s()),
            label_ + ", reading back the " + what);
    ctx_->sync(label_ + ", reading back the " + what);
    return out;
  }

  ContextPtr ctx_;
  CopyKind kind_;
  std::int64_t bytes_;
  std::string label_;
  std::optional<HostBuffer> host_;
  DeviceBuffer src_dev_, dst_dev_;
  void* src_ = nullptr;
  void* dst_ = nullptr;
  cudaMemcpyKind direction_ = cudaMemcpyDefault;
};

}  // namespace

std::unique_ptr<StreamPlan> make_stream_plan(ContextPtr ctx, StreamOp op, std::int64_t elements) {
  return std::make_unique<CudaStream>(std::move(ctx), op, elements);
}

std::unique_ptr<CopyPlan> make_copy_plan(ContextPtr ctx, CopyKind kind, HostMemory host, std::int64_t bytes) {
  return std::make_unique<CudaCopy>(std::move(ctx), kind, host, bytes);
}

}  // namespace ab::backend::cuda
