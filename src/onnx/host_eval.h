// Helpers of the host evaluation (fold.cpp, fold_logic.cpp): input access and numpy-broadcast
// binary evaluation over constants.
#pragma once

#include <string>
#include <vector>

#include "onnx/internal.h"

namespace ab::onnx {

using Ins = std::vector<const HostTensor*>;
using Outs = std::vector<HostTensor>;

inline const HostTensor& in(const Node& n, const Ins& ins, std::size_t i) {
  if (i >= ins.size() || ins[i] == nullptr)
    throw UsageError(n.op + " node '" + n.name + "' lacks its input " + std::to_string(i));
  return *ins[i];
}

// Flat index into `dims` of the output index `i` broadcast from `out` dims.
inline std::int64_t broadcast_index(std::int64_t i, const std::vector<std::int64_t>& out,
                                    const std::vector<std::int64_t>& dims) {
  std::int64_t j = 0, stride = 1;
  for (std::size_t k = out.size(); k-- > 0;) {
    const std::int64_t coord = i % out[k];
    i /= out[k];
    const std::size_t d = k + dims.size() - out.size();
    if (k + dims.size() >= out.size()) {
      if (dims[d] != 1) j += coord * stride;
      stride *= dims[d];
    }
  }
  return j;
}

// out = f(a, b) elementwise, as int64 where both are integer, else as doubles.
template <typename F>
HostEval binary(F f) {
  return [f](const Node& n, const Ins& ins) -> Outs {
    const HostTensor &a = in(n, ins, 0), &b = in(n, ins, 1);
    const auto dims = broadcast_dims(a.dims, b.dims, n.op + " node '" + n.name + "'");
    const auto count = element_count(dims, n.name);
    const bool integer = a.integer && b.integer;
    HostTensor out = integer ? make_ints(dims, {}) : make_reals(dims, {});
    for (std::int64_t i = 0; i < count; ++i) {
      const auto ia = static_cast<std::size_t>(broadcast_index(i, dims, a.dims));
      const auto ib = static_cast<std::size_t>(broadcast_index(i, dims, b.dims));
      if (integer) out.ints.push_back(f(a.ints[ia], b.ints[ib], n));
      else out.real.push_back(f(a.value(ia), b.value(ib), n));
    }
    return {std::move(out)};
  };
}

// Mod, comparisons (Equal among them), And/Or/Not, IsNaN, GatherElements (fold_logic.cpp).
void add_logic_evaluators(std::map<std::string, HostEval>& t);

}  // namespace ab::onnx
