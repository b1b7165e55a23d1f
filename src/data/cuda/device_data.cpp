// The factories of data/device.h: on a CUDA backend the copy stream (events order it against the
// backend's stream) and the GPU augmentation's host side; elsewhere the fallbacks and refusals.
#include "data/device.h"

#include "core/dtype.h"
#include "core/error.h"

#ifdef ACCELBENCH_WITH_CUDA
#include <cuda_runtime_api.h>

#include <array>
#include <bit>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "data/cuda/augment_kernel.h"
#endif

namespace ab::data {

#ifdef ACCELBENCH_WITH_CUDA
namespace {

// Tickets finish in order (one copy stream), so `done_` is the newest ticket seen finished; each
// live ticket keeps the event recorded after its copies, reused once the ticket is seen done.
class CudaCopyQueue final : public CopyQueue {
 public:
  explicit CudaCopyQueue(backend::Backend& backend)
      : compute_(static_cast<cudaStream_t>(backend::cuda::native_stream(backend))),
        copy_(copy_stream_on(backend)),
        compute_mark_(make_event()) {}
  ~CudaCopyQueue() override { cudaStreamSynchronize(copy_.get()); }  // nothing in flight outlives the queue
  CudaCopyQueue(const CudaCopyQueue&) = delete;
  CudaCopyQueue& operator=(const CudaCopyQueue&) = delete;
  void wait_for_compute() override {
    AB_CUDA_LAZY(cudaEventRecord(compute_mark_.get(), compute_), "data feeder: mark the compute stream");
    AB_CUDA_LAZY(cudaStreamWaitEvent(copy_.get(), compute_mark_.get(), 0), "data feeder: copy waits for compute");
  }
  void upload(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) override {
    if (offset < 0 || bytes < 0 || offset + bytes > dst.size_bytes())
      throw Error("data feeder: a copy of " + std::to_string(bytes) + " bytes at " + std::to_string(offset) +
                  " outside " + dst.to_string());
    AB_CUDA_LAZY(cudaMemcpyAsync(static_cast<std::uint8_t*>(dst.data) + offset, host, static_cast<std::size_t>(bytes),
                                 cudaMemcpyHostToDevice, copy_.get()),
                 "data feeder: copy a batch to the device");
  }
  std::int64_t record() override {
    backend::cuda::EventPtr e;
    if (spare_.empty()) {
      e = make_event();
    } else {
      e = std::move(spare_.back());
      spare_.pop_back();
    }
    AB_CUDA_LAZY(cudaEventRecord(e.get(), copy_.get()), "data feeder: mark the copies");
    live_.emplace(++recorded_, std::move(e));
    return recorded_;
  }
  void compute_waits(std::int64_t ticket) override {
    if (ticket <= done_) return;  // finished: nothing to wait for
    AB_CUDA_LAZY(cudaStreamWaitEvent(compute_, event_of(ticket), 0), "data feeder: compute waits for a copy");
  }
  bool finished(std::int64_t ticket) override {
    if (ticket <= done_) return true;
    const cudaError_t e = cudaEventQuery(event_of(ticket));
    if (e == cudaErrorNotReady) return false;
    AB_CUDA_LAZY(e, "data feeder: query a copy");
    mark_done(ticket);
    return true;
  }
  void wait(std::int64_t ticket) override {
    if (ticket <= done_) return;
    AB_CUDA_LAZY(cudaEventSynchronize(event_of(ticket)), "data feeder: wait for a copy");
    mark_done(ticket);
  }

 private:
  static backend::cuda::StreamPtr copy_stream_on(const backend::Backend& backend) {
    cuda::use_device_of(backend);
    return backend::cuda::create_stream("the data feeder's copy stream");
  }
  static backend::cuda::EventPtr make_event() {
    cudaEvent_t e = nullptr;
    AB_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "data feeder: an event");
    return backend::cuda::EventPtr(e);
  }
  cudaEvent_t event_of(std::int64_t ticket) const {
    const auto it = live_.find(ticket);
    if (it == live_.end()) throw Error("data feeder: ticket " + std::to_string(ticket) + " was never recorded");
    return it->second.get();
  }
  void mark_done(std::int64_t ticket) {
    done_ = ticket;
    while (!live_.empty() && live_.begin()->first <= ticket) {
      spare_.push_back(std::move(live_.begin()->second));
      live_.erase(live_.begin());
    }
  }

