#include "models/gpt.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/rng.h"
#include "nn/ops.h"

namespace ab::models {

GptConfig gpt2_124m() { return {}; }
GptConfig gpt2_350m() { return {.name = "gpt2_350m", .layers = 24, .heads = 16, .channels = 1024}; }
GptConfig gpt2_774m() { return {.name = "gpt2_774m", .layers = 36, .heads = 20, .channels = 1280}; }
GptConfig gpt2_1558m() { return {.name = "gpt2_1558m", .layers = 48, .heads = 25, .channels = 1600}; }
GptConfig tiny_gpt2() {
  return {.name = "tiny_gpt2", .layers = 2, .heads = 1, .channels = 64, .vocab = 64, .positions = 64};
}

void check_gpt(const GptConfig& c, std::int64_t batch, std::int64_t seq) {
  check_language_model(c.name, c.heads, c.channels, c.vocab, c.positions, batch, seq);
}

void check_language_model(const std::string& name, std::int64_t heads, std::int64_t channels, std::int64_t vocab,
                          std::int64_t positions, std::int64_t batch, std::int64_t seq) {
  const std::string model = "model " + name + ": ";
  if (batch < 1 || seq < 1)
    throw UsageError(model + "batch and sequence length must be >= 1, got " + std::to_string(batch) + " and " +
                     std::to_string(seq));
  if (seq > positions)
    throw UsageError(model + "a sequence of " + std::to_string(seq) + " tokens is longer than its " +
                     std::to_string(positions) + " positions");
  if (heads < 1 || channels % heads != 0)
    throw UsageError(model + std::to_string(heads) + " heads do not divide the width " + std::to_string(channels));
  if (vocab < 1 || vocab > std::numeric_limits<std::int32_t>::max())
    throw UsageError(model + "a vocabulary of " + std::to_string(vocab) + " does not fit i32 tokens");
}

LanguageModel build_gpt(nn::GraphBuilder& b, const GptConfig& c, std::int64_t batch, std::int64_t seq, GptHead head) {
  check_gpt(c, batch, seq);
  if (head == GptHead::prefill && b.options().training)
    throw UsageError("model " + c.name + ": the prefill head is for inference graphs (GraphOptions::training = false)");
  // Hugging Face's initialisation: N(0, 0.02), the projections into the residual stream scaled
  // by 1 / sqrt(2 layers) (each block adds two).
  const nn::ParamInit normal{nn::ParamInit::Dist::normal, 0.02};
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  const nn::ParamInit proj{nn::ParamInit::Dist::normal, proj_std};
  LanguageModel m;
  m.tokens = b.input("tokens", Shape{batch, seq}, DType::i32);
  if (head == GptHead::loss) m.labels = b.input("labels", Shape{batch * seq}, DType::i32);
  nn::Value x =
      nn::dropout(b, "embed.drop", nn::embedding(b, "embed", m.tokens, c.vocab, c.positions, c.channels), c.dropout);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const nn::Value ln1 = nn::layernorm(b, h + "ln_1", x, c.layernorm_epsilon);
    const nn::Value qkv = nn::linear(b, h + "attn.c_attn", ln1, 3 * c.channels, true, false, normal);
    const nn::Value a = nn::attention(b, h + "attn", qkv, c.heads, seq, /*causal=*/true);
    const nn::Value attn_out = nn::linear(b, h + "attn.c_proj", a, c.channels, true, false, proj);
    x = nn::add(b, h + "add_1", x, nn::dropout(b, h + "attn.drop", attn_out, c.dropout));
    const nn::Value ln2 = nn::layernorm(b, h + "ln_2", x, c.layernorm_epsilon);
    const nn::Value mlp_out = nn::mlp(b, h + "mlp", ln2, 4 * c.channels, 0.02, proj_std);
    x = nn::add(b, h + "add_2", x, nn::dropout(b, h + "mlp.drop", mlp_out, c.dropout));
  }
  x = nn::layernorm(b, "ln_f", x, c.layernorm_epsilon);
  if (head == GptHead::prefill) {
    m.logits = nn::last_position_logits(b, "lm_head", x, c.vocab, seq, "embed.wte");
    b.mark_output(m.logits);
    return m;
  }
  m.loss = nn::classifier_loss(b, "lm_head", x, m.labels, c.vocab, "embed.wte");
  b.set_loss(m.loss);
  b.mark_output(m.loss);
  return m;
}

TokenBatch copy_task_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t seq,
                           std::int64_t vocab) {
  TokenBatch out;
  const auto n = static_cast<std::size_t>(batch * seq);
  out.tokens.resize(n);
  out.labels.resize(n);
  const std::int64_t half = (seq + 1) / 2;
  for (std::int64_t s = 0; s < batch; ++s) {
    const std::uint64_t key = mix64(seed, first + static_cast<std::uint64_t>(s));
    double* tokens = out.tokens.data() + s * seq;
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t source = t < half ? t : t - half;
      tokens[t] =
          static_cast<double>(mix64(key, static_cast<std::uint64_t>(source)) % static_cast<std::uint64_t>(vocab));
    }
    for (std::int64_t t = 0; t < seq; ++t)
      out.labels[static_cast<std::size_t>(s * seq + t)] = t + 1 < seq ? tokens[t + 1] : -1.0;
  }
  return out;
}

}  // namespace ab::models
