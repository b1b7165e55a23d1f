#include "nn/cuda/gpu_sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "nn/cuda/pointwise.h"

namespace ab::nn::cuda {
namespace {

// Samples per candidate and the GPU time a sample should span (event resolution is ~0.5 us).
constexpr int kSamples = 5, kLongSamples = 3;
constexpr double kLongRunS = 1e-3, kSampleSpanS = 50e-6;
constexpr int kMaxCallsPerSample = 16;
// A candidate whose first sample is this much slower than the best median so far is dropped.
constexpr double kAbortFactor = 1.5;

}  // namespace

double GpuSampler::sample(const std::function<bool()>& run, int calls, const std::string& what) {
  double seconds = 0;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    AB_CUDA(cudaStreamSynchronize(stream_), what);
    cuda_pointwise::spin(stream_, spin_ns_);
    const auto host_start = std::chrono::steady_clock::now();
    AB_CUDA(cudaEventRecord(start_.get(), stream_), what);
    for (int i = 0; i < calls; ++i)
      if (!run()) throw Error(what + ": a timed run failed after its warm-up succeeded");
    AB_CUDA(cudaEventRecord(stop_.get(), stream_), what);
    const auto host_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - host_start).count();
    AB_CUDA(cudaEventSynchronize(stop_.get()), what);
    float ms = 0;
    AB_CUDA(cudaEventElapsedTime(&ms, start_.get(), stop_.get()), what);
    seconds = static_cast<double>(ms) * 1e-3 / calls;
    if (2 * host_ns < spin_ns_) break;
    spin_ns_ = std::min<std::int64_t>(std::max<std::int64_t>(2 * spin_ns_, 4 * host_ns), kMaxSpinNs);
  }
  return seconds;
}

// The median GPU time of `run` (one call already warmed it), or its first sample where that was
// already kAbortFactor slower than `best_s`, the fastest so far.
double time_candidate(GpuSampler& sampler, const std::function<bool()>& run, double best_s, const std::string& what) {
  const double first_s = sampler.sample(run, 1, what);
  if (first_s > kAbortFactor * best_s) return first_s;
  const int calls = static_cast<int>(
      std::clamp(std::ceil(kSampleSpanS / std::max(first_s, 1e-9)), 1.0, static_cast<double>(kMaxCallsPerSample)));
  std::vector<double> samples;
  for (int i = 0, n = first_s < kLongRunS ? kSamples : kLongSamples; i < n; ++i)
    samples.push_back(sampler.sample(run, calls, what));
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

std::string format_us(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", seconds * 1e6);
  return buf;
}

}  // namespace ab::nn::cuda
