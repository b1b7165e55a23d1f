#include "nn/broadcast.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace ab::nn {

bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out) {
  const int rank = std::max(a.rank(), b.rank());
  Shape s;
  for (int d = 0; d < rank; ++d) {
    const int da = d - (rank - a.rank()), db = d - (rank - b.rank());
    const std::int64_t x = da < 0 ? 1 : a[da], y = db < 0 ? 1 : b[db];
    if (x != y && x != 1 && y != 1) return false;
    s.push_back(x == 1 ? y : x);
  }
  out = s;
  return true;
}

Tensor broadcast_view(const Tensor& t, const Shape& shape) {
  Tensor v = t;
  v.shape = shape;
  v.strides = shape;  // every dim rewritten below
  const int shift = shape.rank() - t.shape.rank();
  if (shift < 0) throw Error("broadcast of " + t.shape.to_string() + " to " + shape.to_string() + ": rank shrinks");
  for (int d = 0; d < shape.rank(); ++d) {
    const int src = d - shift;
    const std::int64_t dim = src < 0 ? 1 : t.shape[src];
    if (dim != shape[d] && dim != 1)
      throw Error("shape " + t.shape.to_string() + " does not broadcast to " + shape.to_string());
    v.strides[d] = (src < 0 || (dim == 1 && shape[d] != 1)) ? 0 : t.strides[src];
  }
  return v;
}

Tensor narrow_view(const Tensor& t, int dim, std::int64_t start, std::int64_t size) {
  Tensor v = t;
  v.shape[dim] = size;
  if (t.data != nullptr)
    v.data = static_cast<char*>(t.data) + start * t.strides[dim] * static_cast<std::int64_t>(size_bytes(t.dtype));
  return v;
}

StridedIndex broadcast_index(const char* what, const Tensor& out, const std::vector<Tensor>& ins) {
  if (static_cast<int>(ins.size()) + 1 > kMaxIndexOperands)
    throw Error(std::string(what) + ": too many operands for the strided index");
  StridedIndex ix;
  ix.rank = out.shape.rank();
  ix.operands = static_cast<int>(ins.size()) + 1;
  for (int d = 0; d < ix.rank && d < Shape::kMaxRank; ++d) {
    ix.dims[d] = out.shape[d];
    ix.strides[0][d] = out.strides[d];
  }
  for (int k = 1; k < ix.operands && k < kMaxIndexOperands; ++k) {
    Tensor v;
    try {
      v = broadcast_view(ins[static_cast<std::size_t>(k - 1)], out.shape);
    } catch (const Error& e) {
      throw Error(std::string(what) + ": " + e.what());
    }
    for (int d = 0; d < ix.rank && d < Shape::kMaxRank; ++d) ix.strides[k][d] = v.strides[d];
  }
  return ix;
}

void order_by_output(StridedIndex& ix) {
  for (int d = 1; d < ix.rank && d < Shape::kMaxRank; ++d)  // insertion sort: stable, rank <= 6
    for (int e = d; e > 0 && ix.strides[0][e - 1] < ix.strides[0][e]; --e) {
      std::swap(ix.dims[e - 1], ix.dims[e]);
      for (int k = 0; k < ix.operands && k < kMaxIndexOperands; ++k) std::swap(ix.strides[k][e - 1], ix.strides[k][e]);
    }
}

void coalesce(StridedIndex& ix) {
  StridedIndex out = ix;
  out.rank = 0;
  for (int d = 0; d < ix.rank && d < Shape::kMaxRank; ++d) {
    if (ix.dims[d] == 1) continue;
    const int last = out.rank - 1;
    bool merge = last >= 0;
    for (int k = 0; merge && k < ix.operands && k < kMaxIndexOperands; ++k)
      merge = out.strides[k][last] == ix.strides[k][d] * ix.dims[d];
    if (merge) {
      out.dims[last] *= ix.dims[d];
      for (int k = 0; k < ix.operands && k < kMaxIndexOperands; ++k) out.strides[k][last] = ix.strides[k][d];
      continue;
    }
    out.dims[out.rank] = ix.dims[d];
    for (int k = 0; k < ix.operands && k < kMaxIndexOperands; ++k) out.strides[k][out.rank] = ix.strides[k][d];
    ++out.rank;
  }
  ix = out;
}

}  // namespace ab::nn