  cudaStream_t compute_;
  backend::cuda::StreamPtr copy_;
  backend::cuda::EventPtr compute_mark_;
  std::map<std::int64_t, backend::cuda::EventPtr> live_;
  std::vector<backend::cuda::EventPtr> spare_;
  std::int64_t recorded_ = 0, done_ = 0;
};

// decode_ahead's decoder: the inner one on `decode_`'s stream, called by a thread of its own, events
// between its stream and compute's. The thread matters: nvJPEG's batched decode may hold the calling
// thread until its work is done (and the decode of batch k+1 waits, on the device, for compute's work
// up to batch k), so a training thread that called it would queue step k only after that decode.
class DecodeAhead final : public GpuDecoder {
 public:
  DecodeAhead(backend::Backend& compute, const std::function<std::unique_ptr<GpuDecoder>(backend::Backend&)>& make)
      : compute_(static_cast<cudaStream_t>(backend::cuda::native_stream(compute))),
        decode_backend_(backend::make_backend(compute.info().id)),
        decode_(static_cast<cudaStream_t>(backend::cuda::native_stream(*decode_backend_))),
        inner_(make(*decode_backend_)),
        compute_mark_(backend::cuda::create_event("decode ahead: compute mark")),
        decoded_{backend::cuda::create_event("decode ahead: batch decoded"),
                 backend::cuda::create_event("decode ahead: batch decoded")},
        worker_([this] { work(); }) {}
  ~DecodeAhead() override {  // the batches' buffers go back to the allocator: nothing may still use them
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
    cudaStreamSynchronize(decode_);
    cudaStreamSynchronize(compute_);
  }
  DecodeAhead(const DecodeAhead&) = delete;
  DecodeAhead& operator=(const DecodeAhead&) = delete;

  const DeviceFeeder::DeviceBatch& next() override {
    if (step_ == 0) request(false);
    const DeviceFeeder::DeviceBatch batch = decoded_batch();
    const auto parity = static_cast<std::size_t>(step_ % 2);
    WaitMark& mark = marks_[static_cast<std::size_t>(step_) % marks_.size()];
    add_wait(mark);  // several steps back: finished, unless the host is that far ahead of the GPU
    AB_CUDA_LAZY(cudaEventRecord(mark.before.get(), compute_), "decode ahead: before the wait");
    AB_CUDA_LAZY(cudaStreamWaitEvent(compute_, decoded_[parity].get(), 0), "decode ahead: compute waits for a batch");
    AB_CUDA_LAZY(cudaEventRecord(mark.after.get(), compute_), "decode ahead: after the wait");
    mark.live = true;
    current_ = batch;
    // Batch k+1 overwrites batch k-1's buffers: after compute's work so far, which read them. The
    // worker is idle here, so it meets this record, not the next call's.
    AB_CUDA_LAZY(cudaEventRecord(compute_mark_.get(), compute_), "decode ahead: mark the compute stream");
    ++step_;
    request(true);
    return current_;
  }
  std::string backend_name() const override { return inner_->backend_name(); }
  double host_cpu_s() const override {
    std::lock_guard lock(mutex_);
    return cpu_s_;
  }
  double device_wait_s() override {
    for (WaitMark& m : marks_) add_wait(m);
    return wait_s_;
  }

 private:
  struct WaitMark {
    backend::cuda::EventPtr before = backend::cuda::create_event("decode ahead: wait start"),
                            after = backend::cuda::create_event("decode ahead: wait end");
    bool live = false;
  };
  void add_wait(WaitMark& m) {
    if (!m.live) return;
    AB_CUDA_LAZY(cudaEventSynchronize(m.after.get()), "decode ahead: a wait's end");
    float ms = 0;
    AB_CUDA_LAZY(cudaEventElapsedTime(&ms, m.before.get(), m.after.get()), "decode ahead: a wait's length");
    wait_s_ += static_cast<double>(ms) * 1e-3;
    m.live = false;
  }
  // Asks the worker for batch step_ (behind compute_mark_ where `after_compute`).
  void request(bool after_compute) {
    {
      std::lock_guard lock(mutex_);
      requested_ = step_ + 1;
      after_compute_ = after_compute;
    }
    changed_.notify_all();
  }
  // Batch step_ once the worker has queued its decode; the worker's error, if it failed.
  DeviceFeeder::DeviceBatch decoded_batch() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return queued_ > step_ || failure_; });
    if (failure_) std::rethrow_exception(failure_);
    return pending_;
  }
  void work() {
    try {
      cuda::use_device_of(*decode_backend_);
      for (std::int64_t batch = 0;; ++batch) {
        bool after_compute = false;
        {
          std::unique_lock lock(mutex_);
          changed_.wait(lock, [&] { return requested_ > batch || stop_; });
          if (stop_) return;
          after_compute = after_compute_;
        }
        if (after_compute)
          AB_CUDA_LAZY(cudaStreamWaitEvent(decode_, compute_mark_.get(), 0), "decode ahead: decode waits for compute");
        const DeviceFeeder::DeviceBatch b = inner_->next();
        AB_CUDA_LAZY(cudaEventRecord(decoded_[static_cast<std::size_t>(batch % 2)].get(), decode_),
                     "decode ahead: mark a decoded batch");
        {
          std::lock_guard lock(mutex_);
          pending_ = b;
          cpu_s_ = inner_->host_cpu_s();
          queued_ = batch + 1;
        }
        changed_.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        failure_ = std::current_exception();
      }
      changed_.notify_all();
    }
  }

  cudaStream_t compute_;
  std::unique_ptr<backend::Backend> decode_backend_;
  cudaStream_t decode_;
  std::unique_ptr<GpuDecoder> inner_;  // after its backend: destroyed first
  backend::cuda::EventPtr compute_mark_;
  std::array<backend::cuda::EventPtr, 2> decoded_;
  std::array<WaitMark, 4> marks_;
  DeviceFeeder::DeviceBatch current_;
  std::int64_t step_ = 0;  // the training thread's
  double wait_s_ = 0;
  // Between the threads, under mutex_:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::int64_t requested_ = 0, queued_ = 0;  // batches asked for, and queued by the worker
  bool after_compute_ = false, stop_ = false;
  DeviceFeeder::DeviceBatch pending_;
  double cpu_s_ = 0;
  std::exception_ptr failure_;
  std::thread worker_;  // last: starts after everything it reads, joined in the destructor
};

}  // namespace

