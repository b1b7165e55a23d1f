// The CUDA attention family (nn/cuda/attention_engine.h) against the reference kernels in f64 on
// the same dtype-rounded random inputs, laid out as the Attention op reads them ([B, H, T, D]
// views into one fused QKV row buffer): o and the log-sum-exp statistics forward, dq, dk and dv
// backward, in bf16, f16 (the fused kernels at D 64 and 128, plain ones at other head dims) and
// f32 (plain kernels); causal, non-causal and padded (short key lengths, one sequence of none),
// sequence lengths off the 64-row tile; every variant of the fused kernels (deterministic mode's
// second dQ pass, the default's atomic dQ at 64 and 128 keys a block, both forward block shapes:
// attention_variants.h); bit-identical results run to run and from a captured CUDA graph in
// deterministic mode, and in the default mode everything but the atomic dq (which must stay
// within rounding); shapes the kernels refuse. Skips where no GPU answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "nn/cuda/attention_variants.h"
#include "nn/cuda/kernels.h"
#include "nn/kernels.h"
#include "nn/ref/ref_kernels.h"
#include "test_support.h"

namespace ab::nn {
namespace {

using std::int64_t;

bool has_gpu() { return backend::cuda::device_count() > 0; }

#define SKIP_WITHOUT_GPU() \
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)"

std::size_t sz(int64_t v) { return static_cast<std::size_t>(v); }

struct Case {
  DType dtype;
  int64_t batch, heads, seq, dim;
  bool causal;
  std::vector<std::int32_t> lengths;  // empty: no padding mask; 0: a sequence that sees no key
  std::string name() const {
    std::string n = std::string(to_string(dtype)) + " B" + std::to_string(batch) + " H" + std::to_string(heads) + " T" +
                    std::to_string(seq) + " D" + std::to_string(dim) + (causal ? " causal" : "");
    if (!lengths.empty()) {
      n += " lengths";
      for (const auto l : lengths) n += " " + std::to_string(l);
    }
    return n;
  }
};

// Relative to the largest reference value: the 16-bit P and dS the tensor cores multiply, the
// 16-bit o that Di is formed from, and each result's own rounding; f32 only the f32 arithmetic.
double tolerance(DType t) { return t == DType::bf16 ? 3e-2 : t == DType::f16 ? 1e-2 : 1e-4; }

// Part `part` (0 q, 1 k, 2 v) of rows [B*T, parts*H*D] laid out [B, T, parts, H, D], as [B, H, T, D]
// (the Attention op's view).
Tensor head_view(const Tensor& rows, int64_t parts, int64_t part, int64_t heads, int64_t seq) {
  const int64_t width = rows.shape[1] / parts, dim = width / heads, batch = rows.shape[0] / seq;
  Tensor v = Tensor::describe(rows.dtype, Shape{batch, heads, seq, dim}, Layout::nchw, rows.device);
  v.strides = {seq * parts * width, dim, parts * width, 1};
  v.data = static_cast<char*>(rows.data) + part * width * static_cast<int64_t>(size_bytes(rows.dtype));
  return v;
}

// One attention problem's tensors on one backend: qkv, o, dout, stats, dqkv, key lengths.
struct Side {
  Buffer qkv_buf, o_buf, dout_buf, stats_buf, dqkv_buf, lengths_buf;
  Tensor qkv, o, dout, stats, dqkv, lengths;
  Tensor part(const Tensor& rows, int64_t parts, int64_t i, const Case& c) const {
    return head_view(rows, parts, i, c.heads, c.seq);
  }
};

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    backend_ = backend::make_backend("cuda:0");
    cuda_ = make_cuda_kernels(*backend_);
    ref_ = make_ref_kernels();
  }
  // The variants are process-wide: every test leaves the defaults behind.
  void TearDown() override { cuda_attention::variants() = {}; }

  // The paths: the own kernels in deterministic mode (second dQ pass), in the default mode with
  // the atomic dQ at 64 or 128 keys a block, the last with the forward's 8-warp blocks; then
  // cuDNN's fused attention wherever it takes the shape (the own kernels elsewhere). Sets the
  // kernels to `path` and names it.
  static constexpr int kPaths = 5;
  std::string set_path(int path) {
    cuda_->set_deterministic(path == 0);
    auto& v = cuda_attention::variants();
    v.implementation = path == 4 ? cuda_attention::Implementation::cudnn : cuda_attention::Implementation::own;
    v.atomic_dq = path == 1 || path == 2 || path == 3;
    v.backward_keys_per_block = path == 1 ? 64 : 128;
    v.forward_eight_warps = path == 3;
    const char* names[] = {"deterministic mode", "atomic dq, 64 keys a block", "atomic dq, 128 keys a block",
                           "atomic dq, 128 keys a block, 8-warp forward", "cuDNN's fused attention"};
    return names[path];
  }

  Tensor make(Kernels& k, Buffer& buf, DType t, const Shape& s, DeviceKind dev) {
    const Tensor d = Tensor::describe(t, s, Layout::nchw, dev);
    buf = Buffer(k.allocator(), std::max<int64_t>(d.size_bytes(), 16));
    return buf.view(d);
  }

  // The GPU side holds values rounded to c.dtype; the reference side the same values in f64.
  void upload(const Tensor& dev, const Tensor& ref, const std::vector<double>& values) {
    std::vector<unsigned char> host(sz(dev.size_bytes()));
    const Tensor staging = Tensor::describe(dev.dtype, dev.shape).with_data(host.data());
    write_host(staging, values);
    cuda_->upload(dev, host.data());
    write_host(ref, read_host(staging));
  }

  std::vector<double> random(int64_t n, double lo, double hi) {
    std::vector<double> v(sz(n));
    for (auto& x : v) x = uniform(seed_, counter_++, lo, hi);
    return v;
  }

  void build(const Case& c) {
    const int64_t rows = c.batch * c.seq, width = c.heads * c.dim;
    const DeviceKind cu = DeviceKind::cuda, host = DeviceKind::host;
    gpu_.qkv = make(*cuda_, gpu_.qkv_buf, c.dtype, Shape{rows, 3 * width}, cu);
    gpu_.o = make(*cuda_, gpu_.o_buf, c.dtype, Shape{rows, width}, cu);
    gpu_.dout = make(*cuda_, gpu_.dout_buf, c.dtype, Shape{rows, width}, cu);
    gpu_.stats = make(*cuda_, gpu_.stats_buf, DType::f32, Shape{c.batch, c.heads, c.seq}, cu);
    gpu_.dqkv = make(*cuda_, gpu_.dqkv_buf, c.dtype, Shape{rows, 3 * width}, cu);
    ref_side_.qkv = make(*ref_, ref_side_.qkv_buf, DType::f64, Shape{rows, 3 * width}, host);
    ref_side_.o = make(*ref_, ref_side_.o_buf, DType::f64, Shape{rows, width}, host);
    ref_side_.dout = make(*ref_, ref_side_.dout_buf, DType::f64, Shape{rows, width}, host);
    ref_side_.stats = make(*ref_, ref_side_.stats_buf, DType::f64, Shape{c.batch, c.heads, c.seq}, host);
    ref_side_.dqkv = make(*ref_, ref_side_.dqkv_buf, DType::f64, Shape{rows, 3 * width}, host);
    // Scores of a few units: a peaked softmax whose running maximum moves between key blocks.
    upload(gpu_.qkv, ref_side_.qkv, random(rows * 3 * width, -2.0, 2.0));
    upload(gpu_.dout, ref_side_.dout, random(rows * width, -1.0, 1.0));
    gpu_.lengths = ref_side_.lengths = Tensor{};
    if (c.lengths.empty()) return;
    gpu_.lengths = make(*cuda_, gpu_.lengths_buf, DType::i32, Shape{c.batch}, cu);
    cuda_->upload(gpu_.lengths, c.lengths.data());
    // The reference refuses a sequence with no key: it computes length 1 there, which is not compared.
    ref_side_.lengths = make(*ref_, ref_side_.lengths_buf, DType::i32, Shape{c.batch}, host);
    for (int64_t b = 0; b < c.batch; ++b) ref_side_.lengths.as<std::int32_t>()[b] = std::max(c.lengths[sz(b)], 1);
  }

  static void run(Kernels& k, const Side& s, const Case& c) {
    const AttentionDesc d{.scale = 0.0, .causal = c.causal, .key_lengths = s.lengths};
    const Tensor q = s.part(s.qkv, 3, 0, c), kk = s.part(s.qkv, 3, 1, c), v = s.part(s.qkv, 3, 2, c);
    const Tensor o = s.part(s.o, 1, 0, c);
    k.attention_forward(d, q, kk, v, o, s.stats);
    k.attention_backward(d, q, kk, v, o, s.part(s.dout, 1, 0, c), s.stats, s.part(s.dqkv, 3, 0, c),
                         s.part(s.dqkv, 3, 1, c), s.part(s.dqkv, 3, 2, c));
  }

  // A device tensor's bytes on the host, and its logical values ([B, H, T, D] views read in order).
  std::vector<unsigned char> bytes(const Tensor& dev) {
    std::vector<unsigned char> host(sz(dev.size_bytes()));
    cuda_->download(dev, host.data());
    return host;
  }
  std::vector<double> values(const Tensor& view_of, const Tensor& whole, const std::vector<unsigned char>& host) {
    Tensor v = view_of;
    v.device = DeviceKind::host;
    v.data =
        const_cast<unsigned char*>(host.data()) + (static_cast<char*>(view_of.data) - static_cast<char*>(whole.data));
    return read_host(v);
  }

  // max |gpu - ref| <= tol * max |ref| over the sequences that see keys; the others must hold
  // `empty_value` exactly (o, dq, dk, dv: 0; stats: -inf).
  void expect_close(const Case& c, const std::string& what, const std::vector<double>& got,
                    const std::vector<double>& want, double tol, double empty_value) {
    ASSERT_EQ(got.size(), want.size()) << what;
    const std::size_t per_seq = got.size() / sz(c.batch);
    double scale = 0, worst = -1;
    std::size_t at = 0;
    for (std::size_t n = 0; n < got.size(); ++n) {
      const std::size_t b = n / per_seq;
      if (!c.lengths.empty() && c.lengths[b] == 0) {
        ASSERT_EQ(got[n], empty_value) << c.name() << " " << what << ": element " << n
                                       << " of a sequence with no key (seed " << seed_ << ")";
        continue;
      }
      scale = std::max(scale, std::abs(want[n]));
      const double err = std::isnan(got[n]) ? INFINITY : std::abs(got[n] - want[n]);
      if (err > worst) worst = err, at = n;
    }
    ASSERT_GT(scale, 0) << c.name() << " " << what << ": an all-zero reference checks nothing";
    EXPECT_LE(worst, tol * scale) << c.name() << " " << what << ": worst element " << at << " gpu " << got[at]
                                  << " ref " << want[at] << " (max |ref| " << scale << ", seed " << seed_ << ")";
  }

  // The reference once, then the GPU on the kernels' current settings or (every_path) on each
  // path in turn (set_path), its outputs first filled with a value no path leaves.
  void check_against_reference(const Case& c, bool every_path = false) {
    SCOPED_TRACE(c.name());
    build(c);
    run(*ref_, ref_side_, c);
    for (int path = 0; path < (every_path ? kPaths : 1); ++path) {
      SCOPED_TRACE(every_path ? set_path(path) : "the current settings");
      cuda_->fill(gpu_.o, 7.0);
      cuda_->fill(gpu_.dqkv, 7.0);
      cuda_->fill(gpu_.stats, 7.0);
      run(*cuda_, gpu_, c);
      cuda_->synchronize();
      compare(c);
    }
  }
  void compare(const Case& c) {
    const double tol = tolerance(c.dtype);
    const auto o = bytes(gpu_.o), stats = bytes(gpu_.stats), dqkv = bytes(gpu_.dqkv);
    expect_close(c, "o", values(gpu_.part(gpu_.o, 1, 0, c), gpu_.o, o), read_host(ref_side_.part(ref_side_.o, 1, 0, c)),
                 tol, 0.0);
    // The statistics come from the same rounded inputs in f32: much closer than the outputs.
    expect_close(c, "stats", values(gpu_.stats, gpu_.stats, stats), read_host(ref_side_.stats),
                 c.dtype == DType::f32 ? 1e-5 : 1e-3, -INFINITY);
    const char* names[] = {"dq", "dk", "dv"};
    for (int64_t i = 0; i < 3; ++i)
      expect_close(c, names[i], values(gpu_.part(gpu_.dqkv, 3, i, c), gpu_.dqkv, dqkv),
                   read_host(ref_side_.part(ref_side_.dqkv, 3, i, c)), tol, 0.0);
  }

  void fused_cases(DType t);
  // The output bytes (o, stats, dqkv) of three runs of case c: two direct, then a captured graph's replay.
  std::vector<std::vector<std::vector<unsigned char>>> three_runs(const Case& c);

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<Kernels> cuda_, ref_;
  Side gpu_, ref_side_;
  std::uint64_t seed_ = test::seed();
  std::uint64_t counter_ = 0;
};

