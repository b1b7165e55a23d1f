// Exported attention onto the engine's own op (nn::attention, the one GPT-2 and BERT run, fused on
// CUDA): MatMul(Q [*s], K^T [*s]) [/ or * s] [+ mask] -> Softmax -> [Where(IsNaN, 0)] -> MatMul(., V)
// with the heads' Transposes around it, as PyTorch exports both an explicit attention (BERT's) and
// scaled_dot_product_attention (ViT's MultiheadAttention: sqrt(s) on Q and on K^T). The pattern is
// matched on the graph at load; whether it maps is decided per batch, once the shapes and the
// shape-derived scales are constants: one sequence for queries and keys, the scale 1/sqrt(D) (the
// op's own), no mask or an all-zero one. Anything else maps node by node (matmul, softmax, matmul).
// Where Q, K and V are three linears (MatMul by a constant [C, C], Add of a constant [C]) of one
// input, each read only by its Reshape to heads, the group holds them too and builds them as one
// linear [C, 3C] whose rows are the op's q, k, v input: one GEMM, no concat.
#include <algorithm>
#include <cmath>
#include <optional>

#include "nn/ops.h"
#include "onnx/groups.h"

namespace ab::onnx {
namespace {

using Roles = std::map<std::string, int>;

struct Planner {
  const Model::State& s;
  const Consumers& uses;
  std::map<std::string, int> producer;