namespace cuda {

void use_device_of(const backend::Backend& backend) {
  const std::string& id = backend.info().id;
  const auto colon = id.find(':');
  if (backend.info().kind != "cuda" || colon == std::string::npos)
    throw Error("data on the GPU: backend '" + id + "' is not a CUDA backend");
  AB_CUDA(cudaSetDevice(std::stoi(id.substr(colon + 1))), id + " for the data path");
}

GpuAugmentShape augment_shape(const Augment& a) {
  if (a.dtype != DType::f32 && a.dtype != DType::f16 && a.dtype != DType::bf16)
    throw UsageError("GPU augmentation: output type " + std::string(to_string(a.dtype)) + " (f16, bf16 or f32)");
  if (a.pad < 0 || a.pad > 1024) throw Error("GPU augmentation: pad " + std::to_string(a.pad) + " (0..1024)");
  return {static_cast<std::int32_t>(a.height), static_cast<std::int32_t>(a.width),
          static_cast<std::int32_t>(a.channels), static_cast<std::int32_t>(!a.random_crop ? a.pad : 0),
          a.dtype == DType::f32 ? 4 : 2};
}

// The host's table (augment.cpp's normalise_table): the same float expression per level.
std::vector<std::uint32_t> level_table(const Augment& a) {
  std::vector<std::uint32_t> t(3 * 256);
  for (std::size_t c = 0; c < 3; ++c)
    for (std::size_t v = 0; v < 256; ++v) {
      const float x = (static_cast<float>(v) / 255.0F - a.mean[c]) / a.stddev[c];
      t[c * 256 + v] = a.dtype == DType::f32   ? std::bit_cast<std::uint32_t>(x)
                       : a.dtype == DType::f16 ? float_to_half_bits(x)
                                               : float_to_bf16_bits(x);
    }
  return t;
}

GpuCrop gpu_crop(const std::uint8_t* pixels, std::int64_t pitch, std::int64_t height, std::int64_t width,
                 std::int64_t channels, const CropBox& box, std::int64_t pad) {
  if (box.y < 0 || box.x < 0 || box.height < 1 || box.width < 1 || box.y + box.height > height + 2 * pad ||
      box.x + box.width > width + 2 * pad)
    throw Error("GPU augmentation: crop box outside the " + std::to_string(height) + "x" + std::to_string(width) +
                " image (padded by " + std::to_string(pad) + ")");
  return {pixels,
          pitch,
          static_cast<std::int32_t>(height),
          static_cast<std::int32_t>(width),
          static_cast<std::int32_t>(channels),
          static_cast<std::int32_t>(box.y),
          static_cast<std::int32_t>(box.x),
          static_cast<std::int32_t>(box.height),
          static_cast<std::int32_t>(box.width),
          box.flip ? 1 : 0};
}

}  // namespace cuda
#endif

std::unique_ptr<CopyQueue> make_copy_queue(backend::Backend& backend, nn::Kernels& kernels) {
#ifdef ACCELBENCH_WITH_CUDA
  if (backend.info().kind == "cuda") return std::make_unique<CudaCopyQueue>(backend);
#else
  (void)backend;
#endif
  return same_stream_copies(kernels);
}

