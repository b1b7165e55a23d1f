// The one strided indexer of the generic kernels (binary, where, expand, every copy), shared by the
// reference and the CUDA kernels: element i of an output in logical row-major order, decoded into
// coordinates once, gives each operand's element offset from its strides (stride 0 where the
// operand is broadcast along a dim). Plain data, so a CUDA kernel takes it by value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

#if defined(__CUDACC__)
#define AB_HOST_DEVICE __host__ __device__
#else
#define AB_HOST_DEVICE
#endif

namespace ab::nn {

inline constexpr int kMaxIndexOperands = 4;  // where: out, cond, x, y

struct StridedIndex {
  int rank = 0;
  int operands = 0;
  std::int64_t dims[Shape::kMaxRank] = {};
  std::int64_t strides[kMaxIndexOperands][Shape::kMaxRank] = {};

  // offsets[k] = element offset of logical element i in operand k.
  AB_HOST_DEVICE void offsets(std::int64_t i, std::int64_t* offsets) const {
    for (int k = 0; k < operands; ++k) offsets[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const std::int64_t c = i % dims[d];
      i /= dims[d];
      for (int k = 0; k < operands; ++k) offsets[k] += c * strides[k][d];
    }
  }
};

// The numpy broadcast of two shapes, or false (and `out` untouched) where they do not broadcast.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out);
// An index over `out`'s logical shape with operand 0 = out and operands 1.. = `ins`, each
// broadcast to out's shape (right-aligned). Throws Error (naming `what`) where one does not
// broadcast or there are too many operands.
StridedIndex broadcast_index(const char* what, const Tensor& out, const std::vector<Tensor>& ins);
// Drops dims of size 1 and merges neighbours that every operand walks as one (stride[d] =
// stride[d + 1] * dims[d + 1]): the same elements in the same logical order, fewer divisions.
void coalesce(StridedIndex& ix);
// Reorders the dims so that operand 0 (the output) is walked in memory order (strides
// descending): the same (offsets) tuples in another order, so only for kernels whose elements are
// independent (elementwise, a copy between views of one shape); an NHWC output is then written
// contiguously. Coalesce after it.
void order_by_output(StridedIndex& ix);
// The view of t broadcast to `shape` (stride 0 along the broadcast dims, rank of `shape`).
Tensor broadcast_view(const Tensor& t, const Shape& shape);
// A view of t with shape `shape`, same strides except `dim` resized and the data offset by `start`
// elements along `dim` (concat's and split's parts).
Tensor narrow_view(const Tensor& t, int dim, std::int64_t start, std::int64_t size);

}  // namespace ab::nn
