// BERT as Hugging Face defines it (post-norm blocks, learned positions, GELU tanh) with the
// masked-language-model head of BertForMaskedLM (training: the decoder tied to the word embeddings
// with its own bias) or the question-answering head of BertForQuestionAnswering (inference, as
// MLPerf Inference runs BERT-large on SQuAD), built into an nn graph, and a masked copy task it can
// learn. One departure: there are no token-type (segment) embeddings — the benchmark feeds one
// segment, whose embedding row would be a constant added to every position; the parameter counts
// therefore read 2 x channels below Hugging Face's (109,512,762 for BERT-base against 109,514,298).
#pragma once

#include <cstdint>
#include <string>

#include "models/gpt.h"
#include "nn/graph.h"

namespace ab::models {

struct BertConfig {
  std::string name = "bert_base";
  std::int64_t layers = 12;
  std::int64_t heads = 12;
  std::int64_t channels = 768;
  std::int64_t vocab = 30522;
  std::int64_t positions = 512;
  double layernorm_epsilon = 1e-12;
  // Hidden dropout (Hugging Face's hidden_dropout_prob: after the embeddings' LayerNorm and on each
  // sublayer's output before its residual add), 0 = none (the throughput default); the attention
  // probabilities are not dropped (the fused attention kernels have no dropout).
  double dropout = 0.0;
};

BertConfig bert_base();
BertConfig bert_large();  // 24 layers, 16 heads of 64, 1024 wide (MLPerf Training's BERT)
BertConfig tiny_bert();   // 2 layers, one head of 64, vocabulary 64, 64 positions

// What follows the encoder: masked_lm = BertForMaskedLM's head and its loss (labels [B*T] in: the
// original token at masked positions, -1 elsewhere; the mean cross-entropy out); qa =
// BertForQuestionAnswering's qa_outputs, a Linear C -> 2 over every token's final hidden state,
// whose logits [B*T, 2] hold each token's (start, end) pair (Hugging Face's start_logits and
// end_logits [B, T] are its two columns), for inference graphs. The encoder is the same in both.
enum class BertHead { masked_lm, qa };
// tokens [B, T] in. UsageError (before building) as check_language_model, and for the qa head in a
// training graph.
LanguageModel build_bert(nn::GraphBuilder& b, const BertConfig& c, std::int64_t batch, std::int64_t seq,
                         BertHead head = BertHead::masked_lm);

// The copy task (copy_task_batch) with BERT's masking: about 15% of the positions, chosen from
// (seed, sample index), have their token replaced by `mask_token` and scored against the original;
// a masked token of one half is predictable from its twin in the other.
TokenBatch masked_copy_batch(std::uint64_t seed, std::uint64_t first, std::int64_t batch, std::int64_t seq,
                             std::int64_t vocab, std::int64_t mask_token);

}  // namespace ab::models
