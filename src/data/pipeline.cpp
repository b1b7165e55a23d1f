// The ring of batches and its worker threads. Samples are numbered in delivery order over all
// epochs; a worker claims the next number, waits until the ring slot of its batch is free, and
// writes the sample in place, so a batch is filled by every worker at once and delivered in order.
#include <chrono>
#include <ctime>

#include "core/error.h"
#include "core/rng.h"
#include "data/pipeline.h"

namespace ab::data {
namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::int64_t dtype_bytes(DType t) {
  if (t != DType::f16 && t != DType::bf16 && t != DType::f32)
    throw UsageError("pipeline output type " + std::string(to_string(t)) + ": f16, bf16 or f32");
  return static_cast<std::int64_t>(size_bytes(t));
}

}  // namespace

// One batch's memory; `owner` is the batch it is being filled with (or holds), `done` its
// finished samples.
struct HostPipeline::Slot {
  nn::HostBuffer memory;
  std::vector<std::uint8_t> plain;  // when no kernels lend page-locked memory
  std::uint8_t* pixels = nullptr;
  std::int32_t* labels = nullptr;
  std::int64_t owner = 0, done = 0;
};

HostPipeline::HostPipeline(std::shared_ptr<const SampleSource> source, PipelineConfig config, nn::Kernels* kernels)
    : source_(std::move(source)), config_(std::move(config)) {
  const auto& a = config_.augment;
  if (config_.batch < 1 || config_.threads < 1) throw UsageError("pipeline: batch and threads must be >= 1");
  if (a.height < 1 || a.width < 1 || (a.channels != 1 && a.channels != 3))
    throw UsageError("pipeline: output must be at least 1x1 with 1 or 3 channels");
  per_rank_ = source_->size() / config_.ranks;
  batches_per_epoch_ = per_rank_ / config_.batch;
  if (batches_per_epoch_ < 1)
    throw UsageError("pipeline: " + std::to_string(source_->size()) + " samples over " + std::to_string(config_.ranks) +
                     " ranks make no batch of " + std::to_string(config_.batch));
  epoch_order(0, 0, 0, config_.rank, config_.ranks, false);  // refuses a bad rank now, not in a worker
  sample_bytes_ = a.height * a.width * a.channels * dtype_bytes(a.dtype);
  const int ring = std::max(2, config_.ring_batches > 0 ? config_.ring_batches : config_.threads + 2);
  const std::int64_t label_offset = align_up(sample_bytes_ * config_.batch, 64);
  const std::int64_t bytes = label_offset + config_.batch * 4;
  for (int s = 0; s < ring; ++s) {
    auto slot = std::make_unique<Slot>();
    std::uint8_t* base = nullptr;
    if (kernels != nullptr) {
      slot->memory = kernels->allocate_host(bytes);
      base = slot->memory.as<std::uint8_t>();
    } else {
      slot->plain.resize(static_cast<std::size_t>(bytes));
      base = slot->plain.data();
    }
    slot->pixels = base;
    slot->labels = reinterpret_cast<std::int32_t*>(base + label_offset);
    slot->owner = s;
    slots_.push_back(std::move(slot));
  }
  try {
    for (int w = 0; w < config_.threads; ++w) workers_.emplace_back([this, w] { work(w); });
  } catch (...) {  // no destructor runs for a constructor that throws: join the workers started
    stop();
    throw;
  }
}

HostPipeline::~HostPipeline() { stop(); }

void HostPipeline::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  slot_free_.notify_all();
  batch_ready_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

