// Times the engine's attention kernels (nn::make_device_kernels on cuda:0) at GPT-2 124M's shape
// and a few others, one line per shape, backward variant and pass: milliseconds per call (CUDA
// events around back-to-back calls after a warm-up) and TFLOP/s on the counted FLOPs (4 * pairs
// * D forward, 8 * pairs * D backward; pairs = B * H * the visible query-key pairs of a head).
// The operands are views into one interleaved QKV row buffer, as the Attention op reads them.
// Each line ends with the variant's largest difference from the pass's first variant (o forward,
// dqkv backward), relative to the largest value: about 1e-2 (bf16 rounding of a sum taken in
// another order) is agreement; O(1) or inf is a broken variant.
// Variants (nn/cuda/attention_variants.h): the own forward's block shapes (4 warps of 32 rows at
// D 64, or 8 of 16) and cuDNN's fused attention; the own backward in deterministic mode (the
// second dQ pass) and with the atomic dQ at 64 and 128 keys a block, and cuDNN's.
//   build/cuda/bench/ab_attention_bench [repetitions]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "nn/cuda/attention_variants.h"
#include "nn/cuda/device_kernels.h"
#include "nn/kernels.h"

namespace {

using ab::Buffer;
using ab::DType;
using ab::Shape;
using ab::Tensor;
using std::int64_t;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw ab::Error(std::string(what) + ": " + cudaGetErrorString(err));
}

struct Shape4 {
  int64_t batch, heads, seq, dim;
  bool causal;
  int64_t pairs() const { return batch * heads * (causal ? seq * (seq + 1) / 2 : seq * seq); }
};

// Part `part` of rows [B*T, parts*H*D] laid out [B, T, parts, H, D], as [B, H, T, D].
Tensor head_view(const Tensor& rows, int64_t parts, int64_t part, int64_t heads, int64_t seq) {
  const int64_t width = rows.shape[1] / parts, dim = width / heads, batch = rows.shape[0] / seq;
  Tensor v = Tensor::describe(rows.dtype, Shape{batch, heads, seq, dim}, ab::Layout::nchw, rows.device);
  v.strides = {seq * parts * width, dim, parts * width, 1};
  v.data = static_cast<char*>(rows.data) + part * width * static_cast<int64_t>(ab::size_bytes(rows.dtype));
  return v;
}

// bf16 values uniform in [-amplitude, amplitude) (truncated f32 bits), from a fixed LCG.
std::vector<std::uint16_t> random_bf16(int64_t n, float amplitude, std::uint64_t seed) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(n));
  std::uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& v : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const float f = (static_cast<float>(x >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f) * amplitude;
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<std::uint16_t>(bits >> 16);
  }
  return out;
}

class Bench {
 public:
  Bench() : backend_(ab::backend::make_backend("cuda:0")), kernels_(ab::nn::make_device_kernels(*backend_)) {
    stream_ = static_cast<cudaStream_t>(ab::backend::cuda::native_stream(*backend_));
  }

  void run(const Shape4& s, int repetitions) {
    const int64_t rows = s.batch * s.seq, width = s.heads * s.dim;
    Buffer qkv_buf, o_buf, dout_buf, stats_buf, dqkv_buf;
    const Tensor qkv = make(qkv_buf, DType::bf16, Shape{rows, 3 * width});
    const Tensor o = make(o_buf, DType::bf16, Shape{rows, width});
    const Tensor dout = make(dout_buf, DType::bf16, Shape{rows, width});
    const Tensor stats = make(stats_buf, DType::f32, Shape{s.batch, s.heads, s.seq});
    const Tensor dqkv = make(dqkv_buf, DType::bf16, Shape{rows, 3 * width});
    kernels_->upload(qkv, random_bf16(rows * 3 * width, 2.0f, 1).data());
    kernels_->upload(dout, random_bf16(rows * width, 1.0f, 2).data());
    const ab::nn::AttentionDesc d{.scale = 0.0, .causal = s.causal, .key_lengths = Tensor{}};
    const auto part = [&](const Tensor& t, int64_t parts, int64_t i) { return head_view(t, parts, i, s.heads, s.seq); };
    const Tensor q = part(qkv, 3, 0), k = part(qkv, 3, 1), v = part(qkv, 3, 2), ov = part(o, 1, 0);
    const auto forward = [&] { kernels_->attention_forward(d, q, k, v, ov, stats); };
    const auto backward = [&] {
      kernels_->attention_backward(d, q, k, v, ov, part(dout, 1, 0), stats, part(dqkv, 3, 0), part(dqkv, 3, 1),
                                   part(dqkv, 3, 2));
    };
    const std::string shape = "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + " T" +
                              std::to_string(s.seq) + " D" + std::to_string(s.dim) + (s.causal ? " causal" : " full");
    const double flop = 4.0 * static_cast<double>(s.pairs()) * static_cast<double>(s.dim);
    namespace ca = ab::nn::cuda_attention;
    std::vector<float> first;
    for (const int variant : {0, 1, 2}) {  // own 4-warp, own 8-warp, cuDNN
      ca::variants() = {};
      ca::variants().implementation = variant == 2 ? ca::Implementation::cudnn : ca::Implementation::own;
      ca::variants().forward_eight_warps = variant == 1;
      const double ms = time_ms(forward, repetitions);
      const char* names[] = {"fwd_default", "fwd_8warps", "fwd_cudnn"};
      report(shape, names[variant], "forward", ms, flop, agreement(o, first));
    }
    ca::variants() = {};
    ca::variants().implementation = ca::Implementation::own;
    forward();
    first.clear();
    struct Variant {
      const char* name;
      bool deterministic;
      bool atomic_dq;
      int keys_per_block;
      ca::Implementation implementation;
    };
    for (const Variant& var : {Variant{"deterministic", true, false, 128, ca::Implementation::own},
                               Variant{"atomic_dq_k64", false, true, 64, ca::Implementation::own},
                               Variant{"atomic_dq_k128", false, true, 128, ca::Implementation::own},
                               Variant{"cudnn", false, false, 128, ca::Implementation::cudnn}}) {
      kernels_->set_deterministic(var.deterministic);
      ca::variants().atomic_dq = var.atomic_dq;
      ca::variants().backward_keys_per_block = var.keys_per_block;
      ca::variants().implementation = var.implementation;
      const double ms = time_ms(backward, repetitions);
      report(shape, var.name, "backward", ms, 2 * flop, agreement(dqkv, first));
    }
    kernels_->set_deterministic(false);
    ab::nn::cuda_attention::variants() = {};
  }

