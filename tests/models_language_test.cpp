// GPT-2 and BERT as built by models/gpt and models/bert: parameter counts as Hugging Face and
// llm.c count them (tied embeddings counted once), FLOPs from the ops' shapes against the closed
// form, the tied gradient against finite differences of the loss, tiny models that learn their
// copy tasks on the reference kernels with AdamW, determinism, and bad configurations refused
// before building.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "models/bert.h"
#include "models/gpt.h"
#include "nn/graph.h"
#include "nn/kernels.h"
#include "nn/optim.h"
#include "test_support.h"

namespace ab::models {
namespace {

nn::Graph plan(const GptConfig& c, std::int64_t batch, std::int64_t seq, nn::GraphOptions o = {}) {
  nn::GraphBuilder b(o);
  build_gpt(b, c, batch, seq);
  return nn::Graph(std::move(b));
}

TEST(Gpt, ParameterCountsAreHuggingFaces) {
  // GPT2LMHeadModel's num_parameters() for gpt2, gpt2-medium, gpt2-large, gpt2-xl.
  EXPECT_EQ(plan(gpt2_124m(), 1, 8).parameter_count(), 124'439'808);
  EXPECT_EQ(plan(gpt2_350m(), 1, 8).parameter_count(), 354'823'168);
  EXPECT_EQ(plan(gpt2_774m(), 1, 8).parameter_count(), 774'030'080);
  EXPECT_EQ(plan(gpt2_1558m(), 1, 8).parameter_count(), 1'557'611'200);
}

TEST(Gpt, ForwardFlopsAreTheMatmulsAndAttentionOfTheShapes) {
  const GptConfig c = gpt2_124m();
  const double batch = 2, seq = 256, tokens = batch * seq, C = static_cast<double>(c.channels);
  const auto layers = static_cast<double>(c.layers), vocab = static_cast<double>(c.vocab);
  const nn::Graph g = plan(c, 2, 256);
  // Per token and layer: qkv 3C^2, proj C^2, mlp 8C^2 multiply-adds; the classifier V x C; causal
  // attention's q k^T and p v over the T(T+1)/2 visible pairs of each head (head_dim x heads = C).
  const double matmul = 2.0 * tokens * (layers * 12.0 * C * C + vocab * C);
  const double attention = 4.0 * batch * layers * (seq * (seq + 1) / 2.0) * C;
  const auto fwd = static_cast<double>(g.forward_flops());
  EXPECT_GE(fwd, matmul + attention);
  EXPECT_LT(fwd, 1.01 * (matmul + attention)) << "elementwise work should be well under 1% of GPT-2's FLOPs";
  // Backward: every matmul twice (the first layer's input, the tokens, takes no gradient).
  EXPECT_GT(static_cast<double>(g.backward_flops()), 1.95 * (matmul + attention));
}

TEST(Gpt, BadConfigurationsAreRefusedWithTheReason) {
  EXPECT_NE(test::usage_error([] { plan(tiny_gpt2(), 1, 65); }).find("longer than its 64 positions"),
            std::string::npos);
  GptConfig odd = tiny_gpt2();
  odd.heads = 3;
  EXPECT_NE(test::usage_error([&] { plan(odd, 1, 8); }).find("3 heads do not divide the width 64"), std::string::npos);
  GptConfig huge = tiny_gpt2();
  huge.vocab = std::int64_t{1} << 32;
  EXPECT_NE(test::usage_error([&] { plan(huge, 1, 8); }).find("does not fit i32 tokens"), std::string::npos);
}

TEST(Gpt, CopyTaskRepeatsTheFirstHalfAndLabelsTheNextToken) {
  const TokenBatch b = copy_task_batch(7, 3, 2, 9, 50);
  ASSERT_EQ(b.tokens.size(), 18u);
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 9; ++t) {
      const double tok = b.tokens[static_cast<std::size_t>(s * 9 + t)];
      EXPECT_GE(tok, 0);
      EXPECT_LT(tok, 50);
      if (t >= 5) {
        EXPECT_EQ(tok, b.tokens[static_cast<std::size_t>(s * 9 + t - 5)]);
      }
      EXPECT_EQ(b.labels[static_cast<std::size_t>(s * 9 + t)],
                t < 8 ? b.tokens[static_cast<std::size_t>(s * 9 + t + 1)] : -1);
    }
  EXPECT_EQ(copy_task_batch(7, 4, 1, 9, 50).tokens, std::vector<double>(b.tokens.begin() + 9, b.tokens.end()))
      << "a sample depends on its index, not on the batch holding it";
}

// A tiny GPT bound to the reference kernels in f64 with the copy task uploaded.
struct TinyGpt {
  std::unique_ptr<nn::Kernels> kernels = nn::make_ref_kernels();
  LanguageModel m;
  nn::Graph g;
  explicit TinyGpt(std::uint64_t seed, std::int64_t batch = 2, std::int64_t seq = 12, GptConfig c = tiny_gpt2(),
                   std::int64_t micro_batches = 1)
      : g(build(seed, batch, seq, c, micro_batches)) {
    g.bind(*kernels);
    set_batch(seed, 0, batch, seq, c.vocab);
  }
  // The copy task's samples first..first+batch-1.
  void set_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t seq, std::int64_t vocab) {
    const TokenBatch data = copy_task_batch(seed, first, batch, seq, vocab);
    g.set_input(m.tokens, data.tokens);
    g.set_input(m.labels, data.labels);
  }
  nn::Graph build(std::uint64_t seed, std::int64_t batch, std::int64_t seq, const GptConfig& c,
                  std::int64_t micro_batches) {
    nn::GraphOptions o;
    o.dtype = DType::f64;
    o.seed = seed;
    o.micro_batches = micro_batches;
    nn::GraphBuilder b(o);
    m = build_gpt(b, c, batch, seq);
    return nn::Graph(std::move(b));
  }
  double loss() {
    g.forward();
    return g.read(m.loss)[0];
  }
};

TEST(Gpt, TiedEmbeddingGradientIsTheSumOfBothUsesByFiniteDifferences) {
  GptConfig c = tiny_gpt2();
  c.channels = 16;
  c.heads = 2;
  c.vocab = 131;  // the classifier's GEMMs split 128 + 3
  TinyGpt t(test::seed(), 2, 6, c);
  for (const nn::Parameter& p : t.g.parameters()) EXPECT_NE(p.name, "lm_head.weight") << "tied: no storage of its own";
  t.g.forward();
  t.g.backward();
  nn::ParameterValues values = t.g.parameter_values();
  Tensor grad;
  for (const nn::Parameter& p : t.g.parameters())
    if (p.name == "embed.wte") grad = p.grad;
  const std::vector<double> analytic = t.g.read(grad);
  // Rows of tokens that occur (embedding and classifier both contribute) and of one that may not.
  const double h = 1e-6;
  for (std::size_t i : {0u, 17u, 40u, 100u, 170u, 128u * 16 + 5, 130u * 16 + 15}) {
    nn::ParameterValues plus = values, minus = values;
    plus["embed.wte"][i] += h;
    minus["embed.wte"][i] -= h;
    t.g.set_parameter_values(plus);
    const double lp = t.loss();
    t.g.set_parameter_values(minus);
    const double lm = t.loss();
    EXPECT_NEAR(analytic[i], (lp - lm) / (2 * h), 1e-6 * std::max(1.0, std::abs(analytic[i]))) << "element " << i;
  }
}

// Gradient accumulation: two micro-batches of 3 sequences give every parameter the gradient one
// batch of the same 6 gives (the mean over equal halves is the whole batch's mean), tied
// embedding included, and a second step starts again from zero rather than adding to the first.
TEST(Gpt, AccumulatedMicroBatchesGiveTheWholeBatchsGradient) {
  const std::uint64_t seed = test::seed();
  const GptConfig c = tiny_gpt2();
  const std::int64_t seq = 10;
  TinyGpt whole(seed, 6, seq, c);
  whole.g.forward();
  whole.g.backward();
  TinyGpt halves(seed, 3, seq, c, /*micro_batches=*/2);
  for (int step = 0; step < 2; ++step)
    for (std::int64_t m = 0; m < 2; ++m) {
      halves.set_batch(seed, static_cast<std::uint64_t>(3 * m), 3, seq, c.vocab);
      halves.g.forward();
      halves.g.backward(m);
    }
  EXPECT_THROW(halves.g.backward(2), Error) << "only micro-batches 0 and 1 exist";
  ASSERT_EQ(whole.g.parameters().size(), halves.g.parameters().size());
  for (std::size_t i = 0; i < whole.g.parameters().size(); ++i) {
    const nn::Parameter& p = whole.g.parameters()[i];
    const std::vector<double> want = whole.g.read(p.grad), got = halves.g.read(halves.g.parameters()[i].grad);
    double scale = 0, worst = 0;
    for (std::size_t n = 0; n < want.size(); ++n) {
      scale = std::max(scale, std::abs(want[n]));
      worst = std::max(worst, std::abs(got[n] - want[n]));
    }
    ASSERT_GT(scale, 0) << p.name << ": an all-zero gradient checks nothing";
    EXPECT_LE(worst, 1e-12 * scale) << p.name << " (max |grad| " << scale << ")";
  }
}

std::vector<double> train_losses(std::uint64_t seed, int steps) {
  TinyGpt t(seed, 4, 16);
  nn::AdamW opt(1e-2, 0.9, 0.95, 1e-8, 0.0, 1.0);
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    losses.push_back(t.loss());
    t.g.backward();
    t.g.update(opt);
  }
  EXPECT_EQ(opt.steps_taken(*t.kernels), steps);
  return losses;
}