void HostPipeline::work(int) {
  Image image;
  std::vector<std::int64_t> order;
  std::int64_t order_epoch = -1;
  double cpu_before = thread_cpu_seconds();
  try {
    for (;;) {
      const std::int64_t sample = next_sample_.fetch_add(1);
      const std::int64_t batch = sample / config_.batch;
      Slot& slot = *slots_[static_cast<std::size_t>(batch % static_cast<std::int64_t>(slots_.size()))];
      {
        std::unique_lock lock(mutex_);
        slot_free_.wait(lock, [&] { return stopping_ || slot.owner == batch; });
        if (stopping_) return;
      }
      fill_sample(sample, image, order, order_epoch);
      const double cpu_now = thread_cpu_seconds();
      cpu_ns_ += static_cast<std::int64_t>((cpu_now - cpu_before) * 1e9);
      cpu_before = cpu_now;
      ++samples_done_;
      bool full = false;
      {
        std::lock_guard lock(mutex_);
        full = ++slot.done == config_.batch;
      }
      if (full) batch_ready_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
      stopping_ = true;
    }
    slot_free_.notify_all();
    batch_ready_.notify_all();
  }
}

void HostPipeline::fill_sample(std::int64_t sample, Image& image, std::vector<std::int64_t>& order,
                               std::int64_t& order_epoch) {
  const std::int64_t batch = sample / config_.batch;
  const std::int64_t epoch = batch / batches_per_epoch_;
  const std::int64_t position = (batch % batches_per_epoch_) * config_.batch + sample % config_.batch;
  if (epoch != order_epoch) {  // each worker keeps its own copy of the epoch's order
    order = epoch_order(source_->size(), config_.seed, epoch, config_.rank, config_.ranks, config_.shuffle);
    order_epoch = epoch;
  }
  const std::int64_t index = order[static_cast<std::size_t>(position)];
  source_->load(index, image);
  // The augmentation's key: the sample's place in the epoch over all ranks, so it is the same on
  // any thread and for any thread count, and differs between epochs.
  const auto key = static_cast<std::uint64_t>((epoch * config_.ranks + config_.rank) * per_rank_ + position);
  const CropBox box = choose_crop(config_.augment, image.height, image.width, mix64(config_.seed, 0xA5A5), key);
  Slot& slot = *slots_[static_cast<std::size_t>(batch % static_cast<std::int64_t>(slots_.size()))];
  const std::int64_t at = sample % config_.batch;
  augment_into(image, config_.augment, box, slot.pixels + at * sample_bytes_);
  slot.labels[at] = source_->label(index);
}

HostBatch HostPipeline::acquire() {
  const std::int64_t batch = next_batch_;
  Slot& slot = *slots_[static_cast<std::size_t>(batch % static_cast<std::int64_t>(slots_.size()))];
  if (batch - oldest_held_ >= static_cast<std::int64_t>(slots_.size()))
    throw Error("pipeline: every ring buffer is held; release() one before the next acquire()");
  std::unique_lock lock(mutex_);
  const auto ready = [&] { return stopping_ || (slot.owner == batch && slot.done == config_.batch); };
  if (!ready()) {
    const auto waited_from = std::chrono::steady_clock::now();
    batch_ready_.wait(lock, ready);
    acquire_wait_ns_ +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - waited_from).count();
  }
  if (failure_) std::rethrow_exception(failure_);
  if (stopping_) throw Error("pipeline: stopped");
  ++next_batch_;
  return {slot.pixels, slot.labels, batch, batch / batches_per_epoch_};
}

void HostPipeline::release() {
  if (oldest_held_ == next_batch_) throw Error("pipeline: release() without a batch held");
  Slot& slot = *slots_[static_cast<std::size_t>(oldest_held_ % static_cast<std::int64_t>(slots_.size()))];
  {
    std::lock_guard lock(mutex_);
    slot.owner = oldest_held_ + static_cast<std::int64_t>(slots_.size());
    slot.done = 0;
  }
  ++oldest_held_;
  slot_free_.notify_all();
}

HostPipeline::Stats HostPipeline::stats() const {
  return {samples_done_.load(), static_cast<double>(cpu_ns_.load()) * 1e-9,
          static_cast<double>(acquire_wait_ns_.load()) * 1e-9};
}

