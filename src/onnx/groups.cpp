#include "onnx/groups.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "models/resnet.h"
#include "nn/ops.h"

namespace ab::onnx {

std::map<std::string, std::vector<int>> consumers_of(const Model::State& s) {
  std::map<std::string, std::vector<int>> uses;
  for (std::size_t i = 0; i < s.nodes.size(); ++i)
    for (const auto& in : s.nodes[i].inputs)
      if (!in.empty()) uses[in].push_back(static_cast<int>(i));
  uses[s.facts.output_name].push_back(-1);
  return uses;
}

int sole_consumer(const std::map<std::string, std::vector<int>>& uses, const std::string& tensor) {
  const auto it = uses.find(tensor);
  return it != uses.end() && it->second.size() == 1 ? it->second[0] : -1;
}

namespace {

bool all_constant(const Model::State& s, const Node& n, std::size_t from) {
  for (std::size_t i = from; i < n.inputs.size(); ++i)
    if (!n.inputs[i].empty() && !s.constants.contains(n.inputs[i])) return false;
  return true;
}

bool scalar_near(const Model::State& s, const std::string& tensor, double want) {
  const auto it = s.constants.find(tensor);
  return it != s.constants.end() && it->second.numel() == 1 &&
         std::abs(it->second.value(0) - want) < 1e-4 * std::abs(want);
}

// The index of a node's input other than `tensor` (binary ops), or -1.
int other_input(const Node& n, const std::string& tensor) {
  if (n.inputs.size() != 2) return -1;
  return n.inputs[0] == tensor ? 1 : n.inputs[1] == tensor ? 0 : -1;
}

// The Pad before `conv` where the convolution's padding can take it: constant mode, value 0 (or
// none), constant pads of H and W only (none of N or C, none negative), no axes input, read by the
// convolution alone, and a convolution without auto_pad SAME_* (whose padding depends on the size
// it sees). -1 where there is none; any other Pad stays a pad op.
int mergeable_pad(const Model::State& s, const std::map<std::string, std::vector<int>>& uses, int conv,
                  const std::vector<bool>& claimed) {
  const Node& c = s.nodes[static_cast<std::size_t>(conv)];
  const std::string auto_pad = attr_string(c, "auto_pad", "NOTSET");
  if (c.inputs.empty() || (auto_pad != "NOTSET" && auto_pad != "VALID") || sole_consumer(uses, c.inputs[0]) != conv)
    return -1;
  int pad = -1;
  for (int i = conv - 1; i >= 0 && pad < 0; --i)
    if (s.nodes[static_cast<std::size_t>(i)].outputs.size() == 1 &&
        s.nodes[static_cast<std::size_t>(i)].outputs[0] == c.inputs[0])
      pad = i;
  if (pad < 0 || claimed[static_cast<std::size_t>(pad)]) return -1;
  const Node& p = s.nodes[static_cast<std::size_t>(pad)];
  if (p.op != "Pad" || p.inputs.size() < 2 || attr_string(p, "mode", "constant") != "constant" ||
      s.constants.contains(p.inputs[0]) || (p.inputs.size() > 3 && !p.inputs[3].empty()))
    return -1;
  const auto pads = s.constants.find(p.inputs[1]);
  if (pads == s.constants.end() || !pads->second.integer || pads->second.ints.size() != 8) return -1;
  const std::vector<std::int64_t>& v = pads->second.ints;
  for (std::size_t i = 0; i < 8; ++i) {
    const bool spatial = i % 4 >= 2;
    if (v[i] < 0 || v[i] > 4096 || (!spatial && v[i] != 0)) return -1;
  }
  if (p.inputs.size() > 2 && !p.inputs[2].empty()) {
    const auto value = s.constants.find(p.inputs[2]);
    if (value == s.constants.end() || value->second.numel() != 1 || value->second.value(0) != 0.0) return -1;
  }
  return pad;
}

std::vector<int> conv_chain(const Model::State& s, const std::map<std::string, std::vector<int>>& uses, int conv,
                            std::vector<bool>& claimed) {
  std::vector<int> chain{conv};
  if (const int pad = mergeable_pad(s, uses, conv, claimed); pad >= 0) chain.insert(chain.begin(), pad);
  const auto next = [&](const std::string& op) {
    const int k = sole_consumer(uses, s.nodes[static_cast<std::size_t>(chain.back())].outputs.at(0));
    return k >= 0 && !claimed[static_cast<std::size_t>(k)] && s.nodes[static_cast<std::size_t>(k)].op == op ? k : -1;
  };
  if (int k = next("BatchNormalization"); k >= 0 && s.nodes[static_cast<std::size_t>(k)].inputs.size() == 5 &&
                                          all_constant(s, s.nodes[static_cast<std::size_t>(k)], 1) &&
                                          s.nodes[static_cast<std::size_t>(k)].outputs.size() == 1)
    chain.push_back(k);
  if (int k = next("Add"); k >= 0) {
    const Node& add = s.nodes[static_cast<std::size_t>(k)];
    const int other = other_input(add, s.nodes[static_cast<std::size_t>(chain.back())].outputs[0]);
    if (other >= 0 && !s.constants.contains(add.inputs[static_cast<std::size_t>(other)])) chain.push_back(k);
  }
  if (int k = next("Relu"); k >= 0) chain.push_back(k);
  return chain;
}

// Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5), from the Erf node.
std::vector<int> gelu_chain(const Model::State& s, const std::map<std::string, std::vector<int>>& uses, int erf,
                            const std::vector<bool>& claimed) {
  const Node& e = s.nodes[static_cast<std::size_t>(erf)];
  int div = -1;
  for (int i = erf - 1; i >= 0 && div < 0; --i)
    if (s.nodes[static_cast<std::size_t>(i)].outputs.size() == 1 &&
        s.nodes[static_cast<std::size_t>(i)].outputs[0] == e.inputs.at(0))
      div = i;
  if (div < 0 || claimed[static_cast<std::size_t>(div)]) return {};
  const Node& d = s.nodes[static_cast<std::size_t>(div)];
  if (d.inputs.size() != 2 || sole_consumer(uses, d.outputs[0]) != erf) return {};
  const bool scaled = (d.op == "Div" && scalar_near(s, d.inputs[1], std::numbers::sqrt2)) ||
                      (d.op == "Mul" && scalar_near(s, d.inputs[1], 1 / std::numbers::sqrt2));
  if (!scaled || s.constants.contains(d.inputs[0])) return {};
  const std::string& x = d.inputs[0];
  const int add = sole_consumer(uses, e.outputs.at(0));
  if (add < 0 || s.nodes[static_cast<std::size_t>(add)].op != "Add") return {};
  const Node& a = s.nodes[static_cast<std::size_t>(add)];
  const int one = other_input(a, e.outputs[0]);
  if (one < 0 || !scalar_near(s, a.inputs[static_cast<std::size_t>(one)], 1.0)) return {};
  const int mul = sole_consumer(uses, a.outputs.at(0));
  if (mul < 0 || s.nodes[static_cast<std::size_t>(mul)].op != "Mul" ||
      other_input(s.nodes[static_cast<std::size_t>(mul)], a.outputs[0]) < 0 ||
      s.nodes[static_cast<std::size_t>(mul)]
              .inputs[static_cast<std::size_t>(other_input(s.nodes[static_cast<std::size_t>(mul)], a.outputs[0]))] != x)
    return {};
  const int half = sole_consumer(uses, s.nodes[static_cast<std::size_t>(mul)].outputs.at(0));
  if (half < 0 || s.nodes[static_cast<std::size_t>(half)].op != "Mul") return {};
  const Node& h = s.nodes[static_cast<std::size_t>(half)];
  const int c = other_input(h, s.nodes[static_cast<std::size_t>(mul)].outputs[0]);
  if (c < 0 || !scalar_near(s, h.inputs[static_cast<std::size_t>(c)], 0.5)) return {};
  return {div, erf, add, mul, half};
}

// Transpose (an explicit perm) -> Mul by a float constant after the linear's Add, each the only
// reader of what it reads, where the constant scales nothing but the output axis of `n` features
// (ConvNeXt's layer scale [C, 1, 1] after its channels-first Transpose): the two nodes, whose
// scale build_group folds into the weight and bias; else none.
std::vector<int> output_scale(const Model::State& s, const std::map<std::string, std::vector<int>>& uses, int add,
                              std::int64_t n) {
  const int t = sole_consumer(uses, s.nodes[static_cast<std::size_t>(add)].outputs.at(0));
  if (t < 0 || s.nodes[static_cast<std::size_t>(t)].op != "Transpose") return {};
  const Node& transpose = s.nodes[static_cast<std::size_t>(t)];
  const std::vector<std::int64_t> perm = attr_ints(transpose, "perm");
  const int m = transpose.outputs.size() == 1 ? sole_consumer(uses, transpose.outputs[0]) : -1;
  if (perm.empty() || m < 0 || s.nodes[static_cast<std::size_t>(m)].op != "Mul") return {};
  const Node& mul = s.nodes[static_cast<std::size_t>(m)];
  const int other = other_input(mul, transpose.outputs[0]);
  const auto c = other < 0 ? s.constants.end() : s.constants.find(mul.inputs[static_cast<std::size_t>(other)]);
  if (c == s.constants.end() || c->second.integer || c->second.dims.size() > perm.size()) return {};
  const std::size_t shift = perm.size() - c->second.dims.size();  // right-aligned broadcast
  for (std::size_t i = 0; i < c->second.dims.size(); ++i) {
    const std::int64_t dim = c->second.dims[i];
    const bool output_axis = perm[shift + i] == static_cast<std::int64_t>(perm.size()) - 1;
    if (dim != 1 && !(output_axis && dim == n)) return {};
  }
  return {t, m};
}

// MatMul(x, constant [K, N]) -> Add(constant [N]), and an output_scale after it where there is one.
std::vector<int> linear_chain(const Model::State& s, const std::map<std::string, std::vector<int>>& uses, int matmul) {
  const Node& m = s.nodes[static_cast<std::size_t>(matmul)];
  const auto w = m.inputs.size() == 2 ? s.constants.find(m.inputs[1]) : s.constants.end();
  if (w == s.constants.end() || w->second.dims.size() != 2 || s.constants.contains(m.inputs[0]) ||
      m.outputs.size() != 1)
    return {};
  const int add = sole_consumer(uses, m.outputs[0]);
  if (add < 0 || s.nodes[static_cast<std::size_t>(add)].op != "Add") return {};
  const Node& a = s.nodes[static_cast<std::size_t>(add)];
  const int other = other_input(a, m.outputs[0]);
  if (other < 0) return {};
  const auto bias = s.constants.find(a.inputs[static_cast<std::size_t>(other)]);
  if (bias == s.constants.end() || bias->second.dims.size() != 1 || bias->second.dims[0] != w->second.dims[1])
    return {};
  std::vector<int> chain{matmul, add};
  if (const auto scale = output_scale(s, uses, add, w->second.dims[1]); !scale.empty())
    chain.insert(chain.end(), scale.begin(), scale.end());
  return chain;
}

}  // namespace

std::vector<Group> plan_groups(const Model::State& s, Fold /*fold*/) {
  const auto uses = consumers_of(s);
  std::vector<bool> claimed(s.nodes.size(), false);
  std::vector<Group> groups = plan_attention(s, uses, claimed);
  const auto claim = [&](std::vector<int> nodes, const char* kind) {
    for (int i : nodes) claimed[static_cast<std::size_t>(i)] = true;
    groups.push_back(Group{std::move(nodes), kind, {}});
  };
  for (std::size_t i = 0; i < s.nodes.size(); ++i) {
    const Node& n = s.nodes[i];
    if (claimed[i]) continue;
    if (n.op == "Conv" && n.outputs.size() == 1 && n.inputs.size() >= 2 && all_constant(s, n, 1))
      claim(conv_chain(s, uses, static_cast<int>(i), claimed), "conv");
    else if (n.op == "MatMul" && !claimed[i])
      if (auto chain = linear_chain(s, uses, static_cast<int>(i));
          !chain.empty() &&
          std::none_of(chain.begin(), chain.end(), [&](int k) { return claimed[static_cast<std::size_t>(k)]; }))
        claim(std::move(chain), "linear");
    if (n.op == "Erf")
      if (auto chain = gelu_chain(s, uses, static_cast<int>(i), claimed); !chain.empty())
        claim(std::move(chain), "gelu");
  }
  return groups;
}

}  // namespace ab::onnx
