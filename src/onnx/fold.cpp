// Host evaluation of nodes on constants: what makes PyTorch's shape subgraphs (Shape -> Gather ->
// Unsqueeze -> Concat -> Reshape, arithmetic on sizes) and folded weights static before mapping.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/checked.h"
#include "onnx/host_eval.h"

namespace ab::onnx {
namespace {

std::vector<std::int64_t> ints_of(const HostTensor& t) {
  std::vector<std::int64_t> v;
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()); ++i) v.push_back(t.int_value(i));
  return v;
}

std::vector<std::int64_t> row_strides(const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> s(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

// The same values under other dims (a view on the host).
HostTensor with_dims(HostTensor t, std::vector<std::int64_t> dims, const Node& n) {
  if (element_count(dims, n.name) != t.numel())
    throw UsageError(n.op + " node '" + n.name + "': " + std::to_string(t.numel()) + " elements do not fit " +
                     dims_text(dims));
  t.dims = std::move(dims);
  return t;
}

// out[i] = a[index of i in a] for a gather along one mapping of output to input flat indices.
template <typename IndexOf>
HostTensor gather_values(const HostTensor& a, std::vector<std::int64_t> dims, IndexOf index_of, const Node& n) {
  HostTensor out = a;
  out.dims = std::move(dims);
  const auto count = static_cast<std::size_t>(element_count(out.dims, n.name));
  out.real.clear();
  out.ints.clear();
  for (std::size_t i = 0; i < count; ++i) {
    const auto j = static_cast<std::size_t>(index_of(static_cast<std::int64_t>(i)));
    if (a.integer) out.ints.push_back(a.ints[j]);
    else out.real.push_back(a.real[j]);
  }
  return out;
}

template <typename T>
T safe_div(T x, T y, const Node& n) {
  if constexpr (std::is_integral_v<T>) {
    if (y == 0 || (x == std::numeric_limits<T>::min() && y == -1))
      throw UsageError("Div node '" + n.name + "' divides an integer constant by zero");
  }
  return x / y;
}

template <typename T>
T checked_arith(T x, T y, char op, const Node& n) {
  if constexpr (std::is_integral_v<T>) {
    T r{};
    const bool overflow = op == '+'   ? __builtin_add_overflow(x, y, &r)
                          : op == '-' ? __builtin_sub_overflow(x, y, &r)
                                      : __builtin_mul_overflow(x, y, &r);
    if (overflow) throw UsageError(n.op + " node '" + n.name + "' overflows 64-bit integers");
    return r;
  } else {
    return op == '+' ? x + y : op == '-' ? x - y : x * y;
  }
}

template <typename F>
HostEval unary_real(F f) {
  return [f](const Node& n, const Ins& ins) -> Outs {
    HostTensor t = in(n, ins, 0);
    if (t.integer) {
      for (auto& v : t.ints) v = static_cast<std::int64_t>(f(static_cast<double>(v)));
    } else {
      for (auto& v : t.real) v = f(v);
    }
    return {std::move(t)};
  };
}

Outs eval_cast(const Node& n, const Ins& ins) {
  HostTensor t = in(n, ins, 0);
  const std::int64_t to = attr_int(n, "to", pb::TensorProto_DataType_FLOAT);
  const bool to_real = to == pb::TensorProto_DataType_FLOAT || to == pb::TensorProto_DataType_DOUBLE ||
                       to == pb::TensorProto_DataType_FLOAT16 || to == pb::TensorProto_DataType_BFLOAT16;
  if (to_real && t.integer) {
    t.real.assign(t.ints.begin(), t.ints.end());
    t.ints.clear();
  } else if (!to_real && !t.integer) {
    for (double v : t.real) {
      if (!std::isfinite(v) || std::abs(v) > 9.0e18)
        throw UsageError("Cast node '" + n.name + "': " + std::to_string(v) + " does not fit an integer");
      t.ints.push_back(to == pb::TensorProto_DataType_BOOL ? (v != 0) : static_cast<std::int64_t>(v));
    }
    t.real.clear();
  } else if (to == pb::TensorProto_DataType_BOOL) {
    for (auto& v : t.ints) v = v != 0;
  }
  t.integer = !to_real;
  t.dtype = static_cast<std::int32_t>(to);
  return {std::move(t)};
}

Outs eval_gather(const Node& n, const Ins& ins) {
  const HostTensor &data = in(n, ins, 0), &idx = in(n, ins, 1);
  const auto rank = static_cast<std::int64_t>(data.dims.size());
  if (rank == 0) throw UsageError("Gather node '" + n.name + "' gathers from a scalar");
  const int axis = normalize_axis(attr_int(n, "axis", 0), rank, n);
  const std::int64_t extent = data.dims[static_cast<std::size_t>(axis)];
  std::vector<std::int64_t> indices = ints_of(idx);
  for (auto& i : indices) {
    if (i < -extent || i >= extent)
      throw UsageError("Gather node '" + n.name + "': index " + std::to_string(i) + " outside " +
                       std::to_string(extent));
    if (i < 0) i += extent;
  }
  std::vector<std::int64_t> dims(data.dims.begin(), data.dims.begin() + axis);
  dims.insert(dims.end(), idx.dims.begin(), idx.dims.end());
  dims.insert(dims.end(), data.dims.begin() + axis + 1, data.dims.end());
  std::int64_t inner = 1;
  for (std::size_t k = static_cast<std::size_t>(axis) + 1; k < data.dims.size(); ++k) inner *= data.dims[k];
  const auto count = static_cast<std::int64_t>(indices.size());
  return {gather_values(
      data, dims,
      [&](std::int64_t i) {
        const std::int64_t in_pos = i % inner, rest = i / inner;
        const std::int64_t which = rest % count, outer = rest / count;
        return (outer * extent + indices[static_cast<std::size_t>(which)]) * inner + in_pos;
      },
      n)};
}

Outs eval_concat(const Node& n, const Ins& ins) {
  if (ins.empty()) throw UsageError("Concat node '" + n.name + "' has no inputs");
  const HostTensor& first = in(n, ins, 0);
  const auto rank = static_cast<std::int64_t>(first.dims.size());
  if (rank == 0) throw UsageError("Concat node '" + n.name + "' concatenates scalars");
  const auto axis = static_cast<std::size_t>(normalize_axis(attr_int(n, "axis", 0), rank, n));
  HostTensor out = first;
  out.dims[axis] = 0;
  bool integer = true;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const HostTensor& t = in(n, ins, i);
    integer = integer && t.integer;
    for (std::size_t k = 0; k < t.dims.size() || k < first.dims.size(); ++k)
      if (t.dims.size() != first.dims.size() || (k != axis && t.dims[k] != first.dims[k]))
        throw UsageError("Concat node '" + n.name + "': " + dims_text(t.dims) + " does not fit " +
                         dims_text(first.dims));
    out.dims[axis] += t.dims[axis];
  }
  std::int64_t outer = 1;
  for (std::size_t k = 0; k < axis; ++k) outer *= first.dims[k];
  out.integer = integer;
  out.ints.clear();
  out.real.clear();
  for (std::int64_t o = 0; o < outer; ++o)
    for (const HostTensor* t : ins) {
      const std::int64_t chunk = t->numel() / std::max<std::int64_t>(outer, 1);
      for (std::int64_t j = 0; j < chunk; ++j) {
        const auto src = static_cast<std::size_t>(o * chunk + j);
        if (integer) out.ints.push_back(t->ints[src]);
        else out.real.push_back(t->value(src));
      }
    }
  return {std::move(out)};
}

Outs eval_transpose(const Node& n, const Ins& ins) {
  const HostTensor& t = in(n, ins, 0);
  const std::vector<std::int64_t> perm = transpose_perm(n, t.dims.size());
  if (perm.size() != t.dims.size()) throw UsageError("Transpose node '" + n.name + "': perm does not match the rank");
  std::vector<std::int64_t> dims;
  std::vector<bool> used(perm.size());
  for (auto p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(perm.size()) || used[static_cast<std::size_t>(p)])
      throw UsageError("Transpose node '" + n.name + "': perm is not a permutation");
    used[static_cast<std::size_t>(p)] = true;
    dims.push_back(t.dims[static_cast<std::size_t>(p)]);
  }
  const auto in_strides = row_strides(t.dims);
  return {gather_values(
      t, dims,
      [&](std::int64_t i) {
        std::int64_t j = 0;
        for (std::size_t k = dims.size(); k-- > 0;) {
          j += (i % dims[k]) * in_strides[static_cast<std::size_t>(perm[k])];
          i /= dims[k];
        }
        return j;
      },
      n)};
}

