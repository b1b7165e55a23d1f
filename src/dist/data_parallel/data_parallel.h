// Data-parallel training: every rank of a launch runs the same graph on its own share of the
// global batch, and the gradients are averaged over the training ranks in buckets that overlap
// backward (buckets.h). On CUDA the backend's stream averager moves them (NCCL or copy engines,
// backend/collectives.h); on host backends the launch's own exchange does (for tests on the CPU).
// docs/METHODOLOGY.md, "Data-parallel training".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "core/dtype.h"
#include "dist/comm.h"
#include "dist/data_parallel/buckets.h"
#include "nn/graph.h"
#include "nn/kernels.h"

namespace ab::dist {

struct DataParallelConfig {
  int gpus = 1;  // ranks 0..gpus-1 of the launch train
  std::int64_t bucket_bytes = kDefaultBucketBytes;
  // The bucket reduced last holds only the first parameters, at least this many bytes (0: none).
  std::int64_t tail_bucket_bytes = 0;
  // The dtype the gradients travel in: bf16 or f16 (PyTorch DDP's compress hooks: each bucket
  // rounded to it, averaged in it, widened back; f32 gradients only) or nullopt: their own.
  std::optional<DType> wire_dtype;
  // How CUDA ranks average; nullopt: copy engines where they apply (2 ranks on one host, gradients
  // in their own dtype; on two hosts it falls back to NCCL and averaging_fallback() says why),
  // NCCL elsewhere. Host averaging ignores it.
  std::optional<backend::AveragerEngine> engine;
  // With copy engines, the two ranks' gradients averaged inside the optimizer's update (each
  // parameter's grad_partner: the peer's gradient) rather than by a kernel per bucket. nullopt:
  // in the update where `update_can_mean` (SGD without fp16 loss scaling, whose check reads the
  // averaged gradients). true with another averaging: attach throws UsageError.
  std::optional<bool> mean_in_update;
  bool update_can_mean = false;
};

// Every rank of the launch constructs it (the NCCL id goes to all); only ranks below `gpus`
// attach it to their graph.
class DataParallel {
 public:
  DataParallel(backend::Backend& backend, Comm& comm, const DataParallelConfig& config);
  ~DataParallel();
  // Buckets the bound graph's gradients and installs the sync (Graph::set_gradient_sync).
  // UsageError for a wire dtype other than bf16/f16 or for gradients that are not f32; Unsupported
  // for copy engines asked for where they do not apply.
  void attach(nn::Graph& graph, nn::Kernels& kernels);
  std::size_t bucket_count() const;
  // "nccl", "copy engines" or "host": what attach chose; "copy engines, mean in the update" for that.
  std::string describe() const;
  const std::string& averaging_fallback() const { return fallback_; }  // why not copy engines; "" if none
  // After attach: the dtype the gradients travel in, and the bytes one step's all-reduces take
  // from each rank (the buckets' elements, alignment padding included, in that dtype).
  DType wire_dtype() const { return wire_; }
  std::int64_t allreduce_bytes_per_step() const { return allreduce_bytes_; }

 private:
  class StreamAveragerAdapter;
  void open_stream_averager(StreamAveragerAdapter& stream, DType grads, std::int64_t largest, unsigned char* lo,
                            unsigned char* hi);

  Comm& comm_;
  DataParallelConfig config_;
  DType wire_ = DType::f32;
  std::int64_t allreduce_bytes_ = 0;
  backend::AveragerEngine used_ = backend::AveragerEngine::nccl;
  std::string fallback_;
  bool mean_in_update_used_ = false;
  std::unique_ptr<backend::CollectiveGroup> group_;  // CUDA; null on idle ranks and host backends
  std::unique_ptr<GradientAverager> averager_;
  std::unique_ptr<BucketedGradientSync> sync_;
};

// Element-wise mean of the training ranks' vectors (ranks 0..gpus-1; idle ranks pass none), summed
// in rank order so that every rank gets the same bits. Every rank of `comm` calls it.
std::vector<double> mean_over_training_ranks(Comm& comm, int gpus, const std::vector<double>& mine);

}  // namespace ab::dist