 private:
  Tensor make(Buffer& buf, DType t, const Shape& s) {
    const Tensor d = Tensor::describe(t, s, ab::Layout::nchw, ab::DeviceKind::cuda);
    buf = Buffer(kernels_->allocator(), d.size_bytes());
    return buf.view(d);
  }

  // Milliseconds per call over `repetitions` back-to-back calls, after a warm-up of 5.
  double time_ms(const std::function<void()>& call, int repetitions) {
    for (int i = 0; i < 5; ++i) call();
    cudaEvent_t start = nullptr, stop = nullptr;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    check(cudaEventRecord(start, stream_), "cudaEventRecord");
    for (int i = 0; i < repetitions; ++i) call();
    check(cudaEventRecord(stop, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return static_cast<double>(ms) / repetitions;
  }

  // max |t - first| / max |first| over bf16 tensor t's values (first: the pass's first variant's,
  // taken from t when empty): a variant that computes something else shows at once.
  double agreement(const Tensor& t, std::vector<float>& first) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(t.numel()));
    kernels_->download(t, bits.data());
    std::vector<float> got(bits.size());
    for (std::size_t n = 0; n < bits.size(); ++n) {
      const std::uint32_t b = std::uint32_t{bits[n]} << 16;
      std::memcpy(&got[n], &b, 4);
    }
    if (first.empty()) first = got;
    double worst = 0, scale = 0;
    for (std::size_t n = 0; n < got.size(); ++n) {
      worst = std::max(worst, std::isnan(got[n]) ? INFINITY : static_cast<double>(std::fabs(got[n] - first[n])));
      scale = std::max(scale, static_cast<double>(std::fabs(first[n])));
    }
    return worst / scale;
  }

  static void report(const std::string& shape, const char* variant, const char* pass, double ms, double flop,
                     double difference) {
    std::printf("%-28s %-15s %-9s %9.4f ms %8.1f TFLOP/s   %.2e\n", shape.c_str(), variant, pass, ms,
                flop / (ms * 1e-3) / 1e12, difference);
    std::fflush(stdout);
  }

  std::unique_ptr<ab::backend::Backend> backend_;
  std::unique_ptr<ab::nn::Kernels> kernels_;
  cudaStream_t stream_ = nullptr;
};

int run_bench(int repetitions) {
  if (ab::backend::cuda::device_count() == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 2;
  }
  Bench bench;
  std::printf("%-28s %-15s %-9s %12s %16s   %s\n", "shape (bf16)", "variant", "pass", "time", "counted rate",
              "max diff from the pass's first variant (of max |first|)");
  bench.run({16, 12, 1024, 64, true}, repetitions);  // GPT-2 124M, B=16
  bench.run({16, 6, 1024, 128, true}, repetitions);  // the same width at D=128
  bench.run({16, 12, 512, 64, false}, repetitions);  // non-causal (BERT-like)
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int repetitions = argc > 1 ? std::atoi(argv[1]) : 50;
    return run_bench(repetitions > 0 ? repetitions : 50);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 2;
  }
}