Outs eval_slice(const Node& n, const Ins& ins) {
  const HostTensor& t = in(n, ins, 0);
  const SliceRanges r = slice_ranges(t.dims, ins, n);
  const auto in_strides = row_strides(t.dims);
  return {gather_values(
      t, r.out_dims,
      [&](std::int64_t i) {
        std::int64_t j = 0;
        for (std::size_t k = r.out_dims.size(); k-- > 0;) {
          j += (r.starts[k] + (i % r.out_dims[k]) * r.steps[k]) * in_strides[k];
          i /= r.out_dims[k];
        }
        return j;
      },
      n)};
}

Outs eval_constant_of_shape(const Node& n, const Ins& ins) {
  const std::vector<std::int64_t> dims = ints_of(in(n, ins, 0));
  const auto count = static_cast<std::size_t>(element_count(dims, "ConstantOfShape node '" + n.name + "'"));
  HostTensor fill = make_reals({}, {0.0});
  for (const auto& a : n.proto->attribute())
    if (a.name() == "value") fill = read_tensor(a.t(), {});
  if (fill.numel() != 1) throw UsageError("ConstantOfShape node '" + n.name + "': value must hold one element");
  HostTensor out = fill;
  out.dims = dims;
  if (out.integer) out.ints.assign(count, fill.ints[0]);
  else out.real.assign(count, fill.real[0]);
  return {std::move(out)};
}