TEST(Learnability, TinyGptLearnsTheCopyTaskWithAdamW) {
  const std::uint64_t seed = test::seed();
  const std::vector<double> losses = train_losses(seed, 60);
  // Untrained, each of the vocabulary's 64 tokens is about equally likely: ln 64 = 4.16. Half the
  // positions repeat the first half, which attention can learn; the others stay random.
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.3);
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
  EXPECT_EQ(train_losses(seed, 5), std::vector<double>(losses.begin(), losses.begin() + 5))
      << "the reference is deterministic: the same losses twice";
}

nn::Graph plan_bert(const BertConfig& c, std::int64_t batch, std::int64_t seq) {
  nn::GraphBuilder b;
  build_bert(b, c, batch, seq);
  return nn::Graph(std::move(b));
}

TEST(Bert, ParameterCountsAreHuggingFacesLessTheSegmentEmbeddings) {
  // BertForMaskedLM's num_parameters() for bert-base-uncased and bert-large-uncased, less the
  // token-type table (2 x channels) the benchmark does not build.
  EXPECT_EQ(plan_bert(bert_base(), 1, 8).parameter_count(), 109'514'298 - 2 * 768);
  EXPECT_EQ(plan_bert(bert_large(), 1, 8).parameter_count(), 335'174'458 - 2 * 1024);
  EXPECT_NE(test::usage_error([] { plan_bert(bert_base(), 1, 513); }).find("longer than its 512 positions"),
            std::string::npos);
}

