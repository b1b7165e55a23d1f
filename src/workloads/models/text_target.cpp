// Time to train a GPT on a text or token file (target_task.h): next-token windows of the training
// tokens in a per-epoch shuffle (data::TokenWindows), the mean cross-entropy in nats per token over
// every window of the held-out tail, AdamW with GPT-2's recipe. docs/METHODOLOGY.md, "Time to train".
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/pipeline.h"
#include "models/gpt.h"
#include "workloads/models/datasets.h"
#include "workloads/models/target_task.h"

namespace ab::workloads::zoo {
namespace {

// Every held-out window once, in order, in whole batches: windows past the last real one hold
// token 0 and labels -1 (not scored).
struct TokenEval {
  std::int64_t windows = 0, batch = 0, seq = 0;
  std::vector<std::int32_t> inputs, labels;  // batches() * batch * seq
  std::int64_t batches() const { return (windows + batch - 1) / batch; }
};

TokenEval make_token_eval(const std::vector<std::uint16_t>& tokens, std::int64_t seq, std::int64_t batch) {
  TokenEval e;
  e.windows = (static_cast<std::int64_t>(tokens.size()) - 1) / seq;
  e.batch = batch;
  e.seq = seq;
  const auto size = static_cast<std::size_t>(e.batches() * batch * seq);
  e.inputs.assign(size, 0);
  e.labels.assign(size, -1);
  for (std::int64_t w = 0; w < e.windows; ++w)
    for (std::int64_t t = 0; t < seq; ++t) {
      const auto at = static_cast<std::size_t>(w * seq + t);
      e.inputs[at] = tokens[at];
      e.labels[at] = tokens[at + 1];
    }
  return e;
}

std::string count(std::size_t n, const char* what) { return std::to_string(n) + " " + what; }

class TextTask final : public TargetTask {
 public:
  TextTask(double target_loss, std::vector<std::uint16_t> train, std::int64_t seq, std::uint64_t seed, int rank,
           int ranks)
      : quality_{"loss", false, target_loss}, train_(std::move(train), seq, seed, rank, ranks) {}
  const Quality& quality() const override { return quality_; }
  std::int64_t steps_per_epoch() const override { return train_.batches_per_epoch(batch_); }
  std::int64_t train_samples() const override { return train_.windows(); }
  std::int64_t eval_samples() const override { return eval_.windows; }

  void upload_next_batch(nn::Graph& g) override {
    train_.fill(next_batch_++, batch_, inputs_.data(), targets_.data());
    g.kernels().upload(g.tensor(lm_.tokens), inputs_.data());
    g.kernels().upload(g.tensor(lm_.labels), targets_.data());
  }
  // Each batch's loss is the mean over its scored tokens; weighted by them, the mean over all.
  double evaluate(nn::Graph& g) override {
    double total = 0;
    const std::int64_t per_batch = eval_.batch * eval_.seq;
    for (std::int64_t b = 0; b < eval_.batches(); ++b) {
      g.kernels().upload(g.tensor(lm_.tokens), eval_.inputs.data() + b * per_batch);
      g.kernels().upload(g.tensor(lm_.labels), eval_.labels.data() + b * per_batch);
      g.forward(false);
      const std::int64_t windows = std::min(eval_.batch, eval_.windows - b * eval_.batch);
      total += g.read(lm_.loss)[0] * static_cast<double>(windows * eval_.seq);
    }
    return total / static_cast<double>(eval_.windows * eval_.seq);
  }
  void log_optimizer(MlLog& log) const override {
    log.event("opt_name", "adamw");
    log.event("opt_adamw_beta_1", kAdamWBeta1);
    log.event("opt_adamw_beta_2", kAdamWBeta2);
    log.event("opt_adamw_epsilon", kAdamWEpsilon);
    log.event("opt_adamw_weight_decay", kAdamWWeightDecay);
    log.event("opt_gradient_clip_norm", kAdamWMaxGradNorm);
  }

