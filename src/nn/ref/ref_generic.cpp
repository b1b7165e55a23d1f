// Reference kernels of the generic inference ops (nn/kernels.h): every operand read and written
// through its strides with load/store (any floating storage, 16-bit values rounded once), sums in
// float64 in a fixed order, work split over outputs only.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "nn/broadcast.h"
#include "nn/generic_math.h"
#include "nn/ref/ref_kernels.h"

namespace ab::nn::ref {
namespace {

[[noreturn]] void bad(const char* kernel, const std::string& why) {
  throw Error(std::string("ref ") + kernel + ": " + why);
}

void require_float_same(const char* kernel, const std::vector<const Tensor*>& ts) {
  for (const Tensor* t : ts)
    if (t->dtype != ts[0]->dtype)
      bad(kernel, "operands " + ts[0]->to_string() + " and " + t->to_string() + " differ in dtype");
  const DType d = ts[0]->dtype;
  if (d != DType::f32 && d != DType::f64 && d != DType::f16 && d != DType::bf16)
    bad(kernel, "needs f64, f32, f16 or bf16 operands, got " + ts[0]->to_string());
}

// An integer or floating element as a double (indices, conditions).
double load_any(const Tensor& t, std::int64_t offset) {
  switch (t.dtype) {
    case DType::i8: return t.as<const std::int8_t>()[offset];
    case DType::i32: return t.as<const std::int32_t>()[offset];
    case DType::i64: return static_cast<double>(t.as<const std::int64_t>()[offset]);
    default: return load(t, offset);
  }
}

// The index over a tensor's own logical shape (operand 0 = t).
StridedIndex own_index(const Tensor& t) { return broadcast_index("index", t, {}); }

// A descriptor over dims [from, to) of t (its shape and strides), for batch and reduction walks.
Tensor dims_view(const Tensor& t, int from, int to) {
  Tensor v = t;
  v.shape = Shape{};
  v.strides = Shape{};
  for (int d = from; d < to; ++d) {
    v.shape.push_back(t.shape[d]);
    v.strides.push_back(t.strides[d]);
  }
  return v;
}

std::int64_t off4(const Tensor& t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return n * t.strides[0] + c * t.strides[1] + h * t.strides[2] + w * t.strides[3];
}

}  // namespace

void RefKernels::unary_forward(const UnaryAttrs& a, const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { unary_forward(a, x, y); })) return;
  require_float_same("unary_forward", {&x, &y});
  if (!(x.shape == y.shape))
    bad("unary_forward", "shapes " + x.shape.to_string() + " and " + y.shape.to_string() + " differ");
  const StridedIndex ix = broadcast_index("ref unary_forward", y, {x});
#pragma omp parallel for schedule(static) if (worth_threads(y.numel()))
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    std::int64_t o[kMaxIndexOperands];
    ix.offsets(i, o);
    store(y, o[0], unary_apply<double>(a.kind, a.alpha, a.beta, load(x, o[1])));
  }
}

void RefKernels::binary_forward(BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& y) {
  if (deferred([=, this] { binary_forward(kind, a, b, y); })) return;
  require_float_same("binary_forward", {&a, &b, &y});
  const StridedIndex ix = broadcast_index("ref binary_forward", y, {a, b});
#pragma omp parallel for schedule(static) if (worth_threads(y.numel()))
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    std::int64_t o[kMaxIndexOperands];
    ix.offsets(i, o);
    store(y, o[0], binary_apply<double>(kind, load(a, o[1]), load(b, o[2])));
  }
}

void RefKernels::where_forward(const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out) {
  if (deferred([=, this] { where_forward(cond, x, y, out); })) return;
  require_float_same("where_forward", {&x, &y, &out});
  const StridedIndex ix = broadcast_index("ref where_forward", out, {cond, x, y});
#pragma omp parallel for schedule(static) if (worth_threads(out.numel()))
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    std::int64_t o[kMaxIndexOperands];
    ix.offsets(i, o);
    store(out, o[0], load_any(cond, o[1]) != 0 ? load(x, o[2]) : load(y, o[3]));
  }
}

void RefKernels::copy_strided(const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { copy_strided(x, y); })) return;
  if (x.numel() != y.numel() || x.dtype != y.dtype)
    bad("copy_strided", "needs one element count and dtype, got " + x.to_string() + " and " + y.to_string());
  const StridedIndex ix = own_index(x), iy = own_index(y);
  const auto e = static_cast<std::int64_t>(size_bytes(x.dtype));
  const auto* src = static_cast<const char*>(x.data);
  auto* dst = static_cast<char*>(y.data);
#pragma omp parallel for schedule(static) if (worth_threads(y.numel()))
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    std::int64_t ox[kMaxIndexOperands], oy[kMaxIndexOperands];
    ix.offsets(i, ox);
    iy.offsets(i, oy);
    std::memcpy(dst + oy[0] * e, src + ox[0] * e, static_cast<std::size_t>(e));
  }
}

