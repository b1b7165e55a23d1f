// The host input pipeline: worker threads decode and augment samples (random-resized crop, flip,
// normalise) into NHWC 16-bit batches held in a ring of page-locked host buffers, and a feeder
// queues each batch's copy to the device while the step before it runs. Order and augmentation
// depend on the seed alone, never on the thread count (docs/DATA.md).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "data/data.h"
#include "nn/kernels.h"

namespace ab::data {

// Where samples come from; load() is called from several worker threads at once.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual std::int64_t size() const = 0;
  virtual std::int32_t label(std::int64_t i) const = 0;
  virtual int classes() const = 0;
  // Sample i's pixels into `out` (one per worker, reused); Error naming the sample when it fails.
  virtual void load(std::int64_t i, Image& out) const = 0;
  // Encoded bytes of the whole set (0 where the pixels are kept raw): for the bytes a rate reads.
  virtual std::int64_t encoded_bytes() const = 0;
  // Sample i's file bytes as stored (JPEG/PNG), for a decoder elsewhere (the GPU's); false where
  // the source keeps raw pixels. Called from one thread at a time per `out`.
  virtual bool encoded(std::int64_t i, std::vector<std::uint8_t>& out) const {
    (void)i;
    (void)out;
    return false;
  }
};
// Pixels kept as they are (no decoding).
std::unique_ptr<SampleSource> raw_source(ImageSet set);
// JPEG/PNG files in memory, decoded on load.
std::unique_ptr<SampleSource> encoded_source(std::vector<std::vector<std::uint8_t>> files,
                                             std::vector<std::int32_t> labels, int classes);
// `set` as JPEGs of size x size, 3 channels (bilinear from the set's own size): an ImageNet-sized
// JPEG set made from, say, Fashion-MNIST. The first `limit` images (all when negative).
std::unique_ptr<SampleSource> jpeg_source(const ImageSet& set, std::int64_t size, int quality, std::int64_t limit);
// An image folder's files, read and decoded on load.
std::unique_ptr<SampleSource> folder_source(ImageFolder folder);

// The sample indices one rank reads in one epoch: a permutation of 0..size-1 fixed by (seed,
// epoch) (identity without `shuffle`), of which rank r takes positions r, r+ranks, ...; every rank
// gets size / ranks of them, so ranks step in lock step (the remainder is left out that epoch).
std::vector<std::int64_t> epoch_order(std::int64_t size, std::uint64_t seed, std::int64_t epoch, int rank, int ranks,
                                      bool shuffle);

// Next-token training windows of a token stream: window k is tokens [k*seq, k*seq + seq] (seq + 1
// tokens, the last window's end inside the stream), the inputs its first seq and the targets its
// last seq. Batches follow epoch_order over the windows (shuffled per epoch, sharded per rank).
// fill() keeps the current epoch's order: one object per thread.
class TokenWindows {
 public:
  TokenWindows(std::vector<std::uint16_t> tokens, std::int64_t seq, std::uint64_t seed, int rank, int ranks);
  std::int64_t windows() const { return windows_; }
  std::int64_t batches_per_epoch(std::int64_t batch) const;
  // Batch `index` (counted over epochs): inputs and targets, each batch x seq int32, row-major.
  void fill(std::int64_t index, std::int64_t batch, std::int32_t* inputs, std::int32_t* targets) const;

 private:
  std::vector<std::uint16_t> tokens_;
  std::int64_t seq_ = 0, windows_ = 0;
  std::uint64_t seed_ = 0;
  int rank_ = 0, ranks_ = 1;
  mutable std::vector<std::int64_t> order_;
  mutable std::int64_t order_epoch_ = -1;
};

// What becomes of each sample: torchvision's RandomResizedCrop(scale, ratio) and
// RandomHorizontalFlip, or (without random_crop) the whole image resized, or with `pad` the image
// padded by pad black pixels a side and a window of its own size cut at random (RandomCrop(size,
// padding), the small-image ResNet recipe); then (x/255 - mean)/std per channel, stored NHWC in
// `dtype` (f16, bf16 or f32).
struct Augment {
  std::int64_t height = 224, width = 224, channels = 3;  // the output; grey sources are replicated to 3
  bool random_crop = true;
  double scale_min = 0.08, scale_max = 1.0;             // of the source's area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height
  bool flip = true;
  std::array<float, 3> mean{0.485F, 0.456F, 0.406F};  // ImageNet's, as torchvision's examples use
  std::array<float, 3> stddev{0.229F, 0.224F, 0.225F};
  DType dtype = DType::bf16;
  std::int64_t pad = 0;  // used where random_crop is off
};
// The source window a sample is cropped from, in source pixels, and whether it is mirrored.
struct CropBox {
  std::int64_t y = 0, x = 0, height = 0, width = 0;
  bool flip = false;
};
// Deterministic in (seed, key): the same sample of the same epoch gets the same box on any thread.
// With `pad` the box is in the padded image's pixels.
CropBox choose_crop(const Augment& a, std::int64_t height, std::int64_t width, std::uint64_t seed, std::uint64_t key);
// Writes one sample (a.height * a.width * a.channels values of a.dtype) at `out`.
void augment_into(const Image& image, const Augment& a, const CropBox& box, void* out);

struct PipelineConfig {
  std::int64_t batch = 64;
  int threads = 1;
  int ring_batches = 0;  // batches in the ring; 0 = threads + 2, so every worker has a batch to fill
  std::uint64_t seed = 1;
  int rank = 0, ranks = 1;
  bool shuffle = true;
  Augment augment;
};