  const Node& node(int i) const { return s.nodes[static_cast<std::size_t>(i)]; }
  int made_by(const std::string& t) const {
    const auto it = producer.find(t);
    return it == producer.end() ? -1 : it->second;
  }
  // The node making `t` if it is `op` and `reader` is its output's only reader; else -1.
  int sole(const std::string& t, const char* op, int reader) const {
    const int p = made_by(t);
    return p >= 0 && node(p).op == op && node(p).outputs.size() == 1 && sole_consumer(uses, t) == reader ? p : -1;
  }
  bool is_transpose(int i, std::vector<std::int64_t> perm) const {
    return i >= 0 && node(i).op == "Transpose" && attr_ints(node(i), "perm") == perm;
  }
  // An operand scaled by a Mul (tensor first, scale second, as PyTorch exports) read only by `reader`.
  int scale_of(const std::string& t, int reader) const { return sole(t, "Mul", reader); }
  bool match(int softmax, Roles& r) const;
  bool match_scores(const std::string& scores_in, int reader, Roles& r) const;
  void match_heads(Roles& r) const;
  bool match_projection(const std::string& part, int heads, Roles& r) const;
  void match_projections(Roles& r) const;
};

// Softmax's input back to MatMul(Q, K^T): an optional mask Add and post-scale (Div or Mul).
bool Planner::match_scores(const std::string& scores_in, int reader, Roles& r) const {
  std::string t = scores_in;
  int p = made_by(t);
  if (p >= 0 && node(p).op == "Add" && sole_consumer(uses, t) == reader && node(p).inputs.size() == 2) {
    const auto reaches_matmul = [&](const std::string& x) {
      const int q = made_by(x);
      if (q < 0) return false;
      if (node(q).op == "MatMul") return true;
      return (node(q).op == "Div" || node(q).op == "Mul") && made_by(node(q).inputs.at(0)) >= 0 &&
             node(made_by(node(q).inputs[0])).op == "MatMul";
    };
    const int scores_side = reaches_matmul(node(p).inputs[0]) ? 0 : reaches_matmul(node(p).inputs[1]) ? 1 : -1;
    if (scores_side < 0) return false;
    r["mask_add"] = p;
    reader = p;
    t = node(p).inputs[static_cast<std::size_t>(scores_side)];
    p = made_by(t);
  }
  if (p >= 0 && (node(p).op == "Div" || node(p).op == "Mul") && node(p).inputs.size() == 2 &&
      sole_consumer(uses, t) == reader) {
    r["post_scale"] = p;
    reader = p;
    t = node(p).inputs[0];
  }
  const int mm = sole(t, "MatMul", reader);
  if (mm < 0 || node(mm).inputs.size() != 2) return false;
  r["scores"] = mm;
  const int qs = scale_of(node(mm).inputs[0], mm), ks = scale_of(node(mm).inputs[1], mm);
  if (qs >= 0) r["q_scale"] = qs;
  if (ks >= 0) r["k_scale"] = ks;
  const std::string& kt = ks >= 0 ? node(ks).inputs.at(0) : node(mm).inputs[1];
  const int t_k = sole(kt, "Transpose", ks >= 0 ? ks : mm);
  if (is_transpose(t_k, {0, 1, 3, 2})) r["k_transpose"] = t_k;   // K [B, H, T, D] -> [B, H, D, T]
  else if (is_transpose(t_k, {0, 2, 3, 1})) r["k_heads"] = t_k;  // K [B, T, H, D] -> [B, H, D, T]
  else return false;
  return true;
}

// Transposes [B, T, H, D] -> [B, H, T, D] before Q, K and V, taken into the group only where all
// three have one (then q, k and v are read in place, the engine's layout).
void Planner::match_heads(Roles& r) const {
  const Node& mm = node(r.at("scores"));
  const int q_reader = r.contains("q_scale") ? r.at("q_scale") : r.at("scores");
  const std::string& q = r.contains("q_scale") ? node(r.at("q_scale")).inputs[0] : mm.inputs[0];
  const int tq = sole(q, "Transpose", q_reader);
  const int tv = sole(node(r.at("context")).inputs.at(1), "Transpose", r.at("context"));
  int tk = r.contains("k_heads") ? r.at("k_heads") : -1;
  if (tk < 0) tk = sole(node(r.at("k_transpose")).inputs.at(0), "Transpose", r.at("k_transpose"));
  const std::vector<std::int64_t> heads{0, 2, 1, 3};
  if (!is_transpose(tq, heads) || !is_transpose(tv, heads) || !(r.contains("k_heads") || is_transpose(tk, heads)))
    return;
  r["q_heads"] = tq;
  r["v_heads"] = tv;
  if (!r.contains("k_heads")) r["k_heads_pre"] = tk;
}

// Reshape(Add(constant [N], MatMul(x, constant [K, N]))) before the heads Transpose `heads`, each
// read only by the next: the roles <part>_matmul, <part>_bias and <part>_split.
bool Planner::match_projection(const std::string& part, int heads, Roles& r) const {
  const int split = sole(node(heads).inputs.at(0), "Reshape", heads);
  if (split < 0 || node(split).inputs.size() != 2) return false;
  const int add = sole(node(split).inputs[0], "Add", split);
  if (add < 0 || node(add).inputs.size() != 2) return false;
  const std::size_t mm_side =
      made_by(node(add).inputs[0]) >= 0 && node(made_by(node(add).inputs[0])).op == "MatMul" ? 0 : 1;
  const int mm = sole(node(add).inputs[mm_side], "MatMul", add);
  if (mm < 0 || node(mm).inputs.size() != 2 || s.constants.contains(node(mm).inputs[0])) return false;
  const auto w = s.constants.find(node(mm).inputs[1]);
  const auto bias = s.constants.find(node(add).inputs[1 - mm_side]);
  if (w == s.constants.end() || bias == s.constants.end() || w->second.integer || bias->second.integer ||
      w->second.dims.size() != 2 || bias->second.dims != std::vector<std::int64_t>{w->second.dims[1]})
    return false;
  r[part + "_matmul"] = mm;
  r[part + "_bias"] = add;
  r[part + "_split"] = split;
  return true;
}

// The three projections, taken into the group only where all three are linears of one input with
// weights of one shape (then they are built as one).
void Planner::match_projections(Roles& r) const {
  if (!r.contains("q_heads")) return;
  Roles found;
  const int k_heads = r.contains("k_heads_pre") ? r.at("k_heads_pre") : r.at("k_heads");
  if (!match_projection("q", r.at("q_heads"), found) || !match_projection("k", k_heads, found) ||
      !match_projection("v", r.at("v_heads"), found))
    return;
  const Node &q = node(found.at("q_matmul")), &k = node(found.at("k_matmul")), &v = node(found.at("v_matmul"));
  const auto dims = [&](const Node& mm) { return s.constants.at(mm.inputs[1]).dims; };
  if (k.inputs[0] != q.inputs[0] || v.inputs[0] != q.inputs[0] || dims(k) != dims(q) || dims(v) != dims(q)) return;
  r.insert(found.begin(), found.end());
}

bool Planner::match(int softmax, Roles& r) const {
  const Node& sm = node(softmax);
  if (sm.inputs.size() != 1 || sm.outputs.size() != 1) return false;
  r["softmax"] = softmax;
  if (!match_scores(sm.inputs[0], softmax, r)) return false;
  // Softmax -> MatMul, or Softmax -> IsNaN + Where(IsNaN, 0, Softmax) -> MatMul.
  std::string probs = sm.outputs[0];
  const auto it = uses.find(probs);
  if (it != uses.end() && it->second.size() == 2) {
    int isnan = -1, where = -1;
    for (int u : it->second)
      if (u >= 0 && node(u).op == "IsNaN") isnan = u;
      else if (u >= 0 && node(u).op == "Where") where = u;
    if (isnan < 0 || where < 0 || sole_consumer(uses, node(isnan).outputs.at(0)) != where ||
        node(where).inputs.size() != 3 || node(where).inputs[0] != node(isnan).outputs[0] ||
        node(where).inputs[2] != probs)
      return false;
    r["nan_test"] = isnan;
    r["nan_where"] = where;
    probs = node(where).outputs.at(0);
  }
  const int readers = sole_consumer(uses, probs);
  if (readers < 0 || node(readers).op != "MatMul" || node(readers).inputs.size() != 2 ||
      node(readers).inputs[0] != probs)
    return false;
  r["context"] = readers;
  const int after = sole_consumer(uses, node(readers).outputs.at(0));
  if (after >= 0 && is_transpose(after, {0, 2, 1, 3})) r["out_heads"] = after;
  match_heads(r);
  match_projections(r);
  return true;
}

}  // namespace

std::vector<Group> plan_attention(const Model::State& s, const Consumers& uses, std::vector<bool>& claimed) {
  Planner p{s, uses, {}};
  for (std::size_t i = 0; i < s.nodes.size(); ++i)
    for (const auto& out : s.nodes[i].outputs) p.producer[out] = static_cast<int>(i);
  std::vector<Group> groups;
  for (std::size_t i = 0; i < s.nodes.size(); ++i) {
    if (s.nodes[i].op != "Softmax" || claimed[i]) continue;
    Roles roles;
    if (!p.match(static_cast<int>(i), roles)) continue;
    Group g{{}, "attention", roles};
    for (const auto& [role, node] : roles) g.nodes.push_back(node);
    std::sort(g.nodes.begin(), g.nodes.end());
    if (std::any_of(g.nodes.begin(), g.nodes.end(), [&](int k) { return claimed[static_cast<std::size_t>(k)]; }))
      continue;
    for (int k : g.nodes) claimed[static_cast<std::size_t>(k)] = true;
    groups.push_back(std::move(g));
  }
  return groups;
}

namespace {

// Where Q, K or V is read: a node's input, laid out [B, T, H, D] (before a heads Transpose the
// group took) or [B, H, T, D].
struct Source {
  const Node* node;
  std::size_t input;
  bool bthd;
};

struct Match {
  std::vector<Source> qkv;
  std::int64_t batch = 0, heads = 0, seq = 0, dim = 0;
};

// The role's name is a plain pointer, not a std::string: a temporary string argument would make
// GCC 13 warn (-Wdangling-reference) at every `const Node& n = role(...)`, though the node lives in c.
const Node& role(const Ctx& c, const Group& g, const char* r) {
  return c.s.nodes[static_cast<std::size_t>(g.roles.at(r))];
}

std::vector<Source> sources(const Ctx& c, const Group& g) {
  const auto has = [&](const char* r) { return g.roles.contains(r); };
  const Source q = has("q_heads")   ? Source{&role(c, g, "q_heads"), 0, true}
                   : has("q_scale") ? Source{&role(c, g, "q_scale"), 0, false}
                                    : Source{&role(c, g, "scores"), 0, false};
  const Source k = has("k_heads")       ? Source{&role(c, g, "k_heads"), 0, true}
                   : has("k_heads_pre") ? Source{&role(c, g, "k_heads_pre"), 0, true}
                                        : Source{&role(c, g, "k_transpose"), 0, false};
  const Source v = has("v_heads") ? Source{&role(c, g, "v_heads"), 0, true} : Source{&role(c, g, "context"), 1, false};
  return {q, k, v};
}

bool constant_scalar(const Ctx& c, const Node& n, std::size_t input, double& v) {
  if (!c.has_input(n, input) || !c.is_constant(n.inputs[input]) || c.constant(n, input).numel() != 1) return false;
  v = c.constant(n, input).value(0);
  return true;
}

bool all_zero(const Ctx& c, const Node& n, std::size_t input) {
  if (!c.has_input(n, input) || !c.is_constant(n.inputs[input])) return false;
  const std::vector<double> v = c.constant(n, input).values();
  return std::all_of(v.begin(), v.end(), [](double e) { return e == 0; });
}

// The product of the scales on Q, K^T and the scores; false where one is not a constant scalar.
bool total_scale(const Ctx& c, const Group& g, double& scale) {
  scale = 1;
  double v = 0;
  for (const char* r : {"q_scale", "k_scale", "post_scale"}) {
    if (!g.roles.contains(r)) continue;
    const Node& n = role(c, g, r);
    if (!constant_scalar(c, n, 1, v) || (n.op == "Div" && v == 0)) return false;
    scale *= n.op == "Div" ? 1 / v : v;
  }
  return true;
}

constexpr const char* kParts[] = {"q", "k", "v"};

bool has_projections(const Group& g) { return g.roles.contains("q_matmul"); }

const Node& part_role(const Ctx& c, const Group& g, const char* part, const char* what) {
  return role(c, g, (std::string(part) + "_" + what).c_str());
}

// The dims Q, K or V is read with: the tensor's, or where the group holds its linear and Reshape
// (not built yet), those of x through them; empty where x does not fit the weight.
std::vector<std::int64_t> read_dims(const Ctx& c, const Group& g, std::size_t part, const Source& src) {
  if (!has_projections(g)) return c.shape(*src.node, src.input);
  const Node& mm = part_role(c, g, kParts[part], "matmul");
  const Node& split = part_role(c, g, kParts[part], "split");
  std::vector<std::int64_t> dims = c.shape(mm, 0);
  const HostTensor& w = c.constant(mm, 1);
  if (dims.size() < 2 || dims.back() != w.dims.at(0)) return {};
  dims.back() = w.dims[1];
  return reshape_dims(dims, c.constant(split, 1), attr_int(split, "allowzero", 0) != 0, split);
}

// The bound shapes fit the op: Q, K and V all [B, H, T, D] (self-attention), the softmax over keys,
// the scale 1/sqrt(D), no mask but an all-zero one, Where(IsNaN) zeroing into 0.
std::optional<Match> check(const Ctx& c, const Group& g) {
  Match m;
  m.qkv = sources(c, g);
  std::vector<std::int64_t> want;
  for (std::size_t i = 0; i < m.qkv.size(); ++i) {
    const Source& src = m.qkv[i];
    std::vector<std::int64_t> d = read_dims(c, g, i, src);
    if (d.size() != 4) return std::nullopt;
    if (src.bthd) std::swap(d[1], d[2]);
    if (!want.empty() && d != want) return std::nullopt;
    want = d;
  }
  m.batch = want[0], m.heads = want[1], m.seq = want[2], m.dim = want[3];
  const std::int64_t axis = attr_int(role(c, g, "softmax"), "axis", -1);
  if (axis != -1 && axis != 3) return std::nullopt;
  if (g.roles.contains("mask_add")) {
    const Node& add = role(c, g, "mask_add");
    const std::string& scores = role(c, g, g.roles.contains("post_scale") ? "post_scale" : "scores").outputs.at(0);
    const std::size_t mask = add.inputs[0] == scores ? 1 : 0;
    if (!all_zero(c, add, mask)) return std::nullopt;
  }
  if (g.roles.contains("nan_where") && !all_zero(c, role(c, g, "nan_where"), 1)) return std::nullopt;
  double scale = 0;
  if (!total_scale(c, g, scale) || m.dim < 1 || std::abs(scale * std::sqrt(static_cast<double>(m.dim)) - 1) > 1e-6)
    return std::nullopt;
  return m;
}

// qkv [B*T, 3C] laid out [B, T, 3, H, D]: the three read in place where each is [B, T, H, D] (rows
// of a linear layer), else concatenated [B, 3H, T, D] and transposed.
nn::Value packed_qkv(Ctx& c, const Match& m, const std::string& name) {
  const std::int64_t rows = m.batch * m.seq, width = m.heads * m.dim;
  std::vector<nn::Value> xs;
  const bool in_place = std::all_of(m.qkv.begin(), m.qkv.end(), [](const Source& s) { return s.bthd; });
  for (const Source& src : m.qkv) {
    if (in_place) {
      xs.push_back(c.value_as(*src.node, src.input, {rows, width}));
      continue;
    }
    const nn::Value v = c.value(*src.node, src.input);
    xs.push_back(src.bthd ? nn::transpose(c.b, c.unique_name(name + ".heads"), v, {0, 2, 1, 3}) : v);
  }
  if (in_place) return nn::concat(c.b, name + ".qkv", xs, 1);
  const nn::Value heads = nn::concat(c.b, name + ".qkv_heads", xs, 1);
  const nn::Value rows_first = nn::transpose(c.b, name + ".qkv_rows", heads, {0, 2, 1, 3});
  return nn::reshape(c.b, name + ".qkv", rows_first, Shape{rows, 3 * width});
}

// ---- Q, K and V as rearrangements of one tensor (torchvision's MultiheadAttention: one in-proj
// linear [T, B, 3C], then Unsqueeze, Transpose, Squeeze, Gather, Reshape and Transpose to heads).
// Each is traced back to the tensor it rearranges as a view: per dim a product of atoms (size and
// stride in that tensor's elements, outermost first) and an offset. Where the three are its
// columns [part*C, (part+1)*C) with the heads side by side and its two leading dims are B and T in
// either order, the op reads the tensor itself (or its one [T, B] -> [B, T] transpose): the
// rearranging nodes then feed nothing, and the inference graph leaves them out.

struct Atom {
  std::int64_t size, stride;
};
struct View {
  std::vector<std::vector<Atom>> dims;
  std::int64_t offset = 0;
};

View row_major_view(const std::vector<std::int64_t>& dims) {
  View v;
  std::int64_t stride = 1;
  v.dims.resize(dims.size());
  for (std::size_t d = dims.size(); d-- > 0;) {
    if (dims[d] != 1) v.dims[d] = {{dims[d], stride}};
    stride *= dims[d];
  }
  return v;
}

// The view's atoms regrouped into `dims` (row-major order kept), splitting an atom where a dim ends
// inside it; false where the sizes do not factor that way.
bool regroup(View& v, const std::vector<std::int64_t>& dims) {
  std::vector<Atom> flat;
  for (const auto& d : v.dims) flat.insert(flat.end(), d.begin(), d.end());
  std::size_t next = 0;
  std::vector<std::vector<Atom>> out(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) {
    for (std::int64_t need = dims[d]; need > 1;) {
      if (next == flat.size()) return false;
      Atom& a = flat[next];
      if (a.size <= need) {
        if (need % a.size != 0) return false;
        out[d].push_back(a);
        need /= a.size;
        ++next;
      } else {
        if (a.size % need != 0) return false;
        out[d].push_back({need, a.stride * (a.size / need)});
        a.size /= need;
        need = 1;
      }
    }
  }
  if (next != flat.size()) return false;
  v.dims = std::move(out);
  return true;
}

// n applied to the view of its input 0; false where n is not a rearrangement traced here.
bool apply(const Ctx& c, const Node& n, View& v) {
  const auto rank = static_cast<std::int64_t>(v.dims.size());
  if (n.op == "Identity") return true;
  if (n.op == "Transpose") {
    const std::vector<std::int64_t> perm = transpose_perm(n, v.dims.size());
    if (static_cast<std::int64_t>(perm.size()) != rank) return false;
    View t;
    for (std::int64_t p : perm) {
      if (p < 0 || p >= rank) return false;
      t.dims.push_back(v.dims[static_cast<std::size_t>(p)]);
    }
    t.offset = v.offset;
    v = std::move(t);
    return true;
  }
  if (n.op == "Reshape") {
    if (!c.has_input(n, 1) || !c.is_constant(n.inputs[1])) return false;
    return regroup(v, reshape_dims(c.shape(n, 0), c.constant(n, 1), attr_int(n, "allowzero", 0) != 0, n));
  }
  if (n.op == "Squeeze" || n.op == "Unsqueeze") {  // opset 13 on: the axes are input 1
    if (c.has_input(n, 1) && !c.is_constant(n.inputs[1])) return false;
    const HostTensor* axes = c.has_input(n, 1) ? &c.constant(n, 1) : nullptr;
    if (n.op == "Squeeze") return regroup(v, squeeze_dims(c.shape(n, 0), axes, n));
    return axes != nullptr && regroup(v, unsqueeze_dims(c.shape(n, 0), *axes, n));
  }
  if (n.op == "Gather") {
    if (!c.has_input(n, 1) || !c.is_constant(n.inputs[1])) return false;
    const HostTensor& index = c.constant(n, 1);
    if (index.numel() != 1 || !index.dims.empty()) return false;  // one scalar index: the dim goes
    const auto axis = static_cast<std::size_t>(normalize_axis(attr_int(n, "axis", 0), rank, n));
    const std::int64_t size = c.shape(n, 0).at(axis);
    std::int64_t i = static_cast<std::int64_t>(index.value(0));
    if (i < 0) i += size;
    if (i < 0 || i >= size) return false;
    for (std::size_t a = v.dims[axis].size(); a-- > 0;) {  // the index's digits, innermost atom first
      const Atom& atom = v.dims[axis][a];
      v.offset += (i % atom.size) * atom.stride;
      i /= atom.size;
    }
    v.dims.erase(v.dims.begin() + static_cast<std::ptrdiff_t>(axis));
    return true;
  }
  return false;
}

// A dim's stride where its atoms are one run (-1 for a dim of size 1, which fits any; -2 else).
std::int64_t stride_of(const std::vector<Atom>& atoms) {
  if (atoms.empty()) return -1;
  for (std::size_t a = 0; a + 1 < atoms.size(); ++a)
    if (atoms[a].stride != atoms[a + 1].stride * atoms[a + 1].size) return -2;
  return atoms.back().stride;
}
bool fits(std::int64_t stride, std::int64_t want) { return stride == -1 || stride == want; }

// The op's qkv input [B*T, 3C] read from the one tensor Q, K and V rearrange, or nullopt.
std::optional<nn::Value> traced_qkv(Ctx& c, const Match& m, const std::string& name) {
  if (std::any_of(m.qkv.begin(), m.qkv.end(), [](const Source& s) { return s.bthd; })) return std::nullopt;
  std::map<std::string, const Node*> producer;
  for (const Node& n : c.s.nodes)
    for (const std::string& o : n.outputs) producer[o] = &n;
  const Node* first = nullptr;  // the chain's first node, whose input 0 is the root
  std::vector<View> views;
  for (const Source& src : m.qkv) {
    std::vector<const Node*> chain;
    std::string t = src.node->inputs.at(src.input);
    for (auto it = producer.find(t); it != producer.end(); it = producer.find(t)) {
      const Node& p = *it->second;
      const bool moves = p.op == "Reshape" || p.op == "Transpose" || p.op == "Squeeze" || p.op == "Unsqueeze" ||
                         p.op == "Gather" || p.op == "Identity";
      if (!moves || p.inputs.empty() || c.is_constant(p.inputs[0])) break;
      chain.push_back(&p);
      t = p.inputs[0];
    }
    if (chain.empty() || (first != nullptr && chain.back()->inputs[0] != first->inputs[0])) return std::nullopt;
    first = chain.back();
    View v = row_major_view(c.shape(*first, 0));
    for (auto n = chain.rbegin(); n != chain.rend(); ++n)
      if (!apply(c, **n, v)) return std::nullopt;
    if (v.dims.size() != 4) return std::nullopt;
    views.push_back(std::move(v));
  }
  const std::vector<std::int64_t> root = c.shape(*first, 0);
  const std::int64_t width = m.heads * m.dim;
  if (root.size() != 3 || root[2] != 3 * width || root[0] * root[1] != m.batch * m.seq) return std::nullopt;
  // Rows [B, T] as they lie (b outer) or [T, B] (t outer: one transpose).
  const bool batch_outer = root[0] == m.batch && root[1] == m.seq, seq_outer = root[0] == m.seq && root[1] == m.batch;
  const auto matches = [&](bool b_outer) {
    const std::int64_t b_stride = b_outer ? root[1] * root[2] : root[2];
    const std::int64_t t_stride = b_outer ? root[2] : root[1] * root[2];
    for (std::size_t part = 0; part < views.size(); ++part) {
      const View& v = views[part];
      if (v.offset != static_cast<std::int64_t>(part) * width || !fits(stride_of(v.dims[0]), b_stride) ||
          !fits(stride_of(v.dims[1]), m.dim) || !fits(stride_of(v.dims[2]), t_stride) || !fits(stride_of(v.dims[3]), 1))
        return false;
    }
    return true;
  };
  const bool direct = batch_outer && matches(true);
  if (!direct && !(seq_outer && matches(false))) return std::nullopt;
  nn::Value rows = c.value(*first, 0);
  if (!direct) rows = nn::transpose(c.b, name + ".qkv_batch_first", rows, {1, 0, 2});
  return nn::reshape(c.b, name + ".qkv", rows, Shape{m.batch * m.seq, 3 * width});
}

// The three linears as one over x: weights [C, K] of q, k and v stacked (nn::Linear's [out, in],
// so its output columns are q, k, v side by side) and their biases concatenated. qkv [B*T, 3C].
nn::Value merged_qkv(Ctx& c, const Group& g, const std::string& name) {
  std::vector<double> weight, bias;
  std::int64_t out = 0;
  std::string names;
  for (const char* part : kParts) {
    const Node& mm = part_role(c, g, part, "matmul");
    const Node& add = part_role(c, g, part, "bias");
    const HostTensor& w = c.constant(mm, 1);
    const std::vector<double> w_nk = linear_weight(w),
                              b = c.constant(add, add.inputs[0] == mm.outputs[0] ? 1 : 0).values();
    weight.insert(weight.end(), w_nk.begin(), w_nk.end());
    bias.insert(bias.end(), b.begin(), b.end());
    out += w.dims[1];
    names += (names.empty() ? "" : ", ") + mm.name;
  }
  c.fused.push_back("MatMul+Add x3 (q, k, v as one linear with bias): " + names);
  return linear_of_rows(c, part_role(c, g, "q", "matmul"), name + ".qkv", weight, out, &bias);
}

// The projections as a plain linear group builds them, each with its Reshape to heads.
void map_projections(Ctx& c, const Group& g) {
  for (const char* part : kParts) {
    map_linear_group(c, part_role(c, g, part, "matmul"), part_role(c, g, part, "bias"));
    map_node(c, part_role(c, g, part, "split"));
  }
}

bool is_projection(const Group& g, int node) {
  for (const char* part : kParts)
    for (const char* what : {"_matmul", "_bias", "_split"})
      if (const auto it = g.roles.find(part + std::string(what)); it != g.roles.end() && it->second == node)
        return true;
  return false;
}

}  // namespace

void build_attention(Ctx& c, const Group& g) {
  const std::optional<Match> m = check(c, g);
  // One linear where its rows are the op's input: each projection [.., H*D] before its heads split.
  const bool merged =
      m && has_projections(g) && c.constant(part_role(c, g, "q", "matmul"), 1).dims.at(1) == m->heads * m->dim;
  if (has_projections(g) && !merged) map_projections(c, g);
  if (!m) {
    for (int i : g.nodes)
      if (!is_projection(g, i)) map_node(c, c.s.nodes[static_cast<std::size_t>(i)]);
    return;
  }
  const Node& softmax = role(c, g, "softmax");
  const std::string name = c.unique_name(softmax.name + ".attention");
  const std::optional<nn::Value> traced = merged ? std::nullopt : traced_qkv(c, *m, name);
  const nn::Value qkv = merged ? merged_qkv(c, g, name) : traced ? *traced : packed_qkv(c, *m, name);
  const nn::Value out = nn::attention(c.b, name, qkv, m->heads, m->seq, /*causal=*/false);
  if (g.roles.contains("out_heads")) {
    c.set_view(role(c, g, "out_heads").outputs.at(0), out, {m->batch, m->seq, m->heads, m->dim});
  } else {
    const nn::Value bthd = nn::reshape(c.b, name + ".out_rows", out, Shape{m->batch, m->seq, m->heads, m->dim});
    c.set(role(c, g, "context").outputs.at(0), nn::transpose(c.b, name + ".out", bthd, {0, 2, 1, 3}));
  }
  c.fused.push_back("MatMul+Softmax+MatMul (attention, " + std::to_string(m->heads) + " heads" +
                    (merged                        ? ", q/k/v one linear"
                     : traced                      ? ", q/k/v read from one tensor"
                     : g.roles.contains("q_heads") ? ", q/k/v in place"
                                                   : "") +
                    "): " + softmax.name);
}

}  // namespace ab::onnx
