#include "models/bert.h"

#include "core/error.h"
#include "core/rng.h"
#include "nn/ops.h"

namespace ab::models {

BertConfig bert_base() { return {}; }
BertConfig bert_large() { return {.name = "bert_large", .layers = 24, .heads = 16, .channels = 1024}; }
BertConfig tiny_bert() {
  return {.name = "tiny_bert", .layers = 2, .heads = 1, .channels = 64, .vocab = 64, .positions = 64};
}

LanguageModel build_bert(nn::GraphBuilder& b, const BertConfig& c, std::int64_t batch, std::int64_t seq,
                         BertHead head) {
  check_language_model(c.name, c.heads, c.channels, c.vocab, c.positions, batch, seq);
  if (head == BertHead::qa && b.options().training)
    throw UsageError("model " + c.name +
                     ": the question-answering head is for inference graphs "
                     "(GraphOptions::training = false)");
  const nn::ParamInit normal{nn::ParamInit::Dist::normal, 0.02};  // Hugging Face's initializer_range
  const double eps = c.layernorm_epsilon;
  LanguageModel m;
  m.tokens = b.input("tokens", Shape{batch, seq}, DType::i32);
  if (head == BertHead::masked_lm) m.labels = b.input("labels", Shape{batch * seq}, DType::i32);
  nn::Value x = nn::embedding(b, "embeddings", m.tokens, c.vocab, c.positions, c.channels);
  x = nn::dropout(b, "embeddings.dropout", nn::layernorm(b, "embeddings.LayerNorm", x, eps), c.dropout);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    const nn::Value qkv = nn::linear(b, p + "attention.self.qkv", x, 3 * c.channels, true, false, normal);
    const nn::Value a = nn::attention(b, p + "attention.self", qkv, c.heads, seq, /*causal=*/false);
    const nn::Value o =
        nn::dropout(b, p + "attention.output.dropout",
                    nn::linear(b, p + "attention.output.dense", a, c.channels, true, false, normal), c.dropout);
    x = nn::layernorm(b, p + "attention.output.LayerNorm", nn::add(b, p + "attention.add", x, o), eps);
    const nn::Value f =
        nn::dropout(b, p + "output.dropout", nn::mlp(b, p + "mlp", x, 4 * c.channels, 0.02, 0.02), c.dropout);
    x = nn::layernorm(b, p + "output.LayerNorm", nn::add(b, p + "output.add", x, f), eps);
  }
  if (head == BertHead::qa) {
    m.logits = nn::linear(b, "qa_outputs", x, 2, true, false, normal);
    b.mark_output(m.logits);
    return m;
  }
  nn::Value t = nn::linear(b, "cls.predictions.transform.dense", x, c.channels, true, false, normal);
  t = nn::layernorm(b, "cls.predictions.transform.LayerNorm", nn::gelu(b, "cls.predictions.transform.gelu", t), eps);
  m.loss = nn::classifier_loss(b, "cls.predictions.decoder", t, m.labels, c.vocab, "embeddings.wte", /*bias=*/true);
  b.set_loss(m.loss);
  b.mark_output(m.loss);
  return m;
}

TokenBatch masked_copy_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t seq,
                             std::int64_t vocab, std::int64_t mask_token) {
  TokenBatch out = copy_task_batch(seed, first, batch, seq, vocab);
  for (std::int64_t s = 0; s < batch; ++s) {
    const std::uint64_t key = mix64(seed ^ 0x6d61736bULL, first + static_cast<std::uint64_t>(s));  // "mask"
    for (std::int64_t t = 0; t < seq; ++t) {
      const auto i = static_cast<std::size_t>(s * seq + t);
      const bool masked = uniform(key, static_cast<std::uint64_t>(t), 0.0, 1.0) < 0.15;
      out.labels[i] = masked ? out.tokens[i] : -1.0;
      if (masked) out.tokens[i] = static_cast<double>(mask_token);
    }
  }
  return out;
}

}  // namespace ab::models