void RefKernels::softmax_forward(int axis, const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { softmax_forward(axis, x, y); })) return;
  require_float_same("softmax_forward", {&x, &y});
  if (!(x.shape == y.shape) || axis < 0 || axis >= x.shape.rank())
    bad("softmax_forward",
        "needs one shape and an axis in range, got " + x.to_string() + ", axis " + std::to_string(axis));
  Tensor rows = y, x_rows = x;  // each row's first element
  rows.shape[axis] = x_rows.shape[axis] = 1;
  const StridedIndex ix = broadcast_index("ref softmax_forward", rows, {x_rows});
  const std::int64_t n = x.shape[axis], sx = x.strides[axis], sy = y.strides[axis];
#pragma omp parallel for schedule(static) if (worth_threads(x.numel()))
  for (std::int64_t r = 0; r < rows.numel(); ++r) {
    std::int64_t o[kMaxIndexOperands];
    ix.offsets(r, o);
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (std::int64_t j = 0; j < n; ++j) m = std::max(m, load(x, o[1] + j * sx));
    for (std::int64_t j = 0; j < n; ++j) sum += std::exp(load(x, o[1] + j * sx) - m);
    for (std::int64_t j = 0; j < n; ++j) store(y, o[0] + j * sy, std::exp(load(x, o[1] + j * sx) - m) / sum);
  }
}

void RefKernels::reduce_mean_forward(const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { reduce_mean_forward(x, y); })) return;
  require_float_same("reduce_mean_forward", {&x, &y});
  if (x.shape.rank() != y.shape.rank()) bad("reduce_mean_forward", "y must have x's rank");
  Tensor reduced = x;  // the dims summed over: x's where y has 1, else 1
  for (int d = 0; d < x.shape.rank(); ++d) {
    if (y.shape[d] != x.shape[d] && y.shape[d] != 1)
      bad("reduce_mean_forward", "y " + y.shape.to_string() + " is not a reduction of x " + x.shape.to_string());
    if (y.shape[d] == x.shape[d] && y.shape[d] != 1) reduced.shape[d] = 1;
  }
  Tensor kept = x;  // x's strides over y's shape: the first element of each reduced block
  kept.shape = y.shape;
  const StridedIndex iy = broadcast_index("ref reduce_mean_forward", y, {kept}), ir = own_index(reduced);
  const std::int64_t count = reduced.numel();
#pragma omp parallel for schedule(static) if (worth_threads(x.numel()))
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    std::int64_t o[kMaxIndexOperands], r[kMaxIndexOperands];
    iy.offsets(i, o);
    double sum = 0;
    for (std::int64_t j = 0; j < count; ++j) {
      ir.offsets(j, r);
      sum += load(x, o[1] + r[0]);
    }
    store(y, o[0], sum / static_cast<double>(count));
  }
}

void RefKernels::avgpool_forward(const Pool2dDesc& d, bool count_include_pad, const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { avgpool_forward(d, count_include_pad, x, y); })) return;
  require_float_same("avgpool_forward", {&x, &y});
  if (x.shape.rank() != 4 || y.shape.rank() != 4) bad("avgpool_forward", "needs [N, C, H, W] operands");
  const std::int64_t H = x.shape[2], W = x.shape[3];
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(y.numel() * d.window_h * d.window_w))
  for (std::int64_t n = 0; n < y.shape[0]; ++n)
    for (std::int64_t c = 0; c < y.shape[1]; ++c)
      for (std::int64_t oh = 0; oh < y.shape[2]; ++oh)
        for (std::int64_t ow = 0; ow < y.shape[3]; ++ow) {
          double sum = 0;
          std::int64_t count = 0;
          for (std::int64_t i = 0; i < d.window_h; ++i)
            for (std::int64_t j = 0; j < d.window_w; ++j) {
              const std::int64_t h = oh * d.stride_h - d.pad_h + i, w = ow * d.stride_w - d.pad_w + j;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              sum += load(x, off4(x, n, c, h, w));
              ++count;
            }
          const std::int64_t divisor = count_include_pad ? d.window_h * d.window_w : count;
          store(y, off4(y, n, c, oh, ow), sum / static_cast<double>(divisor));
        }
}