void copy_into(backend::Backend& backend, nn::Kernels& kernels, const Tensor& dst, const Tensor& src) {
  if (dst.size_bytes() != src.size_bytes() || !dst.is_contiguous() || !src.is_contiguous())
    throw Error("data: copy " + src.to_string() + " into " + dst.to_string() + ": not the same contiguous size");
#ifdef ACCELBENCH_WITH_CUDA
  if (backend.info().kind == "cuda") {
    AB_CUDA_LAZY(
        cudaMemcpyAsync(dst.data, src.data, static_cast<std::size_t>(dst.size_bytes()), cudaMemcpyDeviceToDevice,
                        static_cast<cudaStream_t>(backend::cuda::native_stream(backend))),
        "data: copy a fed batch into the step's input");
    return;
  }
#else
  (void)backend;
#endif
  std::vector<std::uint8_t> host(static_cast<std::size_t>(src.size_bytes()));
  kernels.download(src, host.data());
  kernels.upload(dst, host.data());
}

std::unique_ptr<GpuDecoder> decode_ahead(backend::Backend& compute,
                                         const std::function<std::unique_ptr<GpuDecoder>(backend::Backend&)>& make) {
#ifdef ACCELBENCH_WITH_CUDA
  if (compute.info().kind == "cuda") return std::make_unique<DecodeAhead>(compute, make);
#endif
  return make(compute);
}

bool nvjpeg_in_build() {
#ifdef ACCELBENCH_NVJPEG
  return true;
#else
  return false;
#endif
}

std::vector<std::uint8_t> augment_on_gpu(backend::Backend& backend, const std::vector<Image>& images,
                                         const std::vector<CropBox>& boxes, const Augment& a) {
#ifdef ACCELBENCH_WITH_CUDA
  if (backend.info().kind != "cuda") throw Unsupported("GPU augmentation on '" + backend.info().id + "', no GPU");
  if (images.empty() || images.size() != boxes.size())
    throw Error("GPU augmentation: " + std::to_string(images.size()) + " images, " + std::to_string(boxes.size()) +
                " boxes");
  namespace bc = backend::cuda;
  cuda::use_device_of(backend);
  const cuda::GpuAugmentShape shape = cuda::augment_shape(a);
  const auto stream = static_cast<cudaStream_t>(bc::native_stream(backend));
  std::vector<bc::DeviceBuffer> pixels;
  std::vector<cuda::GpuCrop> crops;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const Image& im = images[i];
    if (im.channels != a.channels && !(im.channels == 1 && a.channels == 3))
      throw Error("GPU augmentation: a " + std::to_string(im.channels) + "-channel image for " +
                  std::to_string(a.channels) + "-channel output");
    pixels.emplace_back(std::max<std::int64_t>(1, static_cast<std::int64_t>(im.pixels.size())), "a test image");
    AB_CUDA(cudaMemcpy(pixels.back().get(), im.pixels.data(), im.pixels.size(), cudaMemcpyHostToDevice),
            "a test image");
    crops.push_back(cuda::gpu_crop(pixels.back().as<std::uint8_t>(), im.width * im.channels, im.height, im.width,
                                   im.channels, boxes[i], shape.pad));
  }
  const auto table = cuda::level_table(a);
  const auto n = static_cast<std::int64_t>(images.size());
  const std::int64_t out_bytes = n * a.height * a.width * a.channels * shape.element_bytes;
  bc::DeviceBuffer crop_memory(n * static_cast<std::int64_t>(sizeof(cuda::GpuCrop)), "the crops");
  bc::DeviceBuffer table_memory(static_cast<std::int64_t>(table.size() * 4), "the level table");
  bc::DeviceBuffer out(out_bytes, "the augmented batch");
  AB_CUDA(cudaMemcpy(crop_memory.get(), crops.data(), crops.size() * sizeof(cuda::GpuCrop), cudaMemcpyHostToDevice),
          "the crops");
  AB_CUDA(cudaMemcpy(table_memory.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice), "the level table");
  AB_CUDA(static_cast<cudaError_t>(cuda::launch_gpu_augment(crop_memory.as<cuda::GpuCrop>(), static_cast<int>(n), shape,
                                                            table_memory.as<std::uint32_t>(), out.get(), stream)),
          "the GPU augmentation kernel");
  AB_CUDA(cudaStreamSynchronize(stream), "the GPU augmentation kernel");
  std::vector<std::uint8_t> host(static_cast<std::size_t>(out_bytes));
  AB_CUDA(cudaMemcpy(host.data(), out.get(), host.size(), cudaMemcpyDeviceToHost), "the augmented batch");
  return host;
#else
  (void)backend, (void)images, (void)boxes, (void)a;
  throw Unsupported("GPU augmentation needs a CUDA build");
#endif
}

#ifndef ACCELBENCH_NVJPEG
std::unique_ptr<GpuDecoder> make_nvjpeg_decoder(std::shared_ptr<const SampleSource>, PipelineConfig, backend::Backend&,
                                                nn::Kernels&, const std::string&) {
  throw Unsupported(kNoNvjpeg);
}
#endif

}  // namespace ab::data