// The fused kernels' cases for one 16-bit type: T off the 64-row tile, one block and several,
// padding with a sequence of one key and one of none, causal with and without padding. (Sizes
// kept small: the f64 reference takes about a second per 5M query-key-dim products.) Each on
// every path of the kernels (set_path).
void CudaAttention::fused_cases(DType t) {
  for (const int64_t dim : {64, 128}) {
    check_against_reference({t, 1, 2, 77, dim, /*causal=*/true, {}}, true);
    check_against_reference({t, 1, 1, 150, dim, /*causal=*/false, {}}, true);
    check_against_reference({t, 3, 1, 130, dim, /*causal=*/false, {130, 70, 0}}, true);
    check_against_reference({t, 3, 1, 130, dim, /*causal=*/true, {1, 0, 129}}, true);
  }
}

TEST_F(CudaAttention, FusedBf16MatchesTheReference) { fused_cases(DType::bf16); }
TEST_F(CudaAttention, FusedF16MatchesTheReference) { fused_cases(DType::f16); }

TEST_F(CudaAttention, PlainKernelsMatchTheReference) {
  // f32 at the fused kernels' head dims, and 16-bit types at head dims they do not take (cuDNN
  // takes those: the own kernels are asked for).
  cuda_attention::variants().implementation = cuda_attention::Implementation::own;
  for (const int64_t dim : {64, 128}) {
    check_against_reference({DType::f32, 2, 2, 77, dim, /*causal=*/true, {}});
    check_against_reference({DType::f32, 3, 1, 130, dim, /*causal=*/false, {130, 9, 0}});
  }
  check_against_reference({DType::bf16, 2, 2, 77, 40, /*causal=*/true, {}});
  check_against_reference({DType::f16, 3, 2, 70, 32, /*causal=*/false, {70, 64, 0}});
  check_against_reference({DType::f32, 1, 3, 33, 200, /*causal=*/true, {}});
}