void RefKernels::resize_forward(bool linear, const Tensor& x, const Tensor& y) {
  if (deferred([=, this] { resize_forward(linear, x, y); })) return;
  require_float_same("resize_forward", {&x, &y});
  if (x.shape.rank() != 4 || y.shape.rank() != 4 || x.shape[0] != y.shape[0] || x.shape[1] != y.shape[1])
    bad("resize_forward", "needs x [N, C, H, W] and y [N, C, OH, OW], got " + x.to_string() + ", " + y.to_string());
  const std::int64_t H = x.shape[2], W = x.shape[3], OH = y.shape[2], OW = y.shape[3];
  const double sh = static_cast<double>(H) / static_cast<double>(OH),
               sw = static_cast<double>(W) / static_cast<double>(OW);
  // One axis's source position: nearest's floor index, or linear's lower index and weight.
  const auto source = [linear](std::int64_t o, double scale, std::int64_t size, std::int64_t out_size, std::int64_t& i0,
                               std::int64_t& i1, double& frac) {
    if (!linear) {  // floor(o * in / out) in integers: exact where the scale's rounding is not
      i0 = i1 = std::min(o * size / out_size, size - 1);
      frac = 0;
      return;
    }
    const double s = std::clamp((static_cast<double>(o) + 0.5) * scale - 0.5, 0.0, static_cast<double>(size - 1));
    i0 = static_cast<std::int64_t>(std::floor(s));
    i1 = std::min(i0 + 1, size - 1);
    frac = s - static_cast<double>(i0);
  };
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(4 * y.numel()))
  for (std::int64_t n = 0; n < y.shape[0]; ++n)
    for (std::int64_t c = 0; c < y.shape[1]; ++c)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          std::int64_t h0, h1, w0, w1;
          double fh, fw;
          source(oh, sh, H, OH, h0, h1, fh);
          source(ow, sw, W, OW, w0, w1, fw);
          const double top = (1 - fw) * load(x, off4(x, n, c, h0, w0)) + fw * load(x, off4(x, n, c, h0, w1));
          const double bottom = (1 - fw) * load(x, off4(x, n, c, h1, w0)) + fw * load(x, off4(x, n, c, h1, w1));
          store(y, off4(y, n, c, oh, ow), (1 - fh) * top + fh * bottom);
        }
}

void RefKernels::matmul_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (deferred([=, this] { matmul_forward(a, b, y); })) return;
  require_float_same("matmul_forward", {&a, &b, &y});
  const int ra = a.shape.rank(), rb = b.shape.rank(), ry = y.shape.rank();
  if (ra < 2 || rb < 2 || ry < 2) bad("matmul_forward", "operands need rank >= 2");
  for (const Tensor* t : {&a, &b, &y})
    if (!(t->strides == contiguous_strides(t->shape, Layout::nchw)))
      bad("matmul_forward", "operands must be contiguous row-major, got " + t->to_string());
  const std::int64_t M = a.shape[ra - 2], K = a.shape[ra - 1], N = b.shape[rb - 1];
  if (b.shape[rb - 2] != K || y.shape[ry - 2] != M || y.shape[ry - 1] != N)
    bad("matmul_forward", "shapes " + a.shape.to_string() + " x " + b.shape.to_string() + " -> " + y.shape.to_string());
  const Tensor yb = dims_view(y, 0, ry - 2);
  const StridedIndex ix = broadcast_index("ref matmul_forward", yb, {dims_view(a, 0, ra - 2), dims_view(b, 0, rb - 2)});
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(yb.numel() * M * N * K))
  for (std::int64_t batch = 0; batch < yb.numel(); ++batch)
    for (std::int64_t i = 0; i < M; ++i) {
      std::int64_t o[kMaxIndexOperands];
      ix.offsets(batch, o);
      for (std::int64_t j = 0; j < N; ++j) {
        double sum = 0;
        for (std::int64_t k = 0; k < K; ++k) sum += load(a, o[1] + i * K + k) * load(b, o[2] + k * N + j);
        store(y, o[0] + i * N + j, sum);
      }
    }
}

void RefKernels::gather_forward(int axis, const Tensor& table, const Tensor& indices, const Tensor& y) {
  if (deferred([=, this] { gather_forward(axis, table, indices, y); })) return;
  const int rt = table.shape.rank(), ri = indices.shape.rank();
  if (axis < 0 || axis >= rt || y.shape.rank() != rt - 1 + ri || y.dtype != table.dtype)
    bad("gather_forward", "operands " + table.to_string() + ", " + indices.to_string() + " -> " + y.to_string());
  const std::int64_t dim = table.shape[axis];
  const auto e = static_cast<std::int64_t>(size_bytes(y.dtype));
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    std::int64_t rest = i, oy = 0, ot = 0, oi = 0;
    for (int d = y.shape.rank() - 1; d >= 0; --d) {  // y's coordinates: table's before axis, indices', table's after
      const std::int64_t c = rest % y.shape[d];
      rest /= y.shape[d];
      oy += c * y.strides[d];
      if (d < axis) ot += c * table.strides[d];
      else if (d < axis + ri) oi += c * indices.strides[d - axis];
      else ot += c * table.strides[d - ri + 1];
    }
    auto idx = static_cast<std::int64_t>(load_any(indices, oi));
    if (idx < -dim || idx >= dim)
      bad("gather_forward", "index " + std::to_string(idx) + " outside a dim of " + std::to_string(dim));
    if (idx < 0) idx += dim;
    ot += idx * table.strides[axis];
    std::memcpy(static_cast<char*>(y.data) + oy * e, static_cast<const char*>(table.data) + ot * e,
                static_cast<std::size_t>(e));
  }
}

}  // namespace ab::nn::ref
