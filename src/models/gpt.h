// GPT-2 as Hugging Face transformers and llm.c define it (pre-norm blocks, learned positions, GELU
// tanh, tied embeddings), built into an nn graph with its training loss or its inference (prefill)
// head, and the synthetic token task it trains on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/graph.h"

namespace ab::models {

struct GptConfig {
  std::string name = "gpt2_124m";
  std::int64_t layers = 12;
  std::int64_t heads = 12;
  std::int64_t channels = 768;  // heads x head_dim
  std::int64_t vocab = 50257;
  std::int64_t positions = 1024;  // the longest sequence
  double layernorm_epsilon = 1e-5;
  // Hidden dropout (Hugging Face's embd_pdrop and resid_pdrop: after the embeddings and on each
  // residual branch), 0 = none (the throughput default); the attention probabilities are not
  // dropped (the fused attention kernels have no dropout).
  double dropout = 0.0;
};

// The four GPT-2 sizes (d12, d24, d36, d48: 124M, 350M, 774M, 1558M parameters) and a tiny one for
// the reference backend (2 layers of 64 channels, one head of 64, vocabulary 64, 64 positions).
GptConfig gpt2_124m();
GptConfig gpt2_350m();
GptConfig gpt2_774m();
GptConfig gpt2_1558m();
GptConfig tiny_gpt2();

// A language model's graph values: tokens [B, T] (i32) in; with a training head also labels [B*T]
// (i32, the next token; -1 where a position is not scored) in and the mean cross-entropy out, with
// an inference head the logits out instead (no labels, no loss: undefined values, id -1).
struct LanguageModel {
  nn::Value tokens, labels, loss, logits;
};

// Throws UsageError (before anything is built) for a sequence longer than the positions, heads
// that do not divide the width, or a vocabulary that does not fit an i32 token.
void check_language_model(const std::string& name, std::int64_t heads, std::int64_t channels, std::int64_t vocab,
                          std::int64_t positions, std::int64_t batch, std::int64_t seq);
void check_gpt(const GptConfig& c, std::int64_t batch, std::int64_t seq);

// What follows the final LayerNorm: the tied classifier and its next-token loss (training), or the
// tied classifier's logits [B, V] of each sequence's last position alone (prefill: what a
// generation computes before its first token; Hugging Face's logits_to_keep=1), for inference
// graphs. The decoder stack is the same in both.
enum class GptHead { loss, prefill };
// UsageError (before building) as check_gpt, and for the prefill head in a training graph.
LanguageModel build_gpt(nn::GraphBuilder& b, const GptConfig& c, std::int64_t batch, std::int64_t seq,
                        GptHead head = GptHead::loss);

// A learnable task for a causal model: each sequence is a random first half (from (seed, sample
// index)) repeated, so the second half is predictable from the first (the model must learn to
// copy); labels are the next tokens, -1 for the last position. Values as Graph::set_input takes.
struct TokenBatch {
  std::vector<double> tokens, labels;
};
TokenBatch copy_task_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t seq,
                           std::int64_t vocab);

}  // namespace ab::models