TEST(Bert, MaskedCopyTaskScoresOnlyTheMaskedPositions) {
  const TokenBatch plain = copy_task_batch(5, 0, 4, 64, 50), b = masked_copy_batch(5, 0, 4, 64, 50, 49);
  int masked = 0;
  for (std::size_t i = 0; i < b.tokens.size(); ++i) {
    if (b.labels[i] < 0) {
      EXPECT_EQ(b.tokens[i], plain.tokens[i]) << i;
      continue;
    }
    ++masked;
    EXPECT_EQ(b.tokens[i], 49) << i;
    EXPECT_EQ(b.labels[i], plain.tokens[i]) << i;
  }
  EXPECT_GT(masked, 20);  // about 15% of 256
  EXPECT_LT(masked, 60);
}

TEST(Learnability, TinyBertLearnsTheMaskedCopyTaskWithAdamW) {
  auto kernels = nn::make_ref_kernels();  // outlives the graph, whose memory it holds
  nn::GraphOptions o;
  o.dtype = DType::f64;
  o.seed = test::seed();
  nn::GraphBuilder b(o);
  const BertConfig c = tiny_bert();
  const LanguageModel m = build_bert(b, c, 8, 16);
  nn::Graph g(std::move(b));
  g.bind(*kernels);
  const TokenBatch data = masked_copy_batch(o.seed, 0, 8, 16, c.vocab, c.vocab - 1);
  g.set_input(m.tokens, data.tokens);
  g.set_input(m.labels, data.labels);
  nn::AdamW opt(1e-2, 0.9, 0.95, 1e-8, 0.0, 1.0);
  std::vector<double> losses;
  for (int i = 0; i < 60; ++i) {
    g.forward();
    losses.push_back(g.read(m.loss)[0]);
    g.backward();
    g.update(opt);
  }
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.5);
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
}

}  // namespace
}  // namespace ab::models