TEST_F(CudaAttention, CudnnTakesHeadDimsTheOwnFusedKernelsDoNot) {
  cuda_attention::variants().implementation = cuda_attention::Implementation::cudnn;
  check_against_reference({DType::bf16, 2, 2, 77, 40, /*causal=*/true, {}});
  check_against_reference({DType::f16, 2, 2, 70, 32, /*causal=*/false, {}});
}

TEST_F(CudaAttention, LongCausalSequenceWalksManyBlocks) {
  check_against_reference({DType::bf16, 1, 2, 321, 64, /*causal=*/true, {}}, true);
}

std::vector<std::vector<std::vector<unsigned char>>> CudaAttention::three_runs(const Case& c) {
  build(c);
  std::vector<std::vector<std::vector<unsigned char>>> passes;
  for (int pass = 0; pass < 3; ++pass) {
    cuda_->fill(gpu_.o, 7.0);
    cuda_->fill(gpu_.dqkv, 7.0);
    cuda_->fill(gpu_.stats, 7.0);
    if (pass < 2) {
      run(*cuda_, gpu_, c);
    } else {
      const auto graph = cuda_->capture([&] { run(*cuda_, gpu_, c); });
      graph->replay();
    }
    cuda_->synchronize();
    passes.push_back({bytes(gpu_.o), bytes(gpu_.stats), bytes(gpu_.dqkv)});
  }
  return passes;
}