Outs eval_range(const Node& n, const Ins& ins) {
  const HostTensor &start = in(n, ins, 0), &limit = in(n, ins, 1), &delta = in(n, ins, 2);
  if (start.numel() != 1 || limit.numel() != 1 || delta.numel() != 1 || delta.value(0) == 0)
    throw UsageError("Range node '" + n.name + "' needs scalar start, limit and a non-zero delta");
  const double count_real = std::ceil((limit.value(0) - start.value(0)) / delta.value(0));
  const double count = std::max(0.0, count_real);
  if (!(count < static_cast<double>(kMaxConstantElements))) throw UsageError("Range node '" + n.name + "' is too long");
  HostTensor out = start.integer && limit.integer && delta.integer ? make_ints({}, {}) : make_reals({}, {});
  out.dims = {static_cast<std::int64_t>(count)};
  for (std::int64_t i = 0; i < out.dims[0]; ++i) {
    if (out.integer) out.ints.push_back(start.ints[0] + i * delta.ints[0]);
    else out.real.push_back(start.value(0) + static_cast<double>(i) * delta.value(0));
  }
  return {std::move(out)};
}

Outs eval_where(const Node& n, const Ins& ins) {
  const HostTensor &c = in(n, ins, 0), &x = in(n, ins, 1), &y = in(n, ins, 2);
  const std::string what = "Where node '" + n.name + "'";
  const auto dims = broadcast_dims(broadcast_dims(c.dims, x.dims, what), y.dims, what);
  const auto count = element_count(dims, what);
  const bool integer = x.integer && y.integer;
  HostTensor out = integer ? make_ints(dims, {}) : make_reals(dims, {});
  for (std::int64_t i = 0; i < count; ++i) {
    const bool take_x = c.value(static_cast<std::size_t>(broadcast_index(i, dims, c.dims))) != 0;
    const HostTensor& src = take_x ? x : y;
    const auto j = static_cast<std::size_t>(broadcast_index(i, dims, src.dims));
    if (integer) out.ints.push_back(src.ints[j]);
    else out.real.push_back(src.value(j));
  }
  return {std::move(out)};
}

Outs eval_expand(const Node& n, const Ins& ins) {
  const HostTensor& t = in(n, ins, 0);
  const auto dims = broadcast_dims(t.dims, ints_of(in(n, ins, 1)), "Expand node '" + n.name + "'");
  return {gather_values(
      t, dims, [&](std::int64_t i) { return broadcast_index(i, dims, t.dims); }, n)};
}

}  // namespace

HostTensor shape_of(const std::vector<std::int64_t>& dims, const Node& n) {
  const auto rank = static_cast<std::int64_t>(dims.size());
  std::int64_t start = attr_int(n, "start", 0), end = attr_int(n, "end", rank);
  start = std::clamp(start < 0 ? std::max(start, -rank) + rank : start, std::int64_t{0}, rank);
  end = std::clamp(end < 0 ? std::max(end, -rank) + rank : end, start, rank);
  return make_ints({end - start}, {dims.begin() + start, dims.begin() + end});
}

std::vector<std::int64_t> broadcast_dims(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                                         const std::string& what) {
  std::vector<std::int64_t> out(std::max(a.size(), b.size()));
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::int64_t da = k < out.size() - a.size() ? 1 : a[k - (out.size() - a.size())];
    const std::int64_t db = k < out.size() - b.size() ? 1 : b[k - (out.size() - b.size())];
    if (da != db && da != 1 && db != 1)
      throw UsageError(what + ": shapes " + dims_text(a) + " and " + dims_text(b) + " do not broadcast");
    out[k] = da == 1 ? db : da;
  }
  return out;
}