  void init(State& state, const TargetPoint& p, const TrainOptions& o, const TokenSplits& splits, TargetModel& m,
            ab::models::GptConfig c) {
    m.spec = p.spec;
    batch_ = m.spec.batch;
    const std::int64_t seq = m.spec.seq;
    nn::GraphOptions options = graph_options(m.spec);
    options.seed = p.seed;
    nn::GraphBuilder builder(options);
    lm_ = ab::models::build_gpt(builder, c, batch_, seq);
    const double peak = o.lr > 0 ? o.lr : kAdamWLr;
    m.bind(state, std::move(builder),
           std::make_unique<nn::AdamW>(peak, kAdamWBeta1, kAdamWBeta2, kAdamWEpsilon, kAdamWWeightDecay,
                                       kAdamWMaxGradNorm));
    m.loss = lm_.loss;
    m.inputs = {lm_.tokens, lm_.labels};
    inputs_.resize(static_cast<std::size_t>(batch_ * seq));
    targets_.resize(inputs_.size());
    eval_ = make_token_eval(splits.held_out, seq, batch_);
    const double fwd = static_cast<double>(m.graph->forward_flops()),
                 bwd = static_cast<double>(m.graph->backward_flops());
    // Per training sample (one window): the rates are windows/s and tokens/s.
    state.set_counts({1.0, (fwd + bwd) / static_cast<double>(batch_), 0.0, "FLOP", static_cast<double>(seq)});
    state.add_metric("dataset", {{"name", p.dataset},
                                 {"tokenizer", splits.tokenizer},
                                 {"vocabulary", c.vocab},
                                 {"train_tokens", splits.train.size()},
                                 {"eval_tokens", splits.held_out.size()},
                                 {"held_out_share", kHeldOutShare},
                                 {"seq", seq},
                                 {"train_windows", train_.windows()},
                                 {"eval_windows", eval_.windows},
                                 {"loss_unit", "nats per token"}});
  }

 private:
  Quality quality_;
  data::TokenWindows train_;
  TokenEval eval_;
  ab::models::LanguageModel lm_;
  std::int64_t batch_ = 1, next_batch_ = 0;
  std::vector<std::int32_t> inputs_, targets_;
};

// The zoo's GPT with the data's vocabulary (bytes: 256; a token file: the model's own, which
// every token must be below). UsageError for a model that is no GPT or that the data cannot feed.
ab::models::GptConfig text_model(const TargetPoint& p, const TokenSplits& splits) {
  const std::string& name = p.spec.model;
  if (!is_language_model(name) || language_config(name).masked)
    throw UsageError("time to train on " + p.dataset + " needs a causal language model (tiny_gpt2, gpt2_124m, ...); '" +
                     name + "' is not one");
  if (p.spec.fuse_batchnorm_relu || p.spec.fold_batchnorm)
    throw UsageError("model '" + name + "' has no batch norm to fold or fuse");
  ab::models::GptConfig c = language_config(name).gpt;
  c.dropout = p.spec.dropout;
  if (splits.vocabulary > 0) c.vocab = splits.vocabulary;
  for (const auto* part : {&splits.train, &splits.held_out}) {
    const auto top = std::max_element(part->begin(), part->end());
    if (top != part->end() && *top >= c.vocab)
      throw UsageError(p.dataset + ": token " + std::to_string(*top) + " is outside " + name + "'s vocabulary of " +
                       std::to_string(c.vocab));
  }
  return c;
}

// Refuses a stream too short for one training batch or one held-out window, naming the sizes.
void check_lengths(const TargetPoint& p, const TokenSplits& splits) {
  const std::int64_t seq = p.spec.seq, batch = p.spec.batch;
  const auto windows = [seq](std::size_t n) { return n < 1 ? 0 : (static_cast<std::int64_t>(n) - 1) / seq; };
  const std::string need = " (windows of seq + 1 = " + std::to_string(seq + 1) + " tokens)";
  if (windows(splits.held_out.size()) < 1)
    throw UsageError(p.dataset + ": its held-out tail (the last " + std::to_string(std::llround(kHeldOutShare * 100)) +
                     "%, " + count(splits.held_out.size(), "tokens") + ") holds no window" + need +
                     "; a longer file or a shorter seq");
  if (windows(splits.train.size()) < batch * p.ranks())
    throw UsageError(p.dataset + ": its " + count(splits.train.size(), "training tokens") + " make " +
                     std::to_string(windows(splits.train.size())) + " windows" + need + ", less than one batch of " +
                     std::to_string(batch) +
                     (p.ranks() > 1 ? " on each of " + std::to_string(p.ranks()) + " ranks" : "") +
                     "; a longer file, a shorter seq or a smaller batch");
}

}  // namespace

std::unique_ptr<TargetTask> make_text_task(State& state, const TargetPoint& p, const TrainOptions& o, TargetModel& m) {
  TokenSplits splits = load_token_splits(p.dataset);
  const ab::models::GptConfig c = text_model(p, splits);
  ab::models::check_gpt(c, p.spec.batch, p.spec.seq);
  check_lengths(p, splits);
  auto task = std::make_unique<TextTask>(p.target_loss, splits.train, p.spec.seq, p.seed, p.rank(), p.ranks());
  task->init(state, p, o, splits, m, c);
  return task;
}

}  // namespace ab::workloads::zoo
