// Gradient bucketing for data parallelism: the parameter gradients are averaged over the ranks
// before the update, in buckets that start reducing while backward is still running (PyTorch
// DDP's scheme: ~25 MiB buckets in backward order). The averaging itself is a GradientAverager's
// (data_parallel.cpp: the backend's stream averager on CUDA, a host exchange elsewhere).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nn/graph.h"

namespace ab::dist {

// Averages flat gradient blocks over the ranks, in place. average() only enqueues: it runs after
// the work already enqueued on the kernels' stream and may overlap later work; join() makes the
// kernels' stream wait for every average() before it.
class GradientAverager {
 public:
  virtual ~GradientAverager() = default;
  virtual void average(const Tensor& flat) = 0;
  virtual void join() = 0;
};

constexpr std::int64_t kDefaultBucketBytes = std::int64_t{25} << 20;  // DDP's bucket_cap_mb

// The gradient sync a data-parallel graph is given (Graph::set_gradient_sync). Buckets are runs of
// parameters in backward order (reverse parameter order) of at least `bucket_bytes` (the last one
// smaller), each one contiguous block of the graph's gradient store, averaged in place as soon as
// its last gradient is final; finish() averages any bucket not yet started (a parameter whose op
// ran no backward) and joins. With `tail_bytes` > 0 the first parameters (the last gradients
// backward makes: the stem's) form a bucket of their own of at least `tail_bytes`, so the all-reduce
// left after backward is that small one rather than the remainder of the 25 MiB walk (0: no tail).
// Throws Error when the gradients are not one contiguous store of one dtype (the graph lays them out so).
class BucketedGradientSync final : public nn::GradientSync {
 public:
  BucketedGradientSync(const std::vector<nn::Parameter>& parameters, GradientAverager& averager,
                       std::int64_t bucket_bytes = kDefaultBucketBytes, std::int64_t tail_bytes = 0);
  void begin() override;
  void ready(std::size_t parameter_index) override;
  void finish() override;

  struct Bucket {
    std::vector<std::size_t> parameters;  // indices, in backward order
    Tensor flat;                          // the block: first gradient's start to last one's end
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  void start(std::size_t bucket);

  GradientAverager& averager_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // per parameter index; -1 for one without a gradient
  std::vector<std::size_t> pending_;
  std::vector<bool> started_, reported_;  // per bucket; per parameter
};

}  // namespace ab::dist
