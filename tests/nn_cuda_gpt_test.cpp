// A small GPT (2 layers, 128 channels in 2 heads of 64, a 300-token vocabulary padded to 384,
// sequences of 80 tokens: off every tile) on the GPU against the same graph on the reference
// kernels in f64: the loss, every parameter's gradient (the tied embedding's included) and the
// parameters after one AdamW step, in f32 and bf16; the captured step against the eager one;
// deterministic mode bit-identical twice; and the inference heads (GPT's prefill logits, a small
// BERT's question-answering logits) in inference graphs against the reference, captured replay
// bit-identical to the eager forward. Skips where no GPU answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "models/bert.h"
#include "models/gpt.h"
#include "nn/cuda/device_kernels.h"
#include "nn/graph.h"
#include "nn/optim.h"
#include "test_support.h"

namespace ab::models {
namespace {

bool has_gpu() { return backend::cuda::device_count() > 0; }

GptConfig small_gpt() {
  return {.name = "small_gpt", .layers = 2, .heads = 2, .channels = 128, .vocab = 300, .positions = 128};
}
constexpr std::int64_t kBatch = 2, kSeq = 80;

// One graph of small_gpt bound to `k`, the copy task uploaded.
struct Bound {
  LanguageModel m;
  nn::Graph g;
  Bound(nn::Kernels& k, nn::GraphOptions o) : g(build(o)) {
    g.bind(k);
    const TokenBatch data = copy_task_batch(o.seed, 0, kBatch, kSeq, small_gpt().vocab);
    g.set_input(m.tokens, data.tokens);
    g.set_input(m.labels, data.labels);
  }
  nn::Graph build(const nn::GraphOptions& o) {
    nn::GraphBuilder b(o);
    m = build_gpt(b, small_gpt(), kBatch, kSeq);
    return nn::Graph(std::move(b));
  }
  double step_loss() {
    g.forward();
    const double loss = g.read(m.loss)[0];
    g.backward();
    return loss;
  }
  std::vector<double> grad(const std::string& name) {
    for (const nn::Parameter& p : g.parameters())
      if (p.name == name) return g.read(p.grad);
    ADD_FAILURE() << "no parameter " << name;
    return {};
  }
};

// max |got - want| <= tol * max |want|, naming the worst element.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, worst = -1;
  std::size_t at = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]);
    if (e > worst) worst = e, at = i;
  }
  EXPECT_GT(scale, 0) << what << ": an all-zero reference checks nothing";
  EXPECT_LE(worst, tol * scale) << what << ": element " << at << " gpu " << got[at] << " ref " << want[at]
                                << " (max |ref| " << scale << ")";
}

class CudaGpt : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
    backend_ = backend::make_backend("cuda:0");
    cuda_ = nn::make_device_kernels(*backend_);
    ref_ = nn::make_ref_kernels();
  }
  nn::GraphOptions options(Precision p) const {
    nn::GraphOptions o;
    o.precision = p;
    o.seed = seed_;
    return o;
  }
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<nn::Kernels> cuda_, ref_;
  std::uint64_t seed_ = test::seed();
};

TEST_F(CudaGpt, LossGradientsAndAnAdamWStepMatchTheReference) {
  nn::GraphOptions ro = options(Precision::fp32);
  ro.dtype = DType::f64;
  Bound ref(*ref_, ro);
  const double want_loss = ref.step_loss();
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(std::string(to_string(p)));
    // f32: TF32 off, only the summation order differs; bf16: activations rounded at every op.
    const double tol = p == Precision::fp32 ? 2e-3 : 6e-2;
    Bound gpu(*cuda_, options(p));
    EXPECT_NEAR(gpu.step_loss(), want_loss, (p == Precision::fp32 ? 1e-4 : 2e-2) * want_loss);
    for (const nn::Parameter& param : ref.g.parameters())
      expect_close(gpu.grad(param.name), ref.grad(param.name), tol, param.name);
    // Adam's first step moves every parameter by about lr * sign(g): where a gradient is near 0,
    // bf16's rounding may flip its sign, so the step is compared against the reference in f32 and
    // bounded by the learning rate (plus decay) in bf16.
    constexpr double lr = 1e-3, decay = 0.1;
    nn::AdamW ref_opt(lr, 0.9, 0.95, 1e-8, decay, 1.0), gpu_opt(lr, 0.9, 0.95, 1e-8, decay, 1.0);
    const nn::ParameterValues before = gpu.g.parameter_values();
    gpu.g.update(gpu_opt);
    const nn::ParameterValues got = gpu.g.parameter_values();
    if (p == Precision::fp32) {
      Bound ref_step(*ref_, ro);
      ref_step.step_loss();
      ref_step.g.update(ref_opt);
      for (const auto& [name, values] : ref_step.g.parameter_values())
        expect_close(got.at(name), values, 1e-2, name + " after one AdamW step");
    }
    for (const auto& [name, values] : before) {
      double moved = 0;
      for (std::size_t i = 0; i < values.size(); ++i) moved = std::max(moved, std::abs(got.at(name)[i] - values[i]));
      EXPECT_GT(moved, 0.5 * lr) << name << " did not move";
      EXPECT_LE(moved, lr * 1.001 + lr * decay * 0.2) << name << ": Adam's first step is at most lr per element";
    }
  }
}

