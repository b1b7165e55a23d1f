// GPT-2 and BERT as built by models/gpt and models/bert: parameter counts as Hugging Face and
// llm.c count them (tied embeddings counted once), FLOPs from the ops' shapes against the closed
// form, the tied gradient against finite differences of the loss, tiny models that learn their
// copy tasks on the reference kernels with AdamW, determinism, bad configurations refused
// before building, and the inference heads (GPT-2's prefill against its loss head, BERT's
// question answering) in graphs that hold no gradient and keep nothing for a backward.
#include <algorithm>
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
#include "nn/ops.h"
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

// Hidden dropout: three ops per block and one after the embeddings; a training forward's loss
// changes from step to step (a new mask each time) while an inference forward is the model
// without dropout; and the copy task is still learnt.
TEST(Learnability, TinyGptWithDropoutDrawsNewMasksAndStillLearns) {
  const std::uint64_t seed = test::seed();
  GptConfig c = tiny_gpt2();
  c.dropout = 0.1;
  TinyGpt dropped(seed, 4, 16, c), plain(seed, 4, 16);
  std::int64_t dropout_ops = 0;
  for (const auto& op : dropped.g.report()) dropout_ops += op.kind == "dropout" ? 1 : 0;
  EXPECT_EQ(dropout_ops, 1 + 2 * c.layers);
  dropped.g.forward(false);
  plain.g.forward(false);
  EXPECT_EQ(dropped.g.read(dropped.m.loss), plain.g.read(plain.m.loss)) << "inference: dropout is the identity";
  EXPECT_NE(dropped.loss(), dropped.loss()) << "two training forwards drew the same mask";
  nn::AdamW opt(1e-2, 0.9, 0.95, 1e-8, 0.0, 1.0);
  std::vector<double> losses;
  for (int i = 0; i < 60; ++i) {
    losses.push_back(dropped.loss());
    dropped.g.backward();
    dropped.g.update(opt);
  }
  EXPECT_LT(losses.back(), 0.85 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
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

// ---- inference heads

nn::GraphOptions inference_options(std::uint64_t seed = 1, DType dtype = DType::f32) {
  nn::GraphOptions o;
  o.dtype = dtype;
  o.seed = seed;
  o.training = false;
  return o;
}

TEST(Gpt, PrefillHeadKeepsTheParametersAndCountsTheLastPositionsClassifier) {
  const GptConfig c = gpt2_124m();
  nn::GraphBuilder b(inference_options());
  const LanguageModel m = build_gpt(b, c, 2, 256, GptHead::prefill);
  EXPECT_LT(m.labels.id, 0);
  EXPECT_LT(m.loss.id, 0);
  EXPECT_EQ(b.desc(m.logits).shape, (Shape{2, c.vocab}));
  const nn::Graph g(std::move(b));
  EXPECT_EQ(g.parameter_count(), 124'439'808) << "the head is tied to the token embedding";
  EXPECT_EQ(g.backward_flops(), 0);
  // The stack over every token as in training, the classifier over each sequence's last one.
  const double tokens = 2 * 256, C = static_cast<double>(c.channels), layers = static_cast<double>(c.layers);
  const double stack = 2.0 * tokens * layers * 12.0 * C * C + 4.0 * 2 * layers * (256 * 257 / 2.0) * C;
  const double head = 2.0 * 2 * static_cast<double>(c.vocab) * C;
  const auto fwd = static_cast<double>(g.forward_flops());
  EXPECT_GE(fwd, stack + head);
  EXPECT_LT(fwd, 1.01 * (stack + head));
  EXPECT_EQ(g.op(g.op_count() - 1).flops(nn::Pass::forward), static_cast<std::int64_t>(head));
}

// The prefill logits are what the loss head scores: with only each sequence's last position
// labelled L, the loss graph's mean cross-entropy is the mean of logsumexp(z) - z[L] over the
// sequences' prefill logits z (same seed, same parameter names, f64 on the reference).
TEST(Gpt, PrefillLogitsAreTheLossHeadsLogitsOfTheLastPosition) {
  GptConfig c = tiny_gpt2();
  c.vocab = 131;  // the classifier's GEMMs split 128 + 3
  const std::int64_t batch = 2, seq = 9;
  const std::uint64_t seed = test::seed();
  auto kernels = nn::make_ref_kernels();
  const TokenBatch data = copy_task_batch(seed, 0, batch, seq, c.vocab);
  nn::GraphBuilder pb(inference_options(seed, DType::f64));
  const LanguageModel pm = build_gpt(pb, c, batch, seq, GptHead::prefill);
  nn::Graph prefill(std::move(pb));
  prefill.bind(*kernels);
  prefill.set_input(pm.tokens, data.tokens);
  prefill.forward(false);
  const std::vector<double> logits = prefill.read(pm.logits);
  ASSERT_EQ(logits.size(), static_cast<std::size_t>(batch * c.vocab));

  nn::GraphBuilder lb(inference_options(seed, DType::f64));
  const LanguageModel lm = build_gpt(lb, c, batch, seq);
  nn::Graph loss(std::move(lb));
  loss.bind(*kernels);
  loss.set_input(lm.tokens, data.tokens);
  for (const std::int64_t label : {std::int64_t{0}, std::int64_t{77}, c.vocab - 1}) {
    std::vector<double> labels(static_cast<std::size_t>(batch * seq), -1.0);
    double want = 0;
    for (std::int64_t s = 0; s < batch; ++s) {
      labels[static_cast<std::size_t>(s * seq + seq - 1)] = static_cast<double>(label);
      const double* z = logits.data() + s * c.vocab;
      const double top = *std::max_element(z, z + c.vocab);
      double sum = 0;
      for (std::int64_t v = 0; v < c.vocab; ++v) sum += std::exp(z[v] - top);
      want += (top + std::log(sum) - z[label]) / static_cast<double>(batch);
    }
    loss.set_input(lm.labels, labels);
    loss.forward(false);
    EXPECT_NEAR(loss.read(lm.loss)[0], want, 1e-12 * want) << "label " << label;
  }
  // Causal: the last position's logits of a sequence do not depend on the other sequence.
  std::vector<double> changed = data.tokens;
  for (std::int64_t t = 0; t < seq; ++t) changed[static_cast<std::size_t>(seq + t)] = 5;
  prefill.set_input(pm.tokens, changed);
  prefill.forward(false);
  const std::vector<double> again = prefill.read(pm.logits);
  EXPECT_EQ(std::vector<double>(again.begin(), again.begin() + c.vocab),
            std::vector<double>(logits.begin(), logits.begin() + c.vocab));
  EXPECT_NE(again, logits);
}

TEST(Bert, QuestionAnsweringHeadParameterCountsAreHuggingFacesLessTheSegmentEmbeddings) {
  // BertForQuestionAnswering's num_parameters() (no pooler; qa_outputs C x 2 + 2) for
  // bert-base-uncased and bert-large-uncased, less the token-type table (2 x channels).
  const auto count = [](const BertConfig& c) {
    nn::GraphBuilder b(inference_options());
    const LanguageModel m = build_bert(b, c, 2, 8, BertHead::qa);
    EXPECT_EQ(b.desc(m.logits).shape, (Shape{16, 2}));
    EXPECT_LT(m.labels.id, 0);
    return nn::Graph(std::move(b)).parameter_count();
  };
  EXPECT_EQ(count(bert_base()), 108'893'186 - 2 * 768);
  EXPECT_EQ(count(bert_large()), 334'094'338 - 2 * 1024);
}

// BERT sees the whole sequence both ways: changing the last token moves the first one's
// (start, end) logits, and a sequence's logits do not depend on the other sequences'.
TEST(Bert, QuestionAnsweringLogitsAreEveryTokensStartAndEndOverTheWholeSequence) {
  const BertConfig c = tiny_bert();
  const std::int64_t batch = 2, seq = 6;
  auto kernels = nn::make_ref_kernels();
  nn::GraphBuilder b(inference_options(test::seed(), DType::f64));
  const LanguageModel m = build_bert(b, c, batch, seq, BertHead::qa);
  nn::Graph g(std::move(b));
  g.bind(*kernels);
  const TokenBatch data = copy_task_batch(test::seed(), 0, batch, seq, c.vocab);
  g.set_input(m.tokens, data.tokens);
  g.forward(false);
  const std::vector<double> before = g.read(m.logits);
  std::vector<double> tokens = data.tokens;
  const auto last = static_cast<std::size_t>(seq - 1);
  tokens[last] = tokens[last] == 3 ? 4 : 3;
  g.set_input(m.tokens, tokens);
  g.forward(false);
  const std::vector<double> after = g.read(m.logits);
  ASSERT_EQ(after.size(), static_cast<std::size_t>(batch * seq * 2));
  EXPECT_NE(after[0], before[0]);
  EXPECT_NE(after[1], before[1]);
  const auto second = [&](const std::vector<double>& v) { return std::vector<double>(v.begin() + seq * 2, v.end()); };
  EXPECT_EQ(second(after), second(before));
}

TEST(LanguageHeads, InferenceHeadsAreRefusedInTrainingGraphs) {
  nn::GraphBuilder gb, bb;
  EXPECT_NE(test::usage_error([&] { build_gpt(gb, tiny_gpt2(), 1, 8, GptHead::prefill); }).find("inference graphs"),
            std::string::npos);
  EXPECT_NE(test::usage_error([&] { build_bert(bb, tiny_bert(), 1, 8, BertHead::qa); }).find("inference graphs"),
            std::string::npos);
  nn::GraphBuilder tb(inference_options());
  EXPECT_NE(test::usage_error([&] {
              build_gpt(tb, tiny_gpt2(), 1, 65, GptHead::prefill);
            }).find("longer than its 64 positions"),
            std::string::npos);
}

// An inference graph plans no gradient, keeps nothing past the op that wrote it (the MLP's GELU
// input not even there), binds no parameter gradient, and needs a smaller arena than training.
TEST(LanguageHeads, InferenceGraphsHoldNoGradientsAndKeepNothingForBackward) {
  const auto arena = [](bool training, bool bert) {
    nn::GraphOptions o = inference_options();
    o.training = training;
    nn::GraphBuilder b(o);
    if (bert) build_bert(b, tiny_bert(), 4, 32, training ? BertHead::masked_lm : BertHead::qa);
    else build_gpt(b, tiny_gpt2(), 4, 32, training ? GptHead::loss : GptHead::prefill);
    return nn::Graph(std::move(b));
  };
  for (const bool bert : {false, true}) {
    SCOPED_TRACE(bert ? "tiny_bert qa" : "tiny_gpt2 prefill");
    auto kernels = nn::make_ref_kernels();  // outlives the graph, whose memory it holds
    nn::Graph g = arena(false, bert);
    int saved = 0, gelu_inputs = 0;
    for (const nn::BufferLifetime& life : g.buffers()) {
      EXPECT_NE(life.label.rfind("grad ", 0), 0u) << life.label;
      if (life.label.find(":saved") == std::string::npos) continue;
      ++saved;
      EXPECT_EQ(life.first_step, life.last_step) << life.label << " outlives its op";
      if (life.label.find("mlp:saved0") != std::string::npos) {
        ++gelu_inputs;
        EXPECT_EQ(life.bytes, 0) << life.label;
      }
    }
    EXPECT_GT(saved, 0);
    EXPECT_EQ(gelu_inputs, 2);  // one MLP per layer
    EXPECT_LT(g.memory_plan().peak_bytes, arena(true, bert).memory_plan().peak_bytes);
    g.bind(*kernels);
    for (const nn::Parameter& p : g.parameters()) EXPECT_FALSE(p.grad.defined()) << p.name;
    EXPECT_THROW(g.backward(), Error);
  }
}

}  // namespace
}  // namespace ab::models