const Case kRepeatCases[] = {Case{DType::bf16, 2, 3, 200, 64, true, {}},
                             Case{DType::f16, 2, 2, 150, 128, false, {150, 0}},
                             Case{DType::f32, 2, 2, 77, 64, true, {}}};

// In deterministic mode two runs, and a replay of a captured graph of the same calls, leave
// identical bits.
TEST_F(CudaAttention, ResultsAreBitIdenticalRunToRunAndCapturedInDeterministicMode) {
  cuda_->set_deterministic(true);
  for (const Case& c : kRepeatCases) {
    SCOPED_TRACE(c.name());
    const auto passes = three_runs(c);
    for (std::size_t pass = 1; pass < passes.size(); ++pass)
      for (std::size_t n = 0; n < passes[pass].size(); ++n)
        EXPECT_TRUE(passes[pass][n] == passes[0][n])
            << "output " << n << " (o, stats, dqkv) differs in pass " << pass << (pass == 2 ? " (graph replay)" : "");
  }
}

// In the default mode only dq's atomic sums may differ (in their last bits): o, the statistics,
// dk and dv are bit-identical run to run and captured, and dq agrees within its 16-bit rounding
// of an f32 sum taken in another order (the reference comparisons bound its error).
TEST_F(CudaAttention, OnlyTheAtomicDqVariesRunToRunInTheDefaultMode) {
  for (int path = 1; path < kPaths; ++path)
    for (const Case& c : kRepeatCases) {
      SCOPED_TRACE(set_path(path) + ", " + c.name());
      const auto passes = three_runs(c);
      const std::vector<double> dq0 = values(gpu_.part(gpu_.dqkv, 3, 0, c), gpu_.dqkv, passes[0][2]);
      double dq_scale = 0;
      for (const double x : dq0) dq_scale = std::max(dq_scale, std::abs(x));
      ASSERT_GT(dq_scale, 0) << "dq all zero";
      for (std::size_t pass = 1; pass < passes.size(); ++pass) {
        const char* where = pass == 2 ? " (graph replay)" : "";
        EXPECT_TRUE(passes[pass][0] == passes[0][0]) << "o differs in pass " << pass << where;
        EXPECT_TRUE(passes[pass][1] == passes[0][1]) << "stats differ in pass " << pass << where;
        for (const int64_t part : {1, 2})
          EXPECT_TRUE(values(gpu_.part(gpu_.dqkv, 3, part, c), gpu_.dqkv, passes[pass][2]) ==
                      values(gpu_.part(gpu_.dqkv, 3, part, c), gpu_.dqkv, passes[0][2]))
              << (part == 1 ? "dk" : "dv") << " differs in pass " << pass << where;
        const std::vector<double> dq = values(gpu_.part(gpu_.dqkv, 3, 0, c), gpu_.dqkv, passes[pass][2]);
        double worst = 0;
        for (std::size_t n = 0; n < dq.size(); ++n) worst = std::max(worst, std::abs(dq[n] - dq0[n]));
        // Two roundings of the same f32 sum to 16 bits: a few units of the last place of the largest.
        EXPECT_LE(worst, (c.dtype == DType::f16 ? 4e-3 : 2e-2) * dq_scale) << "dq in pass " << pass << where;
      }
    }
}