int normalize_axis(std::int64_t axis, std::int64_t rank, const Node& n) {
  if (axis < -rank || axis >= rank)
    throw UsageError(n.op + " node '" + n.name + "': axis " + std::to_string(axis) + " outside rank " +
                     std::to_string(rank));
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

std::vector<std::int64_t> reshape_dims(const std::vector<std::int64_t>& in, const HostTensor& target, bool allowzero,
                                       const Node& n) {
  std::vector<std::int64_t> dims = ints_of(target);
  const std::int64_t total = element_count(in, n.name);
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0 && !allowzero) {
      if (k >= in.size()) throw UsageError("Reshape node '" + n.name + "': 0 copies a dimension the input lacks");
      dims[k] = in[k];
    }
    if (dims[k] == -1) {
      if (infer >= 0) throw UsageError("Reshape node '" + n.name + "' has two -1 dimensions");
      infer = static_cast<int>(k);
      continue;
    }
    if (dims[k] < 0) throw UsageError("Reshape node '" + n.name + "': dimension " + std::to_string(dims[k]));
    known = checked_mul(known, dims[k], "Reshape node '" + n.name + "'");
  }
  if (infer >= 0) {
    if (known == 0 || total % known != 0)
      throw UsageError("Reshape node '" + n.name + "': " + dims_text(in) + " does not reshape to " +
                       dims_text(ints_of(target)));
    dims[static_cast<std::size_t>(infer)] = total / known;
  } else if (known != total) {
    throw UsageError("Reshape node '" + n.name + "': " + dims_text(in) + " does not reshape to " + dims_text(dims));
  }
  return dims;
}

std::vector<std::int64_t> flatten_dims(const std::vector<std::int64_t>& in, std::int64_t axis, const Node& n) {
  const auto rank = static_cast<std::int64_t>(in.size());
  if (axis < -rank || axis > rank) throw UsageError("Flatten node '" + n.name + "': axis outside the rank");
  const auto a = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < in.size(); ++k) (k < a ? outer : inner) *= in[k];
  return {outer, inner};
}

std::vector<std::int64_t> squeeze_dims(const std::vector<std::int64_t>& in, const HostTensor* axes, const Node& n) {
  std::vector<bool> drop(in.size(), false);
  if (axes == nullptr) {
    for (std::size_t k = 0; k < in.size(); ++k) drop[k] = in[k] == 1;
  } else {
    for (auto a : ints_of(*axes)) {
      const auto k = static_cast<std::size_t>(normalize_axis(a, static_cast<std::int64_t>(in.size()), n));
      if (in[k] != 1) throw UsageError("Squeeze node '" + n.name + "': dimension " + std::to_string(k) + " is not 1");
      drop[k] = true;
    }
  }
  std::vector<std::int64_t> out;
  for (std::size_t k = 0; k < in.size(); ++k)
    if (!drop[k]) out.push_back(in[k]);
  return out;
}

std::vector<std::int64_t> transpose_perm(const Node& n, std::size_t rank) {
  std::vector<std::int64_t> perm = attr_ints(n, "perm");
  if (perm.empty())
    for (std::size_t k = rank; k-- > 0;) perm.push_back(static_cast<std::int64_t>(k));
  return perm;
}

std::vector<std::int64_t> unsqueeze_dims(const std::vector<std::int64_t>& in, const HostTensor& axes, const Node& n) {
  const std::vector<std::int64_t> list = ints_of(axes);
  const auto rank = static_cast<std::int64_t>(in.size() + list.size());
  if (rank > Shape::kMaxRank)
    throw UsageError("Unsqueeze node '" + n.name + "': rank above " + std::to_string(Shape::kMaxRank));
  std::vector<bool> ones(static_cast<std::size_t>(rank), false);
  for (auto a : list) {
    const auto k = static_cast<std::size_t>(normalize_axis(a, rank, n));
    if (ones[k]) throw UsageError("Unsqueeze node '" + n.name + "' repeats an axis");
    ones[k] = true;
  }
  std::vector<std::int64_t> out;
  std::size_t j = 0;
  for (std::size_t k = 0; k < ones.size(); ++k) out.push_back(ones[k] ? 1 : in[j++]);
  return out;
}

