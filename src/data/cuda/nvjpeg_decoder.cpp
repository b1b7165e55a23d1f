// GPU decoding (data/device.h's make_nvjpeg_decoder): nvJPEG's batched decode into one device
// buffer per batch position, then the augmentation kernel (augment.cu). Built only where CMake finds
// the toolkit's nvJPEG (ACCELBENCH_NVJPEG). Every nvJPEG and CUDA status is checked where it is
// returned. Everything a batch's work reads or writes besides its output (its files, crops, labels,
// nvJPEG state and decode buffers) alternates between two sets, and a set is reused only after the
// event recorded behind its batch's work has completed: a decode queued behind other work (decode
// ahead's stream waits for the compute stream) then never meets the next batch's host writes into
// nvJPEG's staging, nor the engine's writes into a decode buffer that batch's augmentation still reads.
#include <cuda_runtime_api.h>
#include <nvjpeg.h>

#include <array>
#include <ctime>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/cuda/augment_kernel.h"
#include "data/device.h"

namespace ab::data {
namespace {

namespace bc = backend::cuda;

const char* status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch (no such engine on this GPU)";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    default: return "unknown status";
  }
}

void check_nvjpeg(nvjpegStatus_t s, const char* call, const std::string& what) {
  if (s != NVJPEG_STATUS_SUCCESS)
    throw Error(std::string("nvJPEG ") + call + " failed for " + what + ": " + status_name(s) + " (" +
                std::to_string(static_cast<int>(s)) + ")");
}
#define AB_NVJPEG(call, what) check_nvjpeg((call), #call, (what))

struct HandleDeleter {
  void operator()(nvjpegHandle_t h) const noexcept { nvjpegDestroy(h); }
};
struct StateDeleter {
  void operator()(nvjpegJpegState_t s) const noexcept { nvjpegJpegStateDestroy(s); }
};
using HandlePtr = std::unique_ptr<std::remove_pointer_t<nvjpegHandle_t>, HandleDeleter>;
using StatePtr = std::unique_ptr<std::remove_pointer_t<nvjpegJpegState_t>, StateDeleter>;

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// A handle and a batched-decode state on one backend, or the status that refused them.
struct Opened {
  HandlePtr handle;
  StatePtr state;
  nvjpegStatus_t status = NVJPEG_STATUS_SUCCESS;
};
nvjpegStatus_t batched_state(nvjpegHandle_t h, int batch, StatePtr& state) {
  nvjpegJpegState_t s = nullptr;
  const nvjpegStatus_t status = nvjpegJpegStateCreate(h, &s);
  if (status != NVJPEG_STATUS_SUCCESS) return status;
  state.reset(s);
  // max_cpu_threads is unused by current nvJPEG; 1 is what its samples pass.
  return nvjpegDecodeBatchedInitialize(h, s, batch, 1, NVJPEG_OUTPUT_RGBI);
}
Opened open_backend(nvjpegBackend_t backend, int batch) {
  Opened o;
  nvjpegHandle_t h = nullptr;
  o.status = nvjpegCreateEx(backend, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &h);
  if (o.status != NVJPEG_STATUS_SUCCESS) return o;
  o.handle.reset(h);
  o.status = batched_state(h, batch, o.state);
  return o;
}

// One of the two alternating sets of what a batch's work reads from the host.
struct HostSide {
  std::vector<std::vector<std::uint8_t>> files;
  bc::PinnedBuffer crops, labels;
  bc::DeviceBuffer device_crops;
  StatePtr state;                         // nvJPEG's batched-decode state (its staging buffers)
  std::vector<bc::DeviceBuffer> decoded;  // per batch position: the decoded RGB image
  bc::EventPtr done;
  bool queued = false;
};

class NvjpegDecoder final : public GpuDecoder {
 public:
  NvjpegDecoder(std::shared_ptr<const SampleSource> source, PipelineConfig config, backend::Backend& backend,
                nn::Kernels& kernels, const std::string& engine)
      : source_(std::move(source)),
        config_(std::move(config)),
        stream_(static_cast<cudaStream_t>(bc::native_stream(backend))),
        shape_(cuda::augment_shape(config_.augment)) {
    const auto& a = config_.augment;
    if (a.channels != 3) throw UsageError("nvJPEG decoding writes 3-channel batches (augment.channels 3)");
    if (config_.batch < 1) throw UsageError("nvJPEG decoding: batch must be >= 1");
    per_rank_ = source_->size() / config_.ranks;
    batches_per_epoch_ = per_rank_ / config_.batch;
    if (batches_per_epoch_ < 1)
      throw UsageError("nvJPEG decoding: " + std::to_string(source_->size()) + " samples make no batch of " +
                       std::to_string(config_.batch));
    cuda::use_device_of(backend);
    std::vector<std::uint8_t> probe;
    if (!source_->encoded(0, probe))
      throw Unsupported("nvJPEG decoding needs encoded files; this source keeps raw pixels");
    open(engine);
    make_buffers(kernels);
  }