TEST_F(CudaGpt, CapturedStepMatchesEagerAndDeterministicModeRepeatsBitForBit) {
  nn::GraphOptions o = options(Precision::bf16);
  o.deterministic = true;
  const auto run = [&](bool captured) {
    Bound b(*cuda_, o);
    nn::AdamW opt(1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0);
    std::vector<double> losses;
    std::unique_ptr<nn::Replayable> step;
    if (captured) step = b.g.capture_step(&opt);
    for (int i = 0; i < 3; ++i) {
      if (captured) {
        step->replay();
      } else {
        b.g.forward();
        b.g.backward();
        b.g.update(opt);
      }
      losses.push_back(b.g.read(b.m.loss)[0]);
    }
    EXPECT_EQ(opt.steps_taken(*cuda_), 3);
    return std::pair{losses, b.g.parameter_values()};
  };
  const auto eager = run(false), again = run(false), captured = run(true);
  EXPECT_EQ(eager.first, again.first) << "deterministic mode: the same losses twice";
  EXPECT_EQ(eager.second, again.second) << "deterministic mode: the same parameters twice";
  EXPECT_EQ(eager.first, captured.first) << "the captured step computes what the eager one does";
  EXPECT_EQ(eager.second, captured.second);
  EXPECT_LT(eager.first.back(), eager.first.front()) << "three AdamW steps on one batch lower its loss";
}

// An inference graph of small_gpt's prefill head or a BERT of the same size's question-answering
// head on `k`, sample data uploaded, run once eagerly: its logits, and those of a captured replay.
struct InferenceLogits {
  std::vector<double> eager, replayed;
};
InferenceLogits inference_logits(nn::Kernels& k, nn::GraphOptions o, bool bert) {
  o.training = false;
  nn::GraphBuilder b(o);
  const GptConfig c = small_gpt();
  const BertConfig bc{.name = "small_bert", .layers = 2, .heads = 2, .channels = 128, .vocab = 300, .positions = 128};
  const LanguageModel m =
      bert ? build_bert(b, bc, kBatch, kSeq, BertHead::qa) : build_gpt(b, c, kBatch, kSeq, GptHead::prefill);
  nn::Graph g(std::move(b));
  g.bind(k);
  g.set_input(m.tokens, copy_task_batch(o.seed, 0, kBatch, kSeq, c.vocab).tokens);
  g.forward(false);
  InferenceLogits out{g.read(m.logits), {}};
  const std::unique_ptr<nn::Replayable> step = g.capture_step(nullptr);
  step->replay();
  out.replayed = g.read(m.logits);
  return out;
}

TEST_F(CudaGpt, InferenceHeadsMatchTheReferenceAndReplayBitForBit) {
  for (const bool bert : {false, true}) {
    SCOPED_TRACE(bert ? "BERT question answering [B*T, 2]" : "GPT prefill [B, V], V = 256 + 44");
    nn::GraphOptions ro = options(Precision::fp32);
    ro.dtype = DType::f64;
    const std::vector<double> want = inference_logits(*ref_, ro, bert).eager;
    ASSERT_EQ(want.size(), static_cast<std::size_t>(bert ? kBatch * kSeq * 2 : kBatch * small_gpt().vocab));
    for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
      SCOPED_TRACE(std::string(to_string(p)));
      const InferenceLogits got = inference_logits(*cuda_, options(p), bert);
      expect_close(got.eager, want, p == Precision::fp32 ? 2e-3 : p == Precision::fp16 ? 1e-2 : 6e-2, "logits");
      EXPECT_EQ(got.replayed, got.eager) << "the captured forward computes what the eager one does";
    }
  }
}

}  // namespace
}  // namespace ab::models
