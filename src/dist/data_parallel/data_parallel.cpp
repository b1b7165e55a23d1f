// Data-parallel training's gradient averaging (data_parallel.h): the backend's stream averager on
// CUDA (NCCL or copy engines), the launch's host exchange elsewhere.
#include "dist/data_parallel/data_parallel.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "dist/world_group.h"

namespace ab::dist {
namespace {

// v rounded to nearest even in `wire` (bf16 or f16), as a double. Through float rounded to odd
// (float keeps 24 bits, at least 2 more than either wire type's), so the one rounding to `wire`
// is the correct one: rounding to float to nearest first could round twice.
double round_to_wire(double v, DType wire) {
  if (std::isnan(v)) return v;
  auto f = static_cast<float>(v);
  if (static_cast<double>(f) != v) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);  // toward zero
    f = std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);                    // then odd
  }
  return wire == DType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(f)) : half_bits_to_float(float_to_half_bits(f));
}

// Every rank's block through the host, summed in rank order in float64 (the same bits on every
// rank) and divided by the ranks. Synchronous: slow, and only for host backends (tests). With a
// 16-bit wire type (f32 blocks only) it computes what an all-reduce in that type would with
// one rounding: each rank's block rounded to it, the float64 mean rounded to it, widened back.
class HostGradientAverager final : public GradientAverager {
 public:
  HostGradientAverager(Comm& comm, nn::Kernels& kernels, DType wire) : comm_(comm), k_(kernels), wire_(wire) {}
  void average(const Tensor& flat) override {
    std::vector<unsigned char> host(static_cast<std::size_t>(flat.size_bytes()));
    k_.download(flat, host.data());
    Tensor staging = flat;
    staging.data = host.data();
    staging.device = DeviceKind::host;
    std::vector<double> mine = read_host(staging);
    const bool narrow = flat.dtype != wire_;
    if (narrow && flat.dtype != DType::f32)
      throw Error("data parallelism: averaging in " + std::string(to_string(wire_)) + " takes f32 gradients, not " +
                  std::string(to_string(flat.dtype)));
    if (narrow)
      for (double& v : mine) v = round_to_wire(v, wire_);
    Bytes bytes(mine.size() * sizeof(double));
    std::memcpy(bytes.data(), mine.data(), bytes.size());
    std::vector<double> sum(mine.size(), 0.0), theirs(mine.size());
    const std::vector<Bytes> all = comm_.allgather(bytes);
    for (const Bytes& b : all) {
      if (b.size() != bytes.size()) throw Error("data parallelism: ranks' gradient blocks differ in size");
      std::memcpy(theirs.data(), b.data(), b.size());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += theirs[i];
    }
    for (double& v : sum) {
      v /= static_cast<double>(all.size());
      if (narrow) v = round_to_wire(v, wire_);
    }
    write_host(staging, sum);
    k_.upload(flat, host.data());
  }
  void join() override {}

 private:
  Comm& comm_;
  nn::Kernels& k_;
  DType wire_;  // the gradients' own dtype: no rounding
};

}  // namespace

// The backend's stream averager, opened once the buckets are known (attach).
class DataParallel::StreamAveragerAdapter final : public GradientAverager {
 public:
  void average(const Tensor& flat) override { s_->average(flat.data, flat.numel(), flat.dtype); }
  void join() override { s_->join(); }
  backend::StreamAverager& stream_averager() { return *s_; }
  void reset(std::unique_ptr<backend::StreamAverager> s) { s_ = std::move(s); }

 private:
  std::unique_ptr<backend::StreamAverager> s_;
};

DataParallel::DataParallel(backend::Backend& backend, Comm& comm, const DataParallelConfig& config)
    : comm_(comm), config_(config) {
  if (backend.info().kind == "cuda") {
    group_ = first_ranks_collective_group(backend, comm, config.gpus);
  } else if (config.gpus != comm.size()) {
    throw Unsupported("data parallelism on " + backend.info().id + " averages over the whole launch: gpus=" +
                      std::to_string(config.gpus) + " needs -np " + std::to_string(config.gpus));
  }
}

DataParallel::~DataParallel() = default;

// Opens the group's averager for the chosen engine over the buckets' span [lo, hi); where copy
// engines were chosen, not asked for, and refused (e.g. the two ranks on two hosts, which the one
// exchange tells both), NCCL instead, saying why.
void DataParallel::open_stream_averager(StreamAveragerAdapter& stream, DType grads, std::int64_t largest,
                                        unsigned char* lo, unsigned char* hi) {
  const auto open = [&](backend::AveragerEngine engine) {
    stream.reset(group_->make_averager(/*high_priority=*/false, engine));
    if (wire_ != grads) stream.stream_averager().set_wire_dtype(wire_, largest);
    if (lo != nullptr) stream.stream_averager().register_buffers(lo, hi - lo);
  };
  try {
    open(used_);
  } catch (const Unsupported& e) {
    if (config_.engine.has_value() || used_ == backend::AveragerEngine::nccl) throw;
    used_ = backend::AveragerEngine::nccl;
    fallback_ = e.what();
    open(used_);
  }
}