namespace {

// Copies on the kernels' own stream: the stream orders them before the step, and a ticket is done
// once the host has synchronized after it.
class SameStreamCopies final : public CopyQueue {
 public:
  explicit SameStreamCopies(nn::Kernels& kernels) : kernels_(kernels) {}
  void wait_for_compute() override {}  // one stream: already in order
  void upload(const Tensor& dst, std::int64_t offset, const void* host, std::int64_t bytes) override {
    kernels_.upload_bytes(dst, offset, host, bytes);
  }
  std::int64_t record() override { return ++recorded_; }
  void compute_waits(std::int64_t) override {}
  bool finished(std::int64_t ticket) override { return ticket <= synchronized_; }
  void wait(std::int64_t ticket) override {
    if (ticket <= synchronized_) return;
    kernels_.synchronize();
    synchronized_ = recorded_;
  }

 private:
  nn::Kernels& kernels_;
  std::int64_t recorded_ = 0, synchronized_ = 0;
};

}  // namespace

std::unique_ptr<CopyQueue> same_stream_copies(nn::Kernels& kernels) {
  return std::make_unique<SameStreamCopies>(kernels);
}

DeviceFeeder::DeviceFeeder(HostPipeline& pipeline, nn::Kernels& kernels)
    : DeviceFeeder(pipeline, kernels, same_stream_copies(kernels)) {}

DeviceFeeder::DeviceFeeder(HostPipeline& pipeline, nn::Kernels& kernels, std::unique_ptr<CopyQueue> copies)
    : pipeline_(pipeline), copies_(std::move(copies)) {
  if (!copies_) throw Error("DeviceFeeder: no copy queue");
  const auto& c = pipeline.config();
  const DeviceKind device = kernels.allocator().device();
  const Tensor pixels = Tensor::describe(
      c.augment.dtype, {c.batch, c.augment.height, c.augment.width, c.augment.channels}, Layout::nhwc, device);
  const Tensor labels = Tensor::describe(DType::i32, {c.batch}, Layout::nchw, device);
  for (std::size_t b = 0; b < 2; ++b) {
    pixel_memory_[b] = Buffer(kernels.allocator(), pixels.size_bytes());
    label_memory_[b] = Buffer(kernels.allocator(), labels.size_bytes());
    batches_[b].pixels = pixel_memory_[b].view(pixels);
    batches_[b].labels = label_memory_[b].view(labels);
  }
}

DeviceFeeder::~DeviceFeeder() {
  try {
    if (!in_flight_.empty()) copies_->wait(in_flight_.back());
  } catch (...) {  // teardown never throws; a failed device reports itself at its next call
  }
}

// Ring slots go back in order (release() gives back the oldest held): the oldest is released
// while its copy is done, and waited for while more than `keep_at_most` are held.
void DeviceFeeder::release_finished(std::size_t keep_at_most) {
  while (!in_flight_.empty()) {
    const std::int64_t oldest = in_flight_.front();
    if (!copies_->finished(oldest)) {
      if (in_flight_.size() <= keep_at_most) return;
      copies_->wait(oldest);
    }
    pipeline_.release();
    in_flight_.erase(in_flight_.begin());
  }
}

void DeviceFeeder::queue_copy(int buffer) {
  // At most one slot held besides the one acquired now, so a ring of two suffices.
  release_finished(1);
  const HostBatch host = pipeline_.acquire();
  auto& d = batches_[static_cast<std::size_t>(buffer)];
  // The device buffer's last reader is a step already queued on the compute stream.
  copies_->wait_for_compute();
  copies_->upload(d.pixels, 0, host.pixels, d.pixels.size_bytes());
  copies_->upload(d.labels, 0, host.labels, d.labels.size_bytes());
  ticket_[static_cast<std::size_t>(buffer)] = copies_->record();
  in_flight_.push_back(ticket_[static_cast<std::size_t>(buffer)]);
  d.index = host.index;
  d.epoch = host.epoch;
}

const DeviceFeeder::DeviceBatch& DeviceFeeder::next() {
  const auto current = static_cast<int>(step_ % 2);
  if (step_ == 0) queue_copy(current);
  copies_->compute_waits(ticket_[static_cast<std::size_t>(current)]);
  queue_copy(1 - current);
  ++step_;
  return batches_[static_cast<std::size_t>(current)];
}

}  // namespace ab::data
