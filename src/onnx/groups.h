// Chains of nodes built as one unit: a convolution with the batch norm, residual add and ReLU after
// it (the ResNet builder's conv / bn / relu ops, so the batch-norm folding and the fused epilogue
// apply) and a zero Pad before it (merged into its padding), and PyTorch's erf GELU
// (x * 0.5 * (1 + erf(x / sqrt 2))) as one gelu_erf op.
#pragma once

#include <vector>

#include "nn/ops.h"
#include "onnx/internal.h"

namespace ab::onnx {

// Consumers of each tensor among the nodes left to map (the graph output counts as one, -1), and
// the one node reading `tensor` where only one does (else -1).
using Consumers = std::map<std::string, std::vector<int>>;
Consumers consumers_of(const Model::State& s);
int sole_consumer(const Consumers& uses, const std::string& tensor);

// The attention patterns of `s` (attention.cpp), their nodes marked in `claimed`.
std::vector<Group> plan_attention(const Model::State& s, const Consumers& uses, std::vector<bool>& claimed);
// Builds one onto nn::attention where the bound shapes, scale and mask fit; else node by node.
void build_attention(Ctx& c, const Group& g);

// The chains of `s`, each node in one at most; a node claimed by no chain maps on its own.
std::vector<Group> plan_groups(const Model::State& s, Fold fold);
// Builds the chain into c (at its last node); parts it cannot take as a chain (a residual of
// another shape) map node by node.
void build_group(Ctx& c, const Group& g);

// MatMul by a constant [K, N] then Add of a constant [N] as one linear layer with its bias; where
// the group goes on (Transpose, Mul by a per-output constant s) s is folded into the weight and
// bias, the Transpose maps as it is, and the Mul's output is the Transpose's.
void map_linear_group(Ctx& c, const Group& g);
void map_linear_group(Ctx& c, const Node& matmul, const Node& add);  // the two alone
// nn::linear `name` over the rows of n's input 0 (viewed [rows, K]), e4m3 where an fp8 graph's rule
// allows; its weight [out, K] and bias stored as its parameters. Returns y [rows, out].
nn::Value linear_of_rows(Ctx& c, const Node& n, const std::string& name, const std::vector<double>& weight_nk,
                         std::int64_t out, const std::vector<double>* bias);
// A constant [K, N] (MatMul's B) as nn::Linear's weight [N, K].
std::vector<double> linear_weight(const HostTensor& kn);

// Conv's attributes in the engine's terms, and the extra padding on each side of H and W that a
// symmetric convolution padding cannot express (then an nn::pad goes first). With `pad` (a zero
// Pad of H and W that plan_groups merged), its pads are added to the convolution's and x is its input.
struct ConvGeometry {
  nn::Conv2dAttrs attrs;
  std::int64_t extra_top = 0, extra_left = 0, extra_bottom = 0, extra_right = 0;
};
ConvGeometry conv_geometry(const Ctx& c, const Node& n, const HostTensor& weight, const Node* pad = nullptr);
// x padded by the extra of `g` (an nn::pad) where there is any.
nn::Value pad_for_conv(Ctx& c, const Node& n, nn::Value x, const ConvGeometry& g);

}  // namespace ab::onnx