  // The batches' device memory goes back to the kernels' pooling allocator: nothing may still write it.
  ~NvjpegDecoder() override { cudaStreamSynchronize(stream_); }
  NvjpegDecoder(const NvjpegDecoder&) = delete;
  NvjpegDecoder& operator=(const NvjpegDecoder&) = delete;

  const DeviceFeeder::DeviceBatch& next() override {
    const double cpu_before = thread_cpu_seconds();
    const auto parity = static_cast<std::size_t>(step_ % 2);
    HostSide& side = sides_[parity];
    if (side.queued) AB_CUDA_LAZY(cudaEventSynchronize(side.done.get()), "nvJPEG decoder: a batch two back");
    prepare(step_, side);
    const std::string what = "batch " + std::to_string(step_);
    AB_NVJPEG(nvjpegDecodeBatched(handle_.get(), side.state.get(), data_.data(), lengths_.data(), destinations_.data(),
                                  stream_),
              what + " (engine " + engine_ + "; engine=gpu decodes more kinds of JPEG)");
    auto& out = batches_[parity];
    const auto n = static_cast<std::size_t>(config_.batch);
    AB_CUDA_LAZY(cudaMemcpyAsync(side.device_crops.get(), side.crops.get(), n * sizeof(cuda::GpuCrop),
                                 cudaMemcpyHostToDevice, stream_),
                 "nvJPEG decoder: the crops");
    AB_CUDA_LAZY(cudaMemcpyAsync(out.labels.data, side.labels.get(), n * 4, cudaMemcpyHostToDevice, stream_),
                 "nvJPEG decoder: the labels");
    AB_CUDA_LAZY(static_cast<cudaError_t>(
                     cuda::launch_gpu_augment(side.device_crops.as<cuda::GpuCrop>(), static_cast<int>(config_.batch),
                                              shape_, table_.as<std::uint32_t>(), out.pixels.data, stream_)),
                 "nvJPEG decoder: the augmentation kernel");
    AB_CUDA_LAZY(cudaEventRecord(side.done.get(), stream_), "nvJPEG decoder: mark the batch");
    side.queued = true;
    out.index = step_;
    out.epoch = step_ / batches_per_epoch_;
    ++step_;
    cpu_s_ += thread_cpu_seconds() - cpu_before;
    return out;
  }
  std::string backend_name() const override { return engine_; }
  double host_cpu_s() const override { return cpu_s_; }

 private:
  void open(const std::string& engine) {
    if (engine != "auto" && engine != "hardware" && engine != "gpu")
      throw UsageError("nvJPEG engine '" + engine + "': auto, hardware or gpu");
    if (engine != "gpu") {
      Opened hw = open_backend(NVJPEG_BACKEND_HARDWARE, static_cast<int>(config_.batch));
      if (hw.status == NVJPEG_STATUS_SUCCESS) {
        handle_ = std::move(hw.handle);
        sides_[0].state = std::move(hw.state);
        engine_ = "hardware";
        return;
      }
      if (engine == "hardware")
        throw Unsupported(std::string("nvJPEG's hardware backend on this GPU: ") + status_name(hw.status));
    }
    Opened gpu = open_backend(NVJPEG_BACKEND_GPU_HYBRID, static_cast<int>(config_.batch));
    AB_NVJPEG(gpu.status, std::string("the GPU-hybrid backend"));
    handle_ = std::move(gpu.handle);
    sides_[0].state = std::move(gpu.state);
    engine_ = "gpu";
  }