SliceRanges slice_ranges(const std::vector<std::int64_t>& in, const std::vector<const HostTensor*>& inputs,
                         const Node& n) {
  const auto list = [&](std::size_t i) {
    return i < inputs.size() && inputs[i] != nullptr ? ints_of(*inputs[i]) : std::vector<std::int64_t>{};
  };
  const std::vector<std::int64_t> starts = list(1), ends = list(2);
  std::vector<std::int64_t> axes = list(3), steps = list(4);
  const auto rank = static_cast<std::int64_t>(in.size());
  if (axes.empty())
    for (std::size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<std::int64_t>(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (starts.size() != ends.size() || axes.size() != starts.size() || steps.size() != starts.size())
    throw UsageError("Slice node '" + n.name + "': starts, ends, axes and steps differ in length");
  SliceRanges r;
  r.starts.assign(in.size(), 0);
  r.ends = in;
  r.steps.assign(in.size(), 1);
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const auto k = static_cast<std::size_t>(normalize_axis(axes[i], rank, n));
    const std::int64_t dim = in[k], step = steps[i];
    if (step == 0) throw UsageError("Slice node '" + n.name + "' has step 0");
    const auto clamp = [&](std::int64_t v, std::int64_t lo, std::int64_t hi) {
      if (v < 0) v = v < -dim ? -1 : v + dim;  // INT64_MIN-safe: no addition past the range
      return std::clamp(v, lo, hi);
    };
    r.starts[k] = step > 0 ? clamp(starts[i], 0, dim) : clamp(starts[i], 0, dim - 1);
    r.ends[k] = step > 0 ? clamp(ends[i], 0, dim) : clamp(ends[i], -1, dim - 1);
    if (step > 0 && starts[i] < -dim) r.starts[k] = 0;
    r.steps[k] = step;
  }
  for (std::size_t k = 0; k < in.size(); ++k) {
    const std::int64_t span = r.ends[k] - r.starts[k];
    const std::int64_t count =
        r.steps[k] > 0 ? (span + r.steps[k] - 1) / r.steps[k] : (span + r.steps[k] + 1) / r.steps[k];
    r.out_dims.push_back(std::max<std::int64_t>(count, 0));
  }
  return r;
}

const std::map<std::string, HostEval>& host_evaluators() {
  static const std::map<std::string, HostEval> table = [] {
    std::map<std::string, HostEval> t;
    const auto pass = [](const Node& n, const Ins& ins) -> Outs { return {in(n, ins, 0)}; };
    t["Identity"] = pass;
    t["Dropout"] = pass;
    t["Cast"] = eval_cast;
    t["Gather"] = eval_gather;
    t["Concat"] = eval_concat;
    t["Transpose"] = eval_transpose;
    t["Slice"] = eval_slice;
    t["ConstantOfShape"] = eval_constant_of_shape;
    t["Range"] = eval_range;
    t["Where"] = eval_where;
    t["Expand"] = eval_expand;
    t["Shape"] = [](const Node& n, const Ins& ins) -> Outs { return {shape_of(in(n, ins, 0).dims, n)}; };
    t["Reshape"] = [](const Node& n, const Ins& ins) -> Outs {
      const HostTensor& x = in(n, ins, 0);
      return {with_dims(x, reshape_dims(x.dims, in(n, ins, 1), attr_int(n, "allowzero", 0) != 0, n), n)};
    };
    t["Flatten"] = [](const Node& n, const Ins& ins) -> Outs {
      const HostTensor& x = in(n, ins, 0);
      return {with_dims(x, flatten_dims(x.dims, attr_int(n, "axis", 1), n), n)};
    };
    t["Squeeze"] = [](const Node& n, const Ins& ins) -> Outs {
      const HostTensor& x = in(n, ins, 0);
      return {with_dims(x, squeeze_dims(x.dims, ins.size() > 1 ? ins[1] : nullptr, n), n)};
    };
    t["Unsqueeze"] = [](const Node& n, const Ins& ins) -> Outs {
      const HostTensor& x = in(n, ins, 0);
      return {with_dims(x, unsqueeze_dims(x.dims, in(n, ins, 1), n), n)};
    };
    t["Add"] = binary([](auto x, auto y, const Node& n) { return checked_arith(x, y, '+', n); });
    t["Sub"] = binary([](auto x, auto y, const Node& n) { return checked_arith(x, y, '-', n); });
    t["Mul"] = binary([](auto x, auto y, const Node& n) { return checked_arith(x, y, '*', n); });
    t["Div"] = binary([](auto x, auto y, const Node& n) { return safe_div(x, y, n); });
    t["Sqrt"] = unary_real([](double v) { return std::sqrt(v); });
    t["Neg"] = unary_real([](double v) { return -v; });
    add_logic_evaluators(t);
    return t;
  }();
  return table;
}

}  // namespace ab::onnx
