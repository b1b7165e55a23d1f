// GPU time of a launch sequence, free of host overhead: what every family's search or trial times
// its candidates with (convolution algorithms, the fused epilogue, fp8 plans, the fused batch
// norm). A leaf: it needs the CUDA foundation and the engine's spin kernel only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>

#include "backend/cuda/check.h"

namespace ab::nn::cuda {

// A spin kernel holds the stream while the host queues the runs between two events, so they
// execute back to back. If queueing took longer than half the spin (a slow host call), the spin
// doubles and the sample is taken again.
class GpuSampler {
 public:
  GpuSampler(cudaStream_t stream, const std::string& what)
      : stream_(stream), start_(backend::cuda::create_event(what)), stop_(backend::cuda::create_event(what)) {}

  // Seconds per call of `run`, timed over `calls` back-to-back calls; `run` returns false if the
  // call failed (nothing was queued).
  double sample(const std::function<bool()>& run, int calls, const std::string& what);

 private:
  static constexpr int kMaxAttempts = 4;
  static constexpr std::int64_t kMaxSpinNs = 100'000'000;
  cudaStream_t stream_;
  backend::cuda::EventPtr start_, stop_;
  std::int64_t spin_ns_ = 200'000;
};

// The median GPU time of `run` (one call already warmed it), or its first sample where that was
// already much slower than `best_s`, the fastest candidate so far.
double time_candidate(GpuSampler& sampler, const std::function<bool()>& run, double best_s, const std::string& what);

std::string format_us(double seconds);  // "12.3" (microseconds)

}  // namespace ab::nn::cuda