TEST_F(CudaAttention, RefusesWhatTheKernelsDoNotTake) {
  const Case c{DType::bf16, 1, 1, 16, 64, false, {}};
  build(c);
  const Tensor q = gpu_.part(gpu_.qkv, 3, 0, c), o = gpu_.part(gpu_.o, 1, 0, c);
  Tensor wide = Tensor::describe(DType::bf16, Shape{1, 1, 4, 512}, Layout::nchw, DeviceKind::cuda);
  wide.data = gpu_.qkv.data;
  Tensor wide_stats = gpu_.stats;
  wide_stats.shape = Shape{1, 1, 4};
  wide_stats.strides = Shape{4, 4, 1};
  const std::string dim =
      test::error_message<Unsupported>([&] { cuda_->attention_forward({}, wide, wide, wide, wide, wide_stats); });
  EXPECT_NE(dim.find("head dim 512"), std::string::npos) << dim;
  Tensor f16_stats = gpu_.stats;
  f16_stats.dtype = DType::f16;
  const std::string stats =
      test::error_message<Unsupported>([&] { cuda_->attention_forward({}, q, q, q, o, f16_stats); });
  EXPECT_NE(stats.find("f32 stats"), std::string::npos) << stats;
  Tensor short_k = gpu_.part(gpu_.qkv, 3, 1, c);
  short_k.shape = Shape{1, 1, 8, 64};
  const std::string causal = test::error_message<Unsupported>(
      [&] { cuda_->attention_forward({.causal = true}, q, short_k, short_k, o, gpu_.stats); });
  EXPECT_NE(causal.find("as many queries as keys"), std::string::npos) << causal;
}

}  // namespace
}  // namespace ab::nn