// One batch in host memory, valid until released.
struct HostBatch {
  const void* pixels = nullptr;          // batch x height x width x channels of augment.dtype
  const std::int32_t* labels = nullptr;  // batch
  std::int64_t index = 0;                // batches delivered before this one
  std::int64_t epoch = 0;
};

class HostPipeline {
 public:
  // `kernels`: where the ring's buffers come from (allocate_host: page-locked on a GPU); null
  // for plain memory. Workers start at once.
  HostPipeline(std::shared_ptr<const SampleSource> source, PipelineConfig config, nn::Kernels* kernels);
  ~HostPipeline();  // stops and joins the workers
  HostPipeline(const HostPipeline&) = delete;
  HostPipeline& operator=(const HostPipeline&) = delete;

  // The next batch in order (waits for it); rethrows a worker's error. Held until release().
  HostBatch acquire();
  // Gives the oldest acquired batch's buffer back to the workers.
  void release();

  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  std::int64_t batch_bytes() const { return sample_bytes_ * config_.batch; }
  const PipelineConfig& config() const { return config_; }
  // Samples finished, the workers' CPU time (their threads' own clocks), and the wall time
  // acquire() waited for a batch the workers had not finished (the consumer starved) so far.
  struct Stats {
    std::int64_t samples = 0;
    double worker_cpu_s = 0;
    double acquire_wait_s = 0;
  };
  Stats stats() const;

 private:
  struct Slot;
  void work(int worker);
  void fill_sample(std::int64_t sample, Image& image, std::vector<std::int64_t>& order, std::int64_t& order_epoch);
  void stop() noexcept;

  std::shared_ptr<const SampleSource> source_;
  PipelineConfig config_;
  std::int64_t per_rank_ = 0, batches_per_epoch_ = 0, sample_bytes_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::mutex mutex_;
  std::condition_variable slot_free_, batch_ready_;
  std::atomic<std::int64_t> next_sample_{0};
  std::int64_t next_batch_ = 0, oldest_held_ = 0;  // the consumer's side
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::atomic<std::int64_t> samples_done_{0}, cpu_ns_{0}, acquire_wait_ns_{0};
  std::vector<std::thread> workers_;
};

// Host-to-device copies on a queue of their own, ordered against the stream the steps run on (the
// compute stream) by tickets: on a GPU a copy stream and events (make_copy_queue in
// data/device.h), so a batch's copy overlaps the step before it. All calls from one thread.
class CopyQueue {
 public:
  virtual ~CopyQueue() = default;
  // The copy queue waits (on the device, not the host) for the compute stream's work so far: a
  // device buffer a queued step still reads is not overwritten.
  virtual void wait_for_compute() = 0;
  // Queues `bytes` from `host` (page-locked for overlap) to `dst` at byte `offset`.
  virtual void upload(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) = 0;
  // Marks the copies queued so far; the ticket says when they are done.
  virtual std::int64_t record() = 0;
  // The compute stream waits (on the device) until ticket's copies are done.
  virtual void compute_waits(std::int64_t ticket) = 0;
  // Whether ticket's copies are done (their host memory may be reused), without waiting.
  virtual bool finished(std::int64_t ticket) = 0;
  virtual void wait(std::int64_t ticket) = 0;  // the host waits until ticket's copies are done
};
// Copies queued on `kernels`' own stream (upload_bytes): no overlap with a step, but correct on
// any kernels; finished() holds after the next synchronize() the queue makes in wait().
std::unique_ptr<CopyQueue> same_stream_copies(nn::Kernels& kernels);

// Batches on the device, two deep: next() makes the compute stream wait for batch k's copy
// (queued by the call before), queues batch k+1's copy from its pinned ring slot once the compute
// stream's work so far (the step that read that device buffer) is done, and returns batch k, so
// the host never waits on a copy and a step's input is on the device when it starts. A ring slot
// goes back to the workers once its copy's ticket is finished (polled at each next(); waited for
// only when every slot the feeder may hold is held).
class DeviceFeeder {
 public:
  // Copies on kernels' stream (same_stream_copies): no overlap.
  DeviceFeeder(HostPipeline& pipeline, nn::Kernels& kernels);
  // Copies on `copies` (make_copy_queue: a copy stream on a GPU), the batches ready on kernels' stream.
  DeviceFeeder(HostPipeline& pipeline, nn::Kernels& kernels, std::unique_ptr<CopyQueue> copies);
  ~DeviceFeeder();  // waits for the copies in flight: their device buffers go back to the allocator
  DeviceFeeder(const DeviceFeeder&) = delete;
  DeviceFeeder& operator=(const DeviceFeeder&) = delete;
  struct DeviceBatch {
    Tensor pixels;  // [batch, height, width, channels] NHWC
    Tensor labels;  // i32 [batch]
    std::int64_t index = 0, epoch = 0;
  };
  // Batch k, ready for work queued on the compute stream after this call.
  const DeviceBatch& next();
  // Ring slots held (acquired, their copies not yet seen finished): for tests.
  std::int64_t held() const { return static_cast<std::int64_t>(in_flight_.size()); }

 private:
  void queue_copy(int buffer);
  void release_finished(std::size_t keep_at_most);
  HostPipeline& pipeline_;
  std::unique_ptr<CopyQueue> copies_;
  std::array<Buffer, 2> pixel_memory_, label_memory_;
  std::array<DeviceBatch, 2> batches_;
  std::array<std::int64_t, 2> ticket_{};
  std::vector<std::int64_t> in_flight_;  // tickets of the held ring slots, oldest first
  std::int64_t step_ = 0;
};

}  // namespace ab::data