void DataParallel::attach(nn::Graph& graph, nn::Kernels& kernels) {
  if (comm_.rank() >= config_.gpus)
    throw Error("data parallelism: rank " + std::to_string(comm_.rank()) + " does not train");
  DType grads = DType::f32;
  for (const nn::Parameter& p : graph.parameters())
    if (p.grad.defined()) {
      grads = p.grad.dtype;
      break;
    }
  wire_ = config_.wire_dtype.value_or(grads);
  if (wire_ != grads && grads != DType::f32)
    throw UsageError("data parallelism: communicating gradients in " + std::string(to_string(wire_)) +
                     " casts f32 gradients; these are " + std::string(to_string(grads)));
  if (wire_ != grads && wire_ != DType::bf16 && wire_ != DType::f16)
    throw UsageError("data parallelism: gradients are communicated in their own dtype, bf16 or f16, not " +
                     std::string(to_string(wire_)));
  StreamAveragerAdapter* stream = nullptr;
  if (group_) {
    const bool own_dtype = wire_ == grads;
    used_ = config_.engine.value_or(group_->size() == 2 && own_dtype ? backend::AveragerEngine::copy_engines
                                                                     : backend::AveragerEngine::nccl);
    if (used_ == backend::AveragerEngine::copy_engines && !own_dtype)
      throw Unsupported("data parallelism: the copy-engine averager moves gradients in their own dtype (" +
                        std::string(to_string(grads)) + "), not " + std::string(to_string(wire_)) + ": use comm_engine=nccl");
    auto a = std::make_unique<StreamAveragerAdapter>();
    stream = a.get();
    averager_ = std::move(a);
  } else {
    averager_ = std::make_unique<HostGradientAverager>(comm_, kernels, wire_);
  }
  sync_ = std::make_unique<BucketedGradientSync>(graph.parameters(), *averager_, config_.bucket_bytes,
                                                 config_.tail_bucket_bytes);
  std::int64_t largest = 0;
  allreduce_bytes_ = 0;
  unsigned char *lo = nullptr, *hi = nullptr;  // the span of the one store the buckets tile
  for (const auto& b : sync_->buckets()) {
    largest = std::max(largest, b.flat.numel());
    allreduce_bytes_ += b.flat.numel() * static_cast<std::int64_t>(size_bytes(wire_));
    auto* p = static_cast<unsigned char*>(b.flat.data);
    lo = lo == nullptr ? p : std::min(lo, p);
    hi = hi == nullptr ? p + b.flat.size_bytes() : std::max(hi, p + b.flat.size_bytes());
  }
  if (stream != nullptr) open_stream_averager(*stream, grads, largest, lo, hi);
  const bool copy_engines = stream != nullptr && used_ == backend::AveragerEngine::copy_engines;
  if (config_.mean_in_update == true && !copy_engines)
    throw UsageError("data parallelism: the mean in the update takes the copy-engine averager; this run averages with " +
                     describe() + (fallback_.empty() ? "" : " (" + fallback_ + ")"));
  mean_in_update_used_ = copy_engines && lo != nullptr && config_.mean_in_update.value_or(config_.update_can_mean);
  auto* mirror = mean_in_update_used_ ? static_cast<unsigned char*>(stream->stream_averager().leave_mean_to_caller()) : nullptr;
  for (nn::Parameter& p : graph.parameters())
    p.grad_partner = mirror != nullptr && p.grad.defined()
                         ? p.grad.with_data(mirror + (static_cast<unsigned char*>(p.grad.data) - lo))
                         : Tensor{};
  graph.set_gradient_sync(sync_.get());
}

std::size_t DataParallel::bucket_count() const { return sync_ ? sync_->buckets().size() : 0; }

std::string DataParallel::describe() const {
  if (!group_) return "host";
  if (used_ == backend::AveragerEngine::nccl) return "nccl";
  return mean_in_update_used_ ? "copy engines, mean in the update" : "copy engines";
}

std::vector<double> mean_over_training_ranks(Comm& comm, int gpus, const std::vector<double>& mine) {
  Packer out;
  out.put(static_cast<std::int64_t>(mine.size()));
  for (const double v : mine) out.put(v);
  const std::vector<Bytes> all = comm.allgather(out.bytes());
  std::vector<double> sum;
  for (std::size_t r = 0; r < static_cast<std::size_t>(gpus); ++r) {
    Unpacker in(all[r]);
    const auto n = static_cast<std::size_t>(in.get_int());
    if (r == 0) sum.assign(n, 0.0);
    if (n != sum.size()) throw Error("data parallelism: the ranks' loss trajectories differ in length");
    for (double& v : sum) v += in.get_double();
  }
  for (double& v : sum) v /= static_cast<double>(gpus);
  return sum;
}

}  // namespace ab::dist
