// Checks the measurement harness against a bare CUDA-event loop: both time the same ~1 ms kernel
// on the backend's stream, alternately, and their per-launch times must agree within 2%.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "measure/measure.h"

namespace {

constexpr int kThreads = 256;
constexpr int kBareLaunches = 200;
constexpr int kRounds = 3;
constexpr double kTargetKernelS = 1e-3;
constexpr double kTolerance = 0.02;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw ab::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

// A dependent FMA chain: its time is set by the iteration count and the SM clock, not memory.
__global__ void busy_kernel(float* out, int iterations) {
  float x = static_cast<float>(threadIdx.x) * 1e-3f;
  float y = 1.0f;
  for (int i = 0; i < iterations; ++i) {
    x = fmaf(x, 0.999f, 0.001f);
    y = fmaf(y, x, 1e-4f);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x + y;
}

struct Kernel {
  cudaStream_t stream;
  float* out;
  int blocks;
  int iterations;
  void launch() const {
    busy_kernel<<<blocks, kThreads, 0, stream>>>(out, iterations);
    check(cudaGetLastError(), "busy_kernel launch");
  }
};

// Seconds per launch over `launches` back-to-back launches between two events.
double bare_loop_s(const Kernel& k, int launches) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, k.stream), "cudaEventRecord");
  for (int i = 0; i < launches; ++i) k.launch();
  check(cudaEventRecord(stop, k.stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(ms) * 1e-3 / launches;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run_check() {
  if (ab::backend::cuda::device_count() == 0) {
    std::fprintf(stderr, "timing_check: no CUDA device\n");
    return 2;
  }
  auto backend = ab::backend::cuda::make_backend(0);
  Kernel k{static_cast<cudaStream_t>(ab::backend::cuda::native_stream(*backend)), nullptr,
           backend->info().compute_units * 4, 10000};
  check(cudaMalloc(&k.out, sizeof(float) * static_cast<std::size_t>(k.blocks) * kThreads), "cudaMalloc");

  // Calibrate the iteration count so that one launch lasts about a millisecond.
  bare_loop_s(k, 3);
  const double probe_s = bare_loop_s(k, 5);
  k.iterations = std::max(1000, static_cast<int>(std::lround(k.iterations * kTargetKernelS / probe_s)));

  auto timer = backend->make_timer();
  ab::measure::Settings settings;
  settings.mode = ab::measure::TimingMode::batch;
  std::vector<double> harness_s, bare_s;
  for (int round = 0; round < kRounds; ++round) {
    const auto r = ab::measure::run(*timer, [&k] { k.launch(); }, settings);
    harness_s.push_back(r.summary.median);
    bare_s.push_back(bare_loop_s(k, kBareLaunches));
  }
  cudaFree(k.out);

  const double harness_ms = median(harness_s) * 1e3;
  const double bare_ms = median(bare_s) * 1e3;
  const double ratio = harness_ms / bare_ms;
  std::printf("harness_median_ms bare_loop_ms ratio\n%.4f %.4f %.4f\n", harness_ms, bare_ms, ratio);
  if (!(std::fabs(ratio - 1.0) <= kTolerance)) {
    std::fprintf(stderr, "timing_check: harness and bare loop differ by more than %.0f%%\n", kTolerance * 100);
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  try {
    return run_check();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "timing_check: %s\n", e.what());
    return 2;
  }
}