  void make_buffers(nn::Kernels& kernels) {
    const auto& a = config_.augment;
    const auto n = static_cast<std::size_t>(config_.batch);
    const DeviceKind device = kernels.allocator().device();
    const Tensor pixels = Tensor::describe(a.dtype, {config_.batch, a.height, a.width, 3}, Layout::nhwc, device);
    const Tensor labels = Tensor::describe(DType::i32, {config_.batch}, Layout::nchw, device);
    for (std::size_t b = 0; b < 2; ++b) {
      pixel_memory_[b] = Buffer(kernels.allocator(), pixels.size_bytes());
      label_memory_[b] = Buffer(kernels.allocator(), labels.size_bytes());
      batches_[b].pixels = pixel_memory_[b].view(pixels);
      batches_[b].labels = label_memory_[b].view(labels);
      HostSide& s = sides_[b];
      s.files.resize(n);
      s.crops = bc::PinnedBuffer(static_cast<std::int64_t>(n * sizeof(cuda::GpuCrop)), "nvJPEG decoder crops");
      s.labels = bc::PinnedBuffer(static_cast<std::int64_t>(n * 4), "nvJPEG decoder labels");
      s.device_crops = bc::DeviceBuffer(static_cast<std::int64_t>(n * sizeof(cuda::GpuCrop)), "nvJPEG decoder crops");
      cudaEvent_t e = nullptr;
      AB_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "nvJPEG decoder event");
      s.done.reset(e);
      s.decoded.resize(n);
    }
    AB_NVJPEG(batched_state(handle_.get(), static_cast<int>(config_.batch), sides_[1].state),
              std::string("the second batched-decode state"));
    const auto table = cuda::level_table(a);
    table_ = bc::DeviceBuffer(static_cast<std::int64_t>(table.size() * 4), "nvJPEG decoder level table");
    AB_CUDA(cudaMemcpy(table_.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice), "the level table");
    data_.resize(n);
    lengths_.resize(n);
    destinations_.resize(n);
  }

  // The batch's files, sizes, decode targets, boxes and labels: the host pipeline's order and keys.
  void prepare(std::int64_t batch, HostSide& side) {
    const std::int64_t epoch = batch / batches_per_epoch_;
    if (epoch != order_epoch_) {
      order_ = epoch_order(source_->size(), config_.seed, epoch, config_.rank, config_.ranks, config_.shuffle);
      order_epoch_ = epoch;
    }
    auto* crops = static_cast<cuda::GpuCrop*>(side.crops.get());
    auto* labels = static_cast<std::int32_t*>(side.labels.get());
    for (std::int64_t i = 0; i < config_.batch; ++i) {
      const auto at = static_cast<std::size_t>(i);
      const std::int64_t position = (batch % batches_per_epoch_) * config_.batch + i;
      const std::int64_t index = order_[static_cast<std::size_t>(position)];
      auto& file = side.files[at];
      if (!source_->encoded(index, file))
        throw Error("nvJPEG decoding: sample " + std::to_string(index) + " has no file");
      int components = 0;
      nvjpegChromaSubsampling_t subsampling = NVJPEG_CSS_UNKNOWN;
      std::array<int, NVJPEG_MAX_COMPONENT> widths{}, heights{};
      AB_NVJPEG(nvjpegGetImageInfo(handle_.get(), file.data(), file.size(), &components, &subsampling, widths.data(),
                                   heights.data()),
                "sample " + std::to_string(index) + " (not a JPEG nvJPEG reads)");
      const std::int64_t h = heights[0], w = widths[0];
      if (h < 1 || w < 1) throw Error("nvJPEG: sample " + std::to_string(index) + " has no size");
      std::uint8_t* target = decode_target(side, at, h * w * 3);
      destinations_[at] = nvjpegImage_t{};
      destinations_[at].channel[0] = target;
      destinations_[at].pitch[0] = static_cast<std::size_t>(w * 3);
      data_[at] = file.data();
      lengths_[at] = file.size();
      const auto key = static_cast<std::uint64_t>((epoch * config_.ranks + config_.rank) * per_rank_ + position);
      const CropBox box = choose_crop(config_.augment, h, w, mix64(config_.seed, 0xA5A5), key);
      crops[at] = cuda::gpu_crop(target, w * 3, h, w, 3, box, shape_.pad);
      labels[at] = source_->label(index);
    }
  }

  // Position i's decode buffer of `side`, grown to `bytes`: next() has waited for the side's last
  // batch, so nothing still uses the old one.
  static std::uint8_t* decode_target(HostSide& side, std::size_t i, std::int64_t bytes) {
    if (side.decoded[i].bytes() < bytes)
      side.decoded[i] = bc::DeviceBuffer(bytes, "nvJPEG decode buffer of " + std::to_string(bytes) + " bytes");
    return side.decoded[i].as<std::uint8_t>();
  }

  std::shared_ptr<const SampleSource> source_;
  PipelineConfig config_;
  cudaStream_t stream_ = nullptr;
  cuda::GpuAugmentShape shape_;
  std::int64_t per_rank_ = 0, batches_per_epoch_ = 0;
  HandlePtr handle_;
  std::string engine_;
  std::array<Buffer, 2> pixel_memory_, label_memory_;
  std::array<DeviceFeeder::DeviceBatch, 2> batches_;
  std::array<HostSide, 2> sides_;
  bc::DeviceBuffer table_;
  std::vector<const unsigned char*> data_;
  std::vector<std::size_t> lengths_;
  std::vector<nvjpegImage_t> destinations_;
  std::vector<std::int64_t> order_;
  std::int64_t order_epoch_ = -1, step_ = 0;
  double cpu_s_ = 0;
};

}  // namespace

std::unique_ptr<GpuDecoder> make_nvjpeg_decoder(std::shared_ptr<const SampleSource> source, PipelineConfig config,
                                                backend::Backend& backend, nn::Kernels& kernels,
                                                const std::string& engine) {
  if (backend.info().kind != "cuda") throw Unsupported("nvJPEG decodes on a GPU; '" + backend.info().id + "' is none");
  return std::make_unique<NvjpegDecoder>(std::move(source), std::move(config), backend, kernels, engine);
}

}  // namespace ab::data
