// Host evaluation of the integer and logical ops of shape and mask subgraphs: Mod (the floor
// division in MultiheadAttention's shape arithmetic), comparisons, And/Or/Not/Xor, IsNaN and
// GatherElements (transformers' position and token-type buffers).
#include <cmath>
#include <limits>

#include "onnx/host_eval.h"

namespace ab::onnx {
namespace {

// ONNX Mod: fmod = 0 takes the divisor's sign (Python's %), fmod = 1 the dividend's (C's fmod);
// both for integers and reals. An integer division by zero is refused.
HostEval eval_mod() {
  return [](const Node& n, const Ins& ins) -> Outs {
    const bool c_style = attr_int(n, "fmod", 0) != 0;
    return binary([c_style](auto x, auto y, const Node& node) {
      using T = decltype(x);
      if constexpr (std::is_integral_v<T>) {
        if (y == 0) throw UsageError("Mod node '" + node.name + "' divides an integer constant by zero");
        if (y == -1) return T{0};  // INT64_MIN % -1 overflows in C++; the remainder is 0
        T r = x % y;
        if (!c_style && r != 0 && ((r < 0) != (y < 0))) r += y;
        return r;
      } else {
        T r = std::fmod(x, y);
        if (!c_style && r != 0 && ((r < 0) != (y < 0))) r += y;
        return r;
      }
    })(n, ins);
  };
}

// A binary op whose output is bool (stored as integers 0/1).
template <typename F>
HostEval boolean(F f) {
  return [f](const Node& n, const Ins& ins) -> Outs {
    HostTensor r = binary([f](auto x, auto y, const Node&) { return decltype(x)(f(x, y)); })(n, ins)[0];
    if (!r.integer) {
      r.ints.assign(r.real.begin(), r.real.end());
      r.real.clear();
      r.integer = true;
    }
    r.dtype = pb::TensorProto_DataType_BOOL;
    return {std::move(r)};
  };
}

Outs eval_not(const Node& n, const Ins& ins) {
  HostTensor t = in(n, ins, 0);
  std::vector<std::int64_t> v;
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()); ++i) v.push_back(t.value(i) == 0 ? 1 : 0);
  HostTensor out = make_ints(t.dims, std::move(v));
  out.dtype = pb::TensorProto_DataType_BOOL;
  return {std::move(out)};
}

Outs eval_isnan(const Node& n, const Ins& ins) {
  const HostTensor& t = in(n, ins, 0);
  std::vector<std::int64_t> v;
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()); ++i) v.push_back(std::isnan(t.value(i)) ? 1 : 0);
  HostTensor out = make_ints(t.dims, std::move(v));
  out.dtype = pb::TensorProto_DataType_BOOL;
  return {std::move(out)};
}

// out[i_0..i_axis..] = data[i_0..index[i]..], the output of the indices' shape.
Outs eval_gather_elements(const Node& n, const Ins& ins) {
  const HostTensor &data = in(n, ins, 0), &idx = in(n, ins, 1);
  const auto rank = static_cast<std::int64_t>(data.dims.size());
  if (rank == 0 || idx.dims.size() != data.dims.size())
    throw UsageError("GatherElements node '" + n.name + "': indices " + dims_text(idx.dims) + " and data " +
                     dims_text(data.dims) + " differ in rank");
  const auto axis = static_cast<std::size_t>(normalize_axis(attr_int(n, "axis", 0), rank, n));
  for (std::size_t k = 0; k < data.dims.size(); ++k)
    if (k != axis && idx.dims[k] > data.dims[k])
      throw UsageError("GatherElements node '" + n.name + "': indices " + dims_text(idx.dims) + " exceed data " +
                       dims_text(data.dims));
  HostTensor out = data;
  out.dims = idx.dims;
  out.ints.clear();
  out.real.clear();
  const std::int64_t count = idx.numel(), extent = data.dims[axis];
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t rest = i, j = 0, stride = 1;
    for (std::size_t k = idx.dims.size(); k-- > 0;) {
      std::int64_t coord = rest % idx.dims[k];
      rest /= idx.dims[k];
      if (k == axis) {
        coord = idx.int_value(static_cast<std::size_t>(i));
        if (coord < -extent || coord >= extent)
          throw UsageError("GatherElements node '" + n.name + "': index " + std::to_string(coord) + " outside " +
                           std::to_string(extent));
        if (coord < 0) coord += extent;
      }
      j += coord * stride;
      stride *= data.dims[k];
    }
    if (data.integer) out.ints.push_back(data.ints[static_cast<std::size_t>(j)]);
    else out.real.push_back(data.real[static_cast<std::size_t>(j)]);
  }
  return {std::move(out)};
}

}  // namespace

void add_logic_evaluators(std::map<std::string, HostEval>& t) {
  t["Mod"] = eval_mod();
  t["Equal"] = boolean([](auto x, auto y) { return x == y; });
  t["Greater"] = boolean([](auto x, auto y) { return x > y; });
  t["GreaterOrEqual"] = boolean([](auto x, auto y) { return x >= y; });
  t["Less"] = boolean([](auto x, auto y) { return x < y; });
  t["LessOrEqual"] = boolean([](auto x, auto y) { return x <= y; });
  t["And"] = boolean([](auto x, auto y) { return x != 0 && y != 0; });
  t["Or"] = boolean([](auto x, auto y) { return x != 0 || y != 0; });
  t["Xor"] = boolean([](auto x, auto y) { return (x != 0) != (y != 0); });
  t["Not"] = eval_not;
  t["IsNaN"] = eval_isnan;
  t["GatherElements"] = eval_gather_elements;
}

}  // namespace ab::onnx
